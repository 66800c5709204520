"""A planner kept warm for the restore compatibility check (submission/restore_check.py).

A cold planner spends its seconds starting a JVM and a SparkSession (6 s on an idle 2-core machine
with the class archive, 12-16 s beside a running pipeline: docs/benchmarks.md), which an upgrade
of a deployment to a changed pipeline waits for. So the dispatcher keeps one spare planner
(`planner --await-request`): it builds its session, plans a pipeline of its own (a JVM's first
plan is its slowest: 5.8-9.8 s of a check at a load of 12, docs/benchmarks.md), says it is ready,
and waits for one request on stdin. A check copies the artifact into the spare's own directory
and hands it the request; the spare plans, answers and exits, and a new spare is started. The
first spare starts START_AFTER_S after the dispatcher (`keep_ready`), so the first upgrade of a
cluster that has just started is as quick as the next ones. A spare runs as the drivers' user with their scrubbed
environment like every planner, and ends when its stdin closes: a dispatcher that dies takes its
spare along. Its user is one of the drivers' pool, its own for as long as it waits and plans
(submission/planner_sandbox.py); the artifact goes where it may not write.

The first spare starts at the lowest CPU priority (shared/cpu_priority.py), since its JVM's start
takes a core for seconds, and at a cluster's start that core belongs to the first submissions and
their warm drivers. The check that takes it gives it the dispatcher's own priority back first, and
so does RESERVE_S without a check: on a machine that stays loaded, a spare at the lowest priority
never gets ready. A spare started after a check has the dispatcher's priority from the start: no
cluster start is left to protect, and the next upgrade may come within seconds (with a minute at
the lowest priority, at a load of 20 on 2 cores, it was still starting when the second upgrade came
20 s after the first: docs/benchmarks.md). Where the dispatcher
could not raise a spare's priority back (not root, RLIMIT_NICE too low) the first one starts at
its priority too.

Anything that goes wrong with the spare (it died, it is not ready in time, it gives no result)
returns None, and restore_check plans cold as before: a warm planner can make a check faster,
never different.
"""

from __future__ import annotations

import json
import logging
import select
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from services.dispatcher.submission import restore_check
from services.dispatcher.submission.planner_database import LineageDatabase
from services.dispatcher.submission.planner_sandbox import DEFAULT_USERS, PlannerSandbox
from shared import cpu_priority
from shared.spark_runtime import SparkRuntime

log = logging.getLogger(__name__)

# The first spare starts this long after the dispatcher: its own start (migrating the catalog,
# importing its routes) is done, and it answers before a JVM competes with it.
START_AFTER_S = 2.0
# The first spare, not taken this long after it started, gets the dispatcher's priority back: the
# cluster's start is behind it (warm drivers ready, first jobs running). With a minute, at a load of
# 20 on 2 cores it was still starting when a cluster's first upgrade came (bench/first_upgrade.py,
# its check as slow as a cold planner's); with 30 s it was ready.
RESERVE_S = 30.0


