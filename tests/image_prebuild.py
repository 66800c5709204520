"""The compose stack's images, built in the background while the rest of the suite runs.

On a fresh machine `deploy/local-images` takes minutes (a Debian base from mmdebstrap, a JRE,
every wheel), mostly waiting for downloads and dpkg. When the compose-stack test is selected,
tests/conftest.py starts that build at the lowest CPU priority as soon as the tests are collected
and moves the compose-stack test to the end of the run; the test then waits for the build and runs
`deploy/local-images` itself as before, which finds every image there and takes seconds (or, if the
background build failed, builds and fails in the open, with its output).

The Docker engine found or started for the build is the session's, shared with the test.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.docker_engine import DockerEngine, EngineUnavailable

ROOT = Path(__file__).resolve().parent.parent
COMPOSE_TEST = "tests/e2e/test_compose_stack.py"


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
            return
        except Exception as exc:  # noqa: BLE001 - a dockerd that would not start fails that test alone
            self.error = exc
            return
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                ["nice", "-n", "19", sys.executable, str(ROOT / "deploy" / "local-images")], stdout=out,
                stderr=subprocess.STDOUT, env=self.engine.env, start_new_session=True)
        self.started = time.monotonic()

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
