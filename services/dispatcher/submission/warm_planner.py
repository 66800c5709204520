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
so does a cluster where no TaskManager has started a driver at its full priority (the JVM and
session a failover would wait for: shared/warm_pools.py) for CALM_S; it is niced again as soon as
one does, and RESERVE_MAX_S in reserve ends it (on a machine that stays loaded, a spare at the
lowest priority never gets ready). Not a fixed time: raised 30 s after the dispatcher's start, it
took 11 CPU-s of the next 30 (half a core) on a just-started cluster whose TaskManager, killed and
started again, was starting the driver the next failover landed on, and that failover waited for
it (docs/benchmarks.md, "Failover on a just-started cluster"). Not for as long as a driver warms
up either: 150 warm-up micro-batches took two minutes at a load of 14, and the first upgrade found
the spare still starting. A spare started after a check has the dispatcher's priority from the
start: no cluster start is left to protect, and the next upgrade may come within seconds (with a
minute at the lowest priority, at a load of 20 on 2 cores, it was still starting when the second
upgrade came 20 s after the first: docs/benchmarks.md). Where the dispatcher could not raise a
spare's priority back (not root, RLIMIT_NICE too low) the first one starts at its priority too.

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
from typing import Any, Callable, Mapping, Sequence

from services.dispatcher.submission import restore_check
from services.dispatcher.submission.planner_database import LineageDatabase
from services.dispatcher.submission.planner_sandbox import DEFAULT_USERS, PlannerSandbox
from shared import cpu_priority
from shared.spark_runtime import SparkRuntime

log = logging.getLogger(__name__)

# The first spare starts this long after the dispatcher: its own start (migrating the catalog,
# importing its routes) is done, and it answers before a JVM competes with it.
START_AFTER_S = 2.0
# How often the first spare, in reserve, looks whether a TaskManager starts a driver urgently,
# and how long none must have for it to get the dispatcher's priority.
RESERVE_POLL_S = 1.0
CALM_S = 3.0
# The first spare, not taken this long after it started, gets the dispatcher's priority back all
# the same (a TaskManager whose drivers never start).
RESERVE_MAX_S = 300.0


class _Spare:
    def __init__(
        self,
        python: str,
        box: PlannerSandbox,
        env_for,
        runtime: SparkRuntime,
        *,
        in_reserve: bool,
        no_urgent_warm_up: Callable[[], bool],
    ):
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
        self._reserve_ended = threading.Event()
        if self.niced:
            threading.Thread(
                target=self._in_reserve, args=(no_urgent_warm_up,), name="warm-planner-reserve", daemon=True
            ).start()

    def _in_reserve(self, no_urgent_warm_up: Callable[[], bool]) -> None:
        """Until taken or RESERVE_MAX_S: the dispatcher's priority once no urgent warm-up has been
        seen for CALM_S, the lowest again as soon as one is (a TaskManager killed and started
        again publishes its urgent start a second or two after the survivor's driver took its task)."""
        started = time.monotonic()
        calm_since: float | None = None
        while not self._reserve_ended.wait(RESERVE_POLL_S):
            now = time.monotonic()
            if now - started >= RESERVE_MAX_S:
                self.raise_priority(f"not taken within {now - started:.0f} s")
                return
            if not _answers(no_urgent_warm_up):
                calm_since = None
                self._set_reserve_nice(True, "a TaskManager starts a driver urgently")
            elif calm_since is None:
                calm_since = now
            elif now - calm_since >= CALM_S:
                self._set_reserve_nice(False, "no TaskManager starts a driver urgently")

    def _set_reserve_nice(self, niced: bool, why: str) -> None:
        with self._priority:
            if self._reserve_ended.is_set() or self.niced == niced or self.proc.poll() is not None:
                return
            if niced:
                self.niced = cpu_priority.lower(self.proc.pid)
            else:
                cpu_priority.restore(self.proc.pid)
                self.niced = False
            where = "the lowest priority" if self.niced else "the dispatcher's priority"
            log.info("warm planner %d in reserve at %s: %s", self.proc.pid, where, why)

    def raise_priority(self, why: str = "a check takes it") -> None:
        """The dispatcher's priority from now on: taken by a check, or RESERVE_MAX_S in reserve."""
        self._reserve_ended.set()
        with self._priority:
            if self.niced and self.proc.poll() is None:
                cpu_priority.restore(self.proc.pid)
                log.info("warm planner %d at the dispatcher's priority from now on: %s", self.proc.pid, why)
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
        self._reserve_ended.set()
        restore_check.kill_group(self.proc)
        self.log.close()
        self.box.close()


def _answers(question: Callable[[], bool]) -> bool:
    try:
        return question()
    except Exception:
        log.debug("warm planner: could not tell whether a TaskManager starts a driver urgently", exc_info=True)
        return False


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
        no_urgent_warm_up: Callable[[], bool] = lambda: True,
    ):
        """`no_urgent_warm_up()`: whether no TaskManager starts a driver at its full priority
        (shared/warm_pools.py), which ends the first spare's reserve; default: at its first look."""
        self.python, self.run_as, self.runtime, self.users = python, run_as, runtime, users
        self.no_urgent_warm_up = no_urgent_warm_up
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
        the lowest CPU priority while a TaskManager starts a driver urgently)."""
        with self._lock:
            if self._closed or self._spare is not None:
                return
            try:
                box = PlannerSandbox(self.run_as, self.users, prefix="headrace-warm-planner-")
                self._spare = _Spare(
                    self.python,
                    box,
                    self._env,
                    self.runtime,
                    in_reserve=in_reserve,
                    no_urgent_warm_up=self.no_urgent_warm_up,
                )
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
