"""Submission-time restore compatibility check: can this pipeline start from that snapshot?

A job submitted with a savepoint (or a retained checkpoint) is compared with the snapshot's
metadata before it exists, so an incompatible change is a 400 that says what changed and what to
do, not a task that Spark fails minutes later, restart after restart.

When the snapshot was taken by the very same pipeline (artifact digest, entry and arguments),
only the configuration can differ, and only the configuration rules run. Otherwise the new
pipeline is planned (not run) in a subprocess, `python -m services.taskmanager.runtime.planner`
(a cold local Spark session: about 15-25 s), and its plan signature is compared with the
snapshot's (shared/restore_compat.py). The dispatcher itself never imports Spark.

A planner that times out or breaks down (not the pipeline: the planner) is logged and the check
passes: the driver compares again just before it starts the query (plan_signature.
check_before_start), so nothing incompatible can run, it is only refused later.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Mapping, Protocol, Sequence

from services.dispatcher.submission.planner_database import LineageDatabase
from services.dispatcher.submission.planner_sandbox import DEFAULT_USERS, PlannerSandbox
from shared import checkpointing, job_options, restore_compat, untrusted_code
from shared.errors import StateError
from shared.import_root import IMPORT_ROOT
from shared.jars import DEFAULT_CACHE_DIR
from shared.settings import Settings
from shared.spark_runtime import SparkRuntime

log = logging.getLogger(__name__)

PLANNER_MODULE = "services.taskmanager.runtime.planner"


class RestoreIncompatible(StateError):
    """The pipeline cannot start from the snapshot. `message` says what changed, `hint` what
    to do; `problems` and `hints` list them one by one."""

    def __init__(
        self, message: str, hint: str | None = None, *, problems: Sequence[str] = (), hints: Sequence[str] = ()
    ):
        super().__init__(message if not hint else f"{message} ({hint})")
        self.message = message
        self.hint = hint
        self.problems = list(problems)
        self.hints = list(hints)


def explicit_shuffle_partitions(config: Mapping[str, Any]) -> int | None:
    """The state partition count the job sets itself (the driver applies it at a first start)."""
    return job_options.explicit_state_partitions(config)


def allow_non_restored(config: Mapping[str, Any]) -> bool:
    raw = (config or {}).get(checkpointing.ALLOW_NON_RESTORED)
    if isinstance(raw, str):
        return raw.strip().lower() in ("true", "1", "yes", "on")
    return bool(raw)


def same_pipeline(snapshot_meta: Mapping[str, Any], *, artifact_sha256: str, entry: str, args: Sequence[str]) -> bool:
    old = snapshot_meta.get("pipeline") or {}
    return (
        bool(old.get("artifact_sha256"))
        and old.get("artifact_sha256") == artifact_sha256
        and (old.get("entry") or "build") == entry
        and [str(a) for a in old.get("args") or []] == [str(a) for a in args]
    )


def check_artifact(
    settings: Settings,
    art: Any,
    *,
    entry: str,
    args: Sequence[str],
    config: dict,
    parallelism: int,
    snapshot_meta: dict,
    warm: SparePlanner | None = None,
    lineage: str | None = None,
) -> None:
    """`check_restore` of an uploaded artifact, planned as this cluster's drivers would run it: the
    pipeline's database and Redis, the drivers' OS user and their class archive; on the warm
    planner (`warm`, submission/warm_planner.py) when one is ready. The database is the one the
    operator configured for every pipeline; where the cluster keeps one per lineage
    (`pipeline_databases_dir`), a copy of the database of `lineage` (the one the restore
    continues; submission/planner_database.py)."""
    try:
        check_restore(
            python=sys.executable,
            artifact_path=art.path,
            artifact_sha256=art.sha256,
            entry=entry,
            args=list(args),
            config=config,
            parallelism=parallelism,
            snapshot_meta=snapshot_meta,
            catalog_url=settings.pipeline_catalog_url,
            redis_url=settings.pipeline_redis_url or settings.redis_url,
            run_as=settings.driver_user,
            runtime=SparkRuntime.from_settings(settings),
            warm=warm.plan if warm else None,
            users=settings.driver_users,
            lake_dir=str(settings.lake.absolute()),
            database=LineageDatabase.for_restore(settings, lineage, config),
        )
    finally:
        if warm is not None and needs_planning(snapshot_meta, artifact_sha256=art.sha256, entry=entry, args=args):
            warm.replenish()  # after the check: the next spare does not slow this one down


class WarmPlan(Protocol):
    """A spare planner's plan: a result line, or None to plan cold."""

    def __call__(
        self,
        *,
        artifact_path: str,
        entry: str,
        args: Sequence[str],
        config: Mapping[str, Any],
        parallelism: int,
        timeout_s: float,
        database: LineageDatabase | None = None,
    ) -> dict[str, Any] | None: ...


