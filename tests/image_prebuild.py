"""The compose stack's images, built in the background while the rest of the suite runs.

On a fresh machine `deploy/local-images` takes minutes (a Debian base from mmdebstrap, a JRE,
every wheel), mostly waiting for downloads and dpkg. When the compose-stack test is selected,
tests/conftest.py starts that build at the lowest CPU priority as soon as the tests are collected
and moves the compose-stack test to the end of the run; the test then waits for the build and runs
`deploy/local-images` itself as before, which finds every image there and takes seconds (or, if the
background build failed, builds and fails in the open, with its output).

The Docker engine found or started for the build is the session's, shared with the test.

Under pytest-xdist the build belongs to the controlling process, which starts it as soon as a
worker has collected the compose-stack test; the worker that runs the test follows it through the
status file the build leaves in its directory (`PrebuildWatch`), whose path the controller hands
its workers in the environment (PREBUILD_DIR_ENV).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.docker_engine import DockerEngine, EngineUnavailable

ROOT = Path(__file__).resolve().parent.parent
COMPOSE_TEST = "tests/e2e/test_compose_stack.py"
PREBUILD_DIR_ENV = "HEADRACE_TEST_PREBUILD_DIR"
STATUS_FILE = "status.json"
WATCH_START_TIMEOUT_S = 120  # the controller starts the build before any worker runs a test


def _write_status(log_dir: Path, **status: object) -> None:
    tmp = log_dir / (STATUS_FILE + ".tmp")
    tmp.write_text(json.dumps(status))
    tmp.replace(log_dir / STATUS_FILE)


class Prebuild:
    """The engine and the background `deploy/local-images` run (None when no engine could run)."""

    def __init__(self, log_dir: Path):
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log = log_dir / "local-images.log"
        self.engine: DockerEngine | None = None
        self.unavailable: str | None = None
        self.proc: subprocess.Popen | None = None
        self.build_s: float | None = None  # how long the background build ran (from collection)
        self.error: Exception | None = None  # raised in the compose test, not at collection
        try:
            self.engine = DockerEngine.find_or_start(log_dir / "dockerd.log")
        except EngineUnavailable as exc:
            self.unavailable = str(exc)
            _write_status(log_dir, unavailable=self.unavailable)
            return
        except Exception as exc:  # noqa: BLE001 - a dockerd that would not start fails that test alone
            self.error = exc
            _write_status(log_dir, error=f"{type(exc).__name__}: {exc}")
            return
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                ["nice", "-n", "19", sys.executable, str(ROOT / "deploy" / "local-images")],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.engine.env,
                start_new_session=True,
            )
        self.started = time.monotonic()
        _write_status(log_dir, building=True)
        threading.Thread(target=self._report_end, args=(log_dir,), daemon=True, name="prebuild-status").start()

    def _report_end(self, log_dir: Path) -> None:
        """The end of the build, for a worker that follows it from another process."""
        assert self.proc is not None
        code = self.proc.wait()
        _write_status(log_dir, exit_code=code, build_s=round(time.monotonic() - self.started, 1))

    def wait(self, timeout_s: float) -> str:
        """Wait for the background build; a line saying how it went (the test builds again anyway)."""
        if self.proc is None:
            return "no background build"
        try:
            code = self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            return f"the background build did not end within {timeout_s:.0f} s and was stopped"
        if self.build_s is None:
            self.build_s = round(time.monotonic() - self.started, 1)
        return f"background image build ended with exit code {code}, {self.build_s:.0f} s after it started"

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)

    def stop(self) -> None:
        self.kill()
        if self.engine is not None:
            self.engine.stop()


class PrebuildWatch:
    """The controller's background build as an xdist worker sees it: the same attributes as
    `Prebuild` for the compose-stack test, read from the build's status file. The engine is the
    controller's (found where it answers), which the controller also stops."""

    def __init__(self, log_dir: Path):
        self.log_dir = log_dir
        self.build_s: float | None = None
        self._seen: tuple[DockerEngine | None, str | None, Exception | None] | None = None

    def _seen_status(self) -> tuple[DockerEngine | None, str | None, Exception | None]:
        """(engine, unavailable, error), read when the test first asks: the controller starts the
        build only once the workers have collected, after this object is made."""
        if self._seen is None:
            status = self._status_within(WATCH_START_TIMEOUT_S)
            if status is None:
                self._seen = (
                    None,
                    None,
                    RuntimeError(
                        f"the controller's image build left no {STATUS_FILE} in {self.log_dir} within "
                        f"{WATCH_START_TIMEOUT_S} s"
                    ),
                )
            elif "unavailable" in status:
                self._seen = (None, status["unavailable"], None)
            elif "error" in status:
                error = RuntimeError(f"the controller's Docker engine did not start: {status['error']}")
                self._seen = (None, None, error)
            else:
                self._seen = (DockerEngine.find_or_start(self.log_dir / "dockerd-worker.log"), None, None)
        return self._seen

    @property
    def engine(self) -> DockerEngine | None:
        return self._seen_status()[0]

    @property
    def unavailable(self) -> str | None:
        return self._seen_status()[1]

    @property
    def error(self) -> Exception | None:
        return self._seen_status()[2]

    def _status(self) -> dict | None:
        try:
            return json.loads((self.log_dir / STATUS_FILE).read_text())
        except (OSError, ValueError):
            return None

    def _status_within(self, timeout_s: float) -> dict | None:
        deadline = time.monotonic() + timeout_s
        while (status := self._status()) is None and time.monotonic() < deadline:
            time.sleep(0.5)
        return status

    def wait(self, timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            status = self._status() or {}
            if "exit_code" in status:
                self.build_s = status["build_s"]
                return (
                    f"background image build (the controller's) ended with exit code {status['exit_code']}, "
                    f"{self.build_s:.0f} s after it started"
                )
            if "building" not in status:
                return "no background build"
            time.sleep(1)
        return f"the controller's background build did not end within {timeout_s:.0f} s (the test builds itself)"


# Where the session keeps its Prebuild (controller, one process) or PrebuildWatch (xdist worker):
# tests/conftest.py puts it there, the compose-stack test reads it.
PREBUILD = pytest.StashKey["Prebuild | PrebuildWatch"]()
