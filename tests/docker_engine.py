"""A Docker engine for the compose-stack test and benchmark: the one DOCKER_HOST (or the default
socket) names when it answers, else a `dockerd` of our own with its own socket, exec root and a
data root under ~/.cache/headrace/docker, so the images built there survive between runs on one
machine (deploy/local-images then reuses them). The engine we start is stopped by its PID.

Starting dockerd needs root. `EngineUnavailable` says why none can run here; callers skip with it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

IP_FORWARD = Path("/proc/sys/net/ipv4/ip_forward")
START_TIMEOUT_S = 90
STOP_TIMEOUT_S = 60


class EngineUnavailable(RuntimeError):
    """No Docker engine answers and none can be started here; the message says why."""


def answers(host: str) -> bool:
    out = subprocess.run(
        ["docker", "-H", host, "version", "--format", "{{.Server.Version}}"], capture_output=True, timeout=30
    )
    return out.returncode == 0


def cache_root() -> Path:
    return Path(os.environ.get("HEADRACE_CACHE") or Path.home() / ".cache" / "headrace")


def run_dir(data_root: Path) -> Path:
    """Socket, exec root and pid file of the engine on `data_root`: one engine per data root (a second
    dockerd on the same one would fail), and a short path (unix socket paths stop at 107 bytes)."""
    return Path("/run") / f"headrace-docker-{hashlib.sha256(str(data_root).encode()).hexdigest()[:8]}"


class DockerEngine:
    def __init__(self, host: str, proc: subprocess.Popen | None = None, restore_ip_forward: str | None = None):
        self.host = host
        self.proc = proc  # None: somebody else's engine, left running
        self._restore_ip_forward = restore_ip_forward

    @property
    def env(self) -> dict[str, str]:
        """The environment for docker / docker-compose / deploy/local-images to reach this engine."""
        return {**os.environ, "DOCKER_HOST": self.host, "DOCKER_BUILDKIT": "0"}

    @classmethod
    def find_or_start(cls, log: Path) -> "DockerEngine":
        if shutil.which("docker") is None or shutil.which("docker-compose") is None:
            raise EngineUnavailable(
                "the docker client or docker-compose is missing (Debian: docker.io, docker-compose)"
            )
        ours = f"unix://{run_dir(cache_root() / 'docker' / 'data') / 'docker.sock'}"
        for host in filter(None, (os.environ.get("DOCKER_HOST"), "unix:///var/run/docker.sock", ours)):
            if answers(host):
                return cls(host)
        return cls._start(log)

    @classmethod
    def _start(cls, log: Path) -> "DockerEngine":
        if shutil.which("dockerd") is None:
            raise EngineUnavailable("no engine answers and dockerd is not installed (Debian: docker.io)")
        if os.geteuid() != 0:
            raise EngineUnavailable("no engine answers and starting dockerd needs root")
        # dockerd turns the FORWARD chain's policy to DROP when it has to switch forwarding on itself;
        # switched on beforehand (and back afterwards) the machine's other traffic is left alone.
        before = IP_FORWARD.read_text().strip() if IP_FORWARD.exists() else None
        if before == "0":
            IP_FORWARD.write_text("1")
        data_root = cache_root() / "docker" / "data"
        data_root.mkdir(parents=True, exist_ok=True)
        runs = run_dir(data_root)
        runs.mkdir(parents=True, exist_ok=True)
        socket = runs / "docker.sock"
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                [
                    "dockerd",
                    "--data-root",
                    str(data_root),
                    "--exec-root",
                    str(runs / "exec"),
                    "-H",
                    f"unix://{socket}",
                    "--pidfile",
                    str(runs / "docker.pid"),
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        engine = cls(f"unix://{socket}", proc, restore_ip_forward=before)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not answers(engine.host):
            if proc.poll() is not None or time.monotonic() > deadline:
                engine.stop()
                tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
                raise RuntimeError(
                    f"dockerd did not answer on {socket} within {START_TIMEOUT_S} s "
                    f"(exit code {proc.poll()}); its log {log}:\n{tail}"
                )
            time.sleep(0.5)
        return engine

    def stop(self) -> None:
        """Stops the engine we started (its containers were removed by the caller) and its containerd."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        if self._restore_ip_forward == "0":
            IP_FORWARD.write_text("0")