class _Spare:
    def __init__(self, python: str, box: PlannerSandbox, env_for, runtime: SparkRuntime, *, in_reserve: bool):
        self.box, self.home, self.user = box, box.home, box.user
        cmd = [
            python,
            "-m",
            restore_check.PLANNER_MODULE,
            "--await-request",
            "--workdir",
            str(self.home / "spark"),
            *runtime.cli_args(),
        ]
        self.log = open(box.tmp / "planner.log", "wb")
        try:
            self.proc = subprocess.Popen(
                cmd,
                cwd=str(self.home),
                env=env_for(self.home, self.user),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self.log,
                start_new_session=True,
                **self.user.popen_kwargs(),
            )
        except OSError:  # nothing started: its directory, log and user go now
            self.log.close()
            box.close()
            raise
        # Before the planner imports PySpark and starts its JVM: all of it inherits the priority.
        self._priority = threading.Lock()
        self.niced = in_reserve and cpu_priority.may_raise_priority() and cpu_priority.lower(self.proc.pid)
        self._reserve = threading.Timer(RESERVE_S, self.raise_priority)
        self._reserve.daemon = True
        if self.niced:
            self._reserve.start()

    def raise_priority(self) -> None:
        """The dispatcher's priority: taken by a check, or in reserve for RESERVE_S."""
        with self._priority:
            if self.niced and self.proc.poll() is None:
                cpu_priority.restore(self.proc.pid)
                log.info("warm planner %d at the dispatcher's priority from now on", self.proc.pid)
            self.niced = False

    def _line(self, deadline: float) -> str | None:
        assert self.proc.stdout is not None
        while time.monotonic() < deadline:
            readable, _, _ = select.select([self.proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
            if readable:
                line = self.proc.stdout.readline().decode(errors="replace")
                if not line:
                    return None  # it exited
                if line.startswith("{"):
                    return line
        return None

    def plan(
        self, artifact_path: str, request: Mapping[str, Any], timeout_s: float, database: LineageDatabase | None
    ) -> dict[str, Any] | None:
        # A spare still starting is ahead of a cold start, however loaded the machine: it is waited
        # for within the check's own bound, which its readiness and its plan share.
        deadline = time.monotonic() + timeout_s
        self._reserve.cancel()
        self.raise_priority()  # taken: it plans (or finishes starting) at the dispatcher's priority
        try:
            line = self._line(deadline)  # its {"ready": true}
            if line is None or not json.loads(line).get("ready"):
                return None
            copy = self.box.place_artifact(artifact_path)  # where the planner may read, not write
            if database is not None:
                request = {**request, "config": database.planner_config(self.box, request["config"])}
            assert self.proc.stdin is not None
            self.proc.stdin.write((json.dumps({**request, "artifact": str(copy)}, default=str) + "\n").encode())
            self.proc.stdin.flush()
            line = self._line(deadline)
            return json.loads(line) if line else None
        except (OSError, ValueError) as exc:
            log.warning("restore check: the warm planner failed (%s); planning cold", exc)
            return None
        finally:
            self.close()

    def close(self) -> None:
        self._reserve.cancel()
        restore_check.kill_group(self.proc)
        self.log.close()
        self.box.close()


class WarmPlanner:
    """At most one spare planner; `plan` uses it if there is one, and starts the next."""

    def __init__(
        self,
        *,
        python: str,
        run_as: str | None,
        catalog_url: str | None,
        redis_url: str | None,
        runtime: SparkRuntime,
        users: int = DEFAULT_USERS,
        lake_dir: str | None = None,
    ):
        self.python, self.run_as, self.runtime, self.users = python, run_as, runtime, users
        self.catalog_url, self.redis_url, self.lake_dir = catalog_url, redis_url, lake_dir
        self._lock = threading.Lock()
        self._spare: _Spare | None = None
        self._closed = False
        self._closing = threading.Event()

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
    ) -> dict[str, Any] | None:
        """The planner's result line, or None when no spare could answer (plan cold then)."""
        with self._lock:
            spare, self._spare = self._spare, None
        if spare is None:
            return None
        t0 = time.monotonic()
        result = spare.plan(
            artifact_path,
            {"entry": entry, "args": [str(a) for a in args], "config": dict(config), "parallelism": parallelism},
            timeout_s,
            database,
        )
        if result is not None:
            log.info("restore check: planned %s on the warm planner in %.1f s", artifact_path, time.monotonic() - t0)
        return result

    def keep_ready(self, after_s: float = START_AFTER_S) -> threading.Thread:
        """Start the first spare `after_s` from now, in the background (the dispatcher's start)."""

        def start() -> None:
            if not self._closing.wait(after_s):
                self.replenish(in_reserve=True)

        thread = threading.Thread(target=start, name="warm-planner-start", daemon=True)
        thread.start()
        return thread

    def replenish(self, *, in_reserve: bool = False) -> None:
        """Start the next spare, unless one is there (after each check; `in_reserve`: the first, at
        the lowest CPU priority for RESERVE_S)."""
        with self._lock:
            if self._closed or self._spare is not None:
                return
            try:
                box = PlannerSandbox(self.run_as, self.users, prefix="headrace-warm-planner-")
                self._spare = _Spare(self.python, box, self._env, self.runtime, in_reserve=in_reserve)
            except OSError as exc:
                log.warning("restore check: cannot start a warm planner (%s); checks plan cold", exc)

    def _env(self, home: Path, user) -> dict[str, str]:
        return restore_check.planner_env(
            home, user, catalog_url=self.catalog_url, redis_url=self.redis_url, lake_dir=self.lake_dir
        )

    @property
    def spare_pid(self) -> int | None:
        """The spare planner's process (its group's leader), if there is one."""
        with self._lock:
            return self._spare.proc.pid if self._spare is not None else None

    @property
    def spare_niced(self) -> bool:
        """Whether the spare, if there is one, still waits at the lowest CPU priority."""
        with self._lock:
            return self._spare is not None and self._spare.niced

    def close(self) -> None:
        self._closing.set()
        with self._lock:
            self._closed = True
            spare, self._spare = self._spare, None
        if spare is not None:
            spare.close()