class SparePlanner(Protocol):
    """warm_planner.WarmPlanner, as the check uses it."""

    def plan(
        self,
        *,
        artifact_path: str,
        entry: str,
        args: Sequence[str],
        config: Mapping[str, Any],
        parallelism: int,
        timeout_s: float,
        database: LineageDatabase | None = None,
    ) -> dict[str, Any] | None: ...

    def replenish(self) -> None: ...


def needs_planning(snapshot_meta: Mapping[str, Any], *, artifact_sha256: str, entry: str, args: Sequence[str]) -> bool:
    """Whether the pipeline must be planned to check it against the snapshot. An empty snapshot
    (its query never committed a batch) holds no state and no offsets: any pipeline can start
    from it; the very same pipeline differs at most in configuration, checked without planning."""
    holds_state = int((snapshot_meta.get("spark") or {}).get("batch_id", -1)) >= 0
    return holds_state and not same_pipeline(snapshot_meta, artifact_sha256=artifact_sha256, entry=entry, args=args)


def check_restore(
    *,
    python: str,
    artifact_path: str,
    artifact_sha256: str,
    entry: str,
    args: list[str],
    config: dict,
    parallelism: int,
    snapshot_meta: dict,
    timeout_s: float = 120,
    catalog_url: str | None = None,
    redis_url: str | None = None,
    run_as: str | None = None,
    runtime: SparkRuntime | None = None,
    warm: WarmPlan | None = None,
    users: int = DEFAULT_USERS,
    lake_dir: str | None = None,
    database: LineageDatabase | None = None,
) -> None:
    """Raise RestoreIncompatible when the pipeline cannot start from the snapshot `snapshot_meta`
    (or cannot even be built); return quietly when it can, or when the planner could not tell.

    `catalog_url` / `redis_url`: what the task would get (the pipeline's database and Redis user,
    never the control catalog). Streaming sources never connect while planning, but a pipeline
    may read a static table while it builds; without them the planner uses placeholders that
    point nowhere; `database`, a lineage's own local database, is copied for the planner instead.
    `run_as`: the drivers' OS user (settings.driver_user). `lake_dir`: where the pipeline's
    relative Delta table paths are (a Delta source reads its table's schema)."""
    plan = None
    if needs_planning(snapshot_meta, artifact_sha256=artifact_sha256, entry=entry, args=args):
        result = None
        if warm is not None:
            result = warm(
                artifact_path=artifact_path,
                entry=entry,
                args=args,
                config=config,
                parallelism=parallelism,
                timeout_s=timeout_s,
                database=database,
            )
        if result is None:
            result = run_planner(
                python=python,
                artifact_path=artifact_path,
                entry=entry,
                args=args,
                config=config,
                parallelism=parallelism,
                timeout_s=timeout_s,
                catalog_url=catalog_url,
                redis_url=redis_url,
                run_as=run_as,
                runtime=runtime,
                users=users,
                lake_dir=lake_dir,
                database=database,
            )
        plan = interpret(result, artifact_path=artifact_path, entry=entry)
        if plan is None:
            log.warning(
                "restore check of %s: planning the pipeline did not work out (%s); only the "
                "configuration was checked, the driver checks the plan before it starts",
                artifact_path,
                _why(result),
            )
    verdict = restore_compat.check(
        snapshot_meta,
        plan,
        new_shuffle_partitions=explicit_shuffle_partitions(config),
        allow_non_restored_state=allow_non_restored(config),
    )
    if not verdict.ok:
        what = restore_compat.describe_snapshot(snapshot_meta)
        raise RestoreIncompatible(
            f"the job cannot start from {what}: " + "; ".join(verdict.problems),
            "; ".join(verdict.hints) or None,
            problems=verdict.problems,
            hints=verdict.hints,
        )


def interpret(result: Mapping[str, Any] | None, *, artifact_path: str, entry: str) -> dict | None:
    """The plan signature from a planner result; None when the planner itself failed; raises
    RestoreIncompatible when the pipeline failed to build."""
    if not result:
        return None
    if result.get("ok") and isinstance(result.get("plan"), dict):
        return result["plan"]
    if result.get("stage") == "build":
        name = Path(artifact_path).name
        raise RestoreIncompatible(
            f"the pipeline {name} ({entry}) could not be built to check it against the snapshot: {result.get('error')}",
            "fix the pipeline (it must build its DataFrames without connecting to anything; "
            "the traceback is in the dispatcher's log)",
        )
    return None


def _why(result: Mapping[str, Any] | None) -> str:
    if not result:
        return "no result"
    return str(result.get("error") or result.get("reason") or "unknown")


