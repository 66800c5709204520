"""Support for the modules that run the dispatcher's restore-check planner: the drivers' pool of
OS users it runs as, and a spare planner as the dispatcher keeps one."""

from __future__ import annotations

import pwd
import sys

import pytest

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
