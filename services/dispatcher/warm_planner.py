"""A planner kept warm for the restore compatibility check (restore_check.py).

A cold planner spends its seconds starting a JVM and a SparkSession (6 s on an idle 2-core machine
with the class archive, 12-16 s beside a running pipeline: docs/benchmarks.md), which an upgrade
of a deployment to a changed pipeline waits for. So after a check the dispatcher starts one spare
planner (`planner --await-request`): it builds its session, says it is ready, and waits for one
request on stdin. The next check copies the artifact into the spare's own directory and hands it
the request; the spare plans, answers and exits, and a new spare is started. A spare is made only
after a first check (a dispatcher that never checks a restore keeps no JVM), runs as the drivers'
user with their scrubbed environment like every planner, and ends when its stdin closes: a
dispatcher that dies takes its spare along.

Anything that goes wrong with the spare (it died, it is not ready in time, it gives no result)
returns None, and restore_check plans cold as before: a warm planner can make a check faster,
never different.
"""

from __future__ import annotations

import json
import logging
import os
import select
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from services.dispatcher import restore_check
from shared.spark_runtime import SparkRuntime

log = logging.getLogger(__name__)


class _Spare:
    def __init__(self, python: str, user, env_for, runtime: SparkRuntime):
        self.tmp = Path(tempfile.mkdtemp(prefix="headrace-warm-planner-"))
        self.home = self.tmp / "work"
        self.home.mkdir()
        user.own(self.home)
        os.chmod(self.tmp, 0o711)
        self.user = user
        cmd = [python, "-m", restore_check.PLANNER_MODULE, "--await-request", "--workdir", str(self.home / "spark"),
               *runtime.cli_args()]
        self.log = open(self.tmp / "planner.log", "wb")
        try:
            self.proc = subprocess.Popen(cmd, cwd=str(self.home), env=env_for(self.home, user),
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log,
                                         start_new_session=True, **user.popen_kwargs())
        except OSError:  # nothing started: its directory and log go now
            self.log.close()
            shutil.rmtree(self.tmp, ignore_errors=True)
            raise

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

    def plan(self, artifact_path: str, request: Mapping[str, Any], timeout_s: float) -> dict[str, Any] | None:
        # A spare still starting is ahead of a cold start, however loaded the machine: it is waited
        # for within the check's own bound, which its readiness and its plan share.
        deadline = time.monotonic() + timeout_s
        try:
            line = self._line(deadline)  # its {"ready": true}
            if line is None or not json.loads(line).get("ready"):
                return None
            copy = self.home / Path(artifact_path).name
            shutil.copyfile(artifact_path, copy)
            self.user.own(copy)
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
        restore_check.kill_group(self.proc)
        self.log.close()
        shutil.rmtree(self.tmp, ignore_errors=True)


class WarmPlanner:
    """At most one spare planner; `plan` uses it if there is one, and starts the next."""

    def __init__(self, *, python: str, run_as: str | None, catalog_url: str | None, redis_url: str | None,
                 runtime: SparkRuntime, lake_dir: str | None = None):
        self.python, self.run_as, self.runtime = python, run_as, runtime
        self.catalog_url, self.redis_url, self.lake_dir = catalog_url, redis_url, lake_dir
        self._lock = threading.Lock()
        self._spare: _Spare | None = None
        self._closed = False

    def plan(self, *, artifact_path: str, entry: str, args: Sequence[str], config: Mapping[str, Any],
             parallelism: int, timeout_s: float) -> dict[str, Any] | None:
        """The planner's result line, or None when no spare could answer (plan cold then)."""
        with self._lock:
            spare, self._spare = self._spare, None
        if spare is None:
            return None
        t0 = time.monotonic()
        result = spare.plan(artifact_path, {"entry": entry, "args": [str(a) for a in args],
                                            "config": dict(config), "parallelism": parallelism}, timeout_s)
        if result is not None:
            log.info("restore check: planned %s on the warm planner in %.1f s", artifact_path, time.monotonic() - t0)
        return result

    def replenish(self) -> None:
        """Start the next spare, unless one is there (called after each check)."""
        with self._lock:
            if self._closed or self._spare is not None:
                return
            try:
                user = restore_check.planner_user(self.run_as)
                self._spare = _Spare(self.python, user, self._env, self.runtime)
            except OSError as exc:
                log.warning("restore check: cannot start a warm planner (%s); checks plan cold", exc)

    def _env(self, home: Path, user) -> dict[str, str]:
        return restore_check.planner_env(home, user, catalog_url=self.catalog_url, redis_url=self.redis_url,
                                         lake_dir=self.lake_dir)

    @property
    def spare_pid(self) -> int | None:
        """The spare planner's process (its group's leader), if there is one."""
        with self._lock:
            return self._spare.proc.pid if self._spare is not None else None

    def close(self) -> None:
        with self._lock:
            self._closed = True
            spare, self._spare = self._spare, None
        if spare is not None:
            spare.close()
