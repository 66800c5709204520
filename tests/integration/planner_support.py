"""Support for the modules that run the dispatcher's restore-check planner: the drivers' pool of
OS users it runs as, and a spare planner as the dispatcher keeps one."""

from __future__ import annotations

import pwd
import sys

import pytest

from services.dispatcher.submission import restore_check
from services.dispatcher.submission.warm_planner import WarmPlanner
from shared.jars import DEFAULT_CACHE_DIR
from shared.spark_runtime import SparkRuntime

DRIVER_USER = "headrace-driver"
POOL_SIZE = 32  # Settings.driver_users' default
PLANNER_REDIS_URL = "redis://pipeline:pw@127.0.0.1:6379/0"


def pool_user(index: int) -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(f"{DRIVER_USER}-{index}")
    except KeyError:
        pytest.fail(f"the OS users {DRIVER_USER}-0..{POOL_SIZE - 1} are missing: scripts/bootstrap creates them")


def pool_uids() -> set[int]:
    return {pool_user(i).pw_uid for i in range(POOL_SIZE)}


def spare_planner() -> WarmPlanner:
    """A warm planner running as the pool's users, its spare not yet started (`replenish`)."""
    return WarmPlanner(
        python=sys.executable,
        run_as=DRIVER_USER,
        catalog_url=None,
        redis_url=PLANNER_REDIS_URL,
        runtime=SparkRuntime(DEFAULT_CACHE_DIR),
    )


# A snapshot with state taken by another artifact: a changed pipeline must be planned against it.
SNAPSHOT_WITH_STATE = {"pipeline": {"artifact_sha256": "1" * 64}, "spark": {"batch_id": 3, "state_partitions": 2}}


def refused_plan(artifact, run_as: str | None, **options) -> str:
    """Plan `artifact` (a pipeline whose build raises what it saw) cold against a snapshot with
    state, as the dispatcher's restore check does; the refusal's message."""
    with pytest.raises(restore_check.RestoreIncompatible) as err:
        restore_check.check_restore(
            python=sys.executable,
            artifact_path=str(artifact),
            artifact_sha256="2" * 64,
            entry="build",
            args=[],
            config={},
            parallelism=1,
            snapshot_meta=SNAPSHOT_WITH_STATE,
            redis_url=PLANNER_REDIS_URL,
            run_as=run_as,
            timeout_s=180,
            **options,
        )
    return err.value.message