def run_planner(
    *,
    python: str,
    artifact_path: str,
    entry: str,
    args: Sequence[str],
    config: Mapping[str, Any],
    parallelism: int,
    timeout_s: float,
    catalog_url: str | None = None,
    redis_url: str | None = None,
    run_as: str | None = None,
    runtime: SparkRuntime | None = None,
    users: int = DEFAULT_USERS,
    lake_dir: str | None = None,
    database: LineageDatabase | None = None,
) -> dict[str, Any] | None:
    """Run the planner subprocess; its result line, or a dict with `reason` (and no `ok`)
    when it timed out or died without one.

    The planner runs the pipeline's own code (its import and build()), so it is started as a
    driver is (shared/untrusted_code.py, submission/planner_sandbox.py): as a user of the drivers' pool
    `run_as` of its own when this process may switch to it, with an allow-listed environment, on a
    copy of the artifact it may not change; never with the dispatcher's settings, secrets or
    catalog."""
    with PlannerSandbox(run_as, users, prefix="headrace-restore-check-") as box:
        user, home = box.user, box.home
        log_path = box.tmp / "planner.log"
        try:
            artifact_copy = box.place_artifact(artifact_path)
        except OSError as exc:
            log.warning(
                "restore check: cannot start the planner with %s: the artifact cannot be read (%s)", python, exc
            )
            return {"reason": f"cannot read the artifact {artifact_path}: {exc}"}
        if database is not None:
            config = database.planner_config(box, config)
        # The configuration and URLs may hold passwords: stdin and environment, not the command line.
        cmd = [
            python,
            "-m",
            PLANNER_MODULE,
            "--artifact",
            str(artifact_copy),
            "--entry",
            entry,
            "--args-json",
            json.dumps([str(a) for a in args]),
            "--config-json",
            "-",
            "--parallelism",
            str(parallelism),
            "--workdir",
            str(home / "spark"),
        ]
        cmd += (runtime or SparkRuntime(DEFAULT_CACHE_DIR)).cli_args()  # the drivers' jars and class archive
        env = planner_env(home, user, catalog_url=catalog_url, redis_url=redis_url, lake_dir=lake_dir)
        t0 = time.monotonic()
        with open(log_path, "wb") as err:
            # Its own process group: the planner's JVM goes with it when a timeout kills it.
            try:
                proc = subprocess.Popen(
                    cmd,
                    cwd=str(home),
                    env=env,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=err,
                    start_new_session=True,
                    **user.popen_kwargs(),
                )
            except OSError as exc:
                log.warning("restore check: cannot start the planner with %s: %s", python, exc)
                return {"reason": f"cannot start {python}: {exc}"}
            try:
                out, _ = proc.communicate(json.dumps(dict(config), default=str).encode(), timeout=timeout_s)
            except subprocess.TimeoutExpired:
                kill_group(proc)
                log.warning(
                    "restore check: the planner (pid %d) did not finish within %.0f s and was killed",
                    proc.pid,
                    timeout_s,
                )
                return {"reason": f"timed out after {timeout_s:.0f} s (pid {proc.pid})"}
        kill_group(proc)  # a JVM left behind by a planner that exited
        for line in reversed(out.decode(errors="replace").splitlines()):
            if line.startswith("{"):
                try:
                    result = json.loads(line)
                except ValueError:
                    break
                if result.get("ok") is False and result.get("traceback"):
                    log.info("restore check: planner failed at %s:\n%s", result.get("stage"), result["traceback"])
                log.info("restore check: planned %s in %.1f s", artifact_path, time.monotonic() - t0)
                return result
        tail = log_path.read_text(errors="replace")[-2000:]
        log.warning(
            "restore check: the planner (pid %d) exited with %s without a result; its log ends:\n%s",
            proc.pid,
            proc.returncode,
            tail,
        )
        return {"reason": f"planner exited with {proc.returncode} without a result"}


def planner_env(
    home: Path,
    user: untrusted_code.UntrustedUser,
    *,
    catalog_url: str | None,
    redis_url: str | None,
    lake_dir: str | None = None,
) -> dict[str, str]:
    """The allow-listed environment of a planner; the URLs (which may hold passwords) go here,
    never on its command line."""
    env = untrusted_code.environment(os.environ, home=home, user=user.name, import_root=IMPORT_ROOT)
    for name, value in (
        ("HEADRACE_PLANNER_CATALOG_URL", catalog_url),
        ("HEADRACE_PLANNER_REDIS_URL", redis_url),
        ("HEADRACE_PLANNER_LAKE_DIR", lake_dir),
    ):
        if value:
            env[name] = value
    return env


def kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the group is the planner's own: its id is the planner's pid
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        pass
