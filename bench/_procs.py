"""Process helpers shared by the benchmarks: throwaway redis-server and service processes,
all in their own process groups and stopped by PID."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import redis

from shared.ports import free_port


def code_dir() -> Path:
    """The checkout whose services a benchmark runs: the first PYTHONPATH entry if one is given
    (comparing an older checkout: `PYTHONPATH=/tmp/pre python3 bench/...`), else this one.
    Services start with it as their working directory, because `python -m` imports from the
    working directory before PYTHONPATH: started from this checkout, they would run its code."""
    given = [e for e in os.environ.get("PYTHONPATH", "").split(os.pathsep) if e]
    return Path(given[0]).resolve() if given else Path(__file__).resolve().parent.parent


def stop_group(proc: subprocess.Popen, sig: int = signal.SIGTERM, timeout_s: float = 60) -> None:
    """Signal the process group `proc` leads (started with start_new_session), wait for it, and
    SIGKILL the group if it outlives `timeout_s`."""
    try:
        os.killpg(proc.pid, sig)
        proc.wait(timeout_s)
    except ProcessLookupError:
        pass
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


class Procs:
    def __init__(self, workdir: Path, env: dict[str, str]):
        self.workdir = workdir
        self.env = dict(os.environ, **env)
        self.procs: dict[str, subprocess.Popen] = {}
        (workdir / "logs").mkdir(parents=True, exist_ok=True)

    def redis(self) -> str:
        port = free_port()
        self.spawn(
            "redis",
            [
                "redis-server",
                "--port",
                str(port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.workdir),
            ],
        )
        url = f"redis://127.0.0.1:{port}/0"
        client = redis.Redis.from_url(url)
        for _ in range(100):
            try:
                client.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        self.env["HEADRACE_REDIS_URL"] = url
        return url

    def service(self, name: str, *args: str, env: dict | None = None) -> subprocess.Popen:
        return self.spawn(name, [sys.executable, "-m", "services.cli", *args], env)

    def simulated_fleet(self, name: str, count: int, *, slots: int, fleet_id: str) -> subprocess.Popen:
        """K simulated TaskManagers in one process: bench/simulated_taskmanagers.py of code_dir(),
        or `headrace taskmanager --simulate K` of an older checkout that has no such script."""
        script = code_dir() / "bench" / "simulated_taskmanagers.py"
        options = ["--slots", str(slots), "--id", fleet_id]
        if not script.is_file():
            return self.service(name, "taskmanager", "--simulate", str(count), *options)
        return self.spawn(name, [sys.executable, str(script), str(count), *options])

    def spawn(self, name: str, cmd: list[str], env: dict | None = None) -> subprocess.Popen:
        log = open(self.workdir / "logs" / f"{name}.log", "ab")
        p = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=dict(self.env, **(env or {})),
            start_new_session=True,
            cwd=code_dir(),
        )
        self.procs[name] = p
        return p

    def stop(self) -> None:
        for name in reversed(list(self.procs)):
            p = self.procs[name]
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
        deadline = time.monotonic() + 20
        for p in self.procs.values():
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
