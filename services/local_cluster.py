"""A whole Headrace cluster as local child processes: `headrace up` and `headrace demo`.

Starts a redis-server on a free port (unless a Redis URL is configured), migrates the catalog,
then one JobManager (or, in ZooKeeper mode, a ZooKeeper server unless a quorum is configured and
several JobManagers that elect a leader), one ResourceManager, N TaskManagers and the
dispatcher, each a separate process in its own process group with its log under the run
directory. Stopping sends SIGTERM
to every group (the TaskManagers stop their Spark drivers), waits, then SIGKILLs what is left:
no orphan JVMs.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import redis
import yaml

from shared.catalog import Catalog
from shared.settings import Settings
from shared.transport.redis_streams import wait_for_redis


class ClusterError(RuntimeError):
    pass


ZOOKEEPER_HOME = Path(os.environ.get("HEADRACE_ZOOKEEPER_HOME", "/usr/share/zookeeper"))


def zookeeper_command(data_dir: Path, port: int) -> list[str]:
    """A standalone ZooKeeper server from Debian's `zookeeper` package on 127.0.0.1:port, with
    its data under data_dir. Sessions may be as short as 1 s (tests use short ones)."""
    script = ZOOKEEPER_HOME / "bin" / "zkServer.sh"
    if not script.exists():
        raise ClusterError(f"ZooKeeper is not installed ({script} missing; Debian: apt-get install zookeeper), "
                           "or set HEADRACE_ZOOKEEPER_HOME, or configure zookeeper_quorum")
    (data_dir / "data").mkdir(parents=True, exist_ok=True)
    cfg = data_dir / "zoo.cfg"
    cfg.write_text("\n".join([
        "tickTime=500", f"dataDir={data_dir / 'data'}", f"clientPort={port}", "clientPortAddress=127.0.0.1",
        "admin.enableServer=false", "minSessionTimeout=1000", "maxSessionTimeout=60000", "",
    ]))
    return [str(script), "start-foreground", str(cfg)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Child:
    name: str
    proc: subprocess.Popen
    log: Path


@dataclass
class LocalCluster:
    settings: Settings
    taskmanagers: int = 2
    slots: int | None = None
    jobmanagers: int = 1
    ha: bool = False  # ZooKeeper mode even if the settings say standalone
    run_dir: Path | None = None
    children: list[Child] = field(default_factory=list)
    redis_url: str = ""
    dispatcher_url: str = ""
    zookeeper_quorum: str | None = None
    _env: dict = field(default_factory=dict)

    def start(self, *, wait_s: float = 60.0, echo=print) -> "LocalCluster":
        s = self.settings
        self.run_dir = self.run_dir or s.home / "runs" / time.strftime("%Y%m%d-%H%M%S")
        (self.run_dir / "logs").mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        if "redis_url" in s.model_fields_set:
            self.redis_url = s.redis_url
        else:
            if not shutil.which("redis-server"):
                raise ClusterError("redis-server is not installed (Debian: apt-get install redis-server), "
                                   "or set HEADRACE_REDIS_URL to a running Redis")
            port = free_port()
            self.redis_url = f"redis://127.0.0.1:{port}/0"
            self._spawn("redis", ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                  "--appendonly", "no", "--dir", str(self.run_dir)], env)
            self._wait_redis()
        config = s.model_dump(mode="json") | {"redis_url": self.redis_url, "catalog_url": s.catalog}
        if self.ha or s.high_availability == "zookeeper":
            self.zookeeper_quorum = s.zookeeper_quorum or self._start_zookeeper(env)
            config |= {"high_availability": "zookeeper", "zookeeper_quorum": self.zookeeper_quorum}
        (self.run_dir / "config.yaml").write_text(yaml.safe_dump(config))
        env["HEADRACE_CONFIG"] = str(self.run_dir / "config.yaml")
        # Children read the file; drop inherited overrides that would contradict it.
        for key in [k for k in env if k.startswith("HEADRACE_") and k not in ("HEADRACE_CONFIG", "HEADRACE_LOG_LEVEL")]:
            env.pop(key)
        Catalog(s.catalog).migrate()
        self._env = env
        py = [sys.executable, "-m", "services.cli"]
        self._spawn("resourcemanager", py + ["resourcemanager"], env)
        for i in range(self.jobmanagers):
            self._spawn("jobmanager" if i == 0 else f"jobmanager-{i + 1}", py + ["jobmanager"], env)
        slots = self.slots or s.taskmanager_slots
        for i in range(self.taskmanagers):
            self._spawn(f"taskmanager-{i + 1}", py + ["taskmanager", "--slots", str(slots), "--id", f"tm-{i + 1}"], env)
        self._spawn("dispatcher", py + ["dispatcher"], env)
        self.dispatcher_url = f"http://{s.dispatcher_host}:{s.dispatcher_port}"
        self._wait_ready(wait_s)
        (self.run_dir / "cluster.json").write_text(json.dumps(self.describe(), indent=2))
        return self

    def _start_zookeeper(self, env: dict) -> str:
        port = free_port()
        child = self._spawn("zookeeper", zookeeper_command(self.run_dir / "zookeeper", port), env)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # its JVM takes a few seconds to listen
            if child.proc.poll() is not None:
                break
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    return f"127.0.0.1:{port}"
            time.sleep(0.2)
        raise ClusterError(f"ZooKeeper did not start; see {child.log}")

    def describe(self) -> dict:
        return {"dispatcher": self.dispatcher_url, "redis": self.redis_url, "catalog": self.settings.catalog,
                "zookeeper": self.zookeeper_quorum,
                "run_dir": str(self.run_dir),
                "processes": {c.name: c.proc.pid for c in self.children}}

    def respawn(self, name: str) -> Child:
        """Start a stopped (or killed) member again with the same command and environment."""
        old = self.child(name)
        if old.proc.poll() is None:
            raise ClusterError(f"{name} is still running (pid {old.proc.pid})")
        self.children.remove(old)
        return self._spawn(name, list(old.proc.args), self._env)

    def _spawn(self, name: str, cmd: list[str], env: dict) -> Child:
        log = self.run_dir / "logs" / f"{name}.log"
        with open(log, "ab") as f:
            proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                    start_new_session=True)
        child = Child(name, proc, log)
        self.children.append(child)
        return child

    def child(self, name: str) -> Child:
        return next(c for c in self.children if c.name == name)

    def _wait_redis(self) -> None:
        try:
            wait_for_redis(self.redis_url, timeout_s=10).close()
        except redis.ConnectionError:
            raise ClusterError(f"redis-server did not start; see {self.run_dir}/logs/redis.log") from None

    def _wait_ready(self, wait_s: float) -> None:
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            for c in self.children:
                if c.proc.poll() is not None:
                    raise ClusterError(f"{c.name} exited with code {c.proc.returncode}; see {c.log}")
            try:
                ov = httpx.get(f"{self.dispatcher_url}/overview", timeout=1).json()
                if ov.get("taskmanagers", 0) >= self.taskmanagers:
                    return
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(0.2)
        raise ClusterError(f"cluster not ready within {wait_s:.0f} s; logs in {self.run_dir}/logs")

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        os.killpg(self.child(name).proc.pid, sig)

    def stop(self, timeout_s: float = 20.0) -> None:
        names = [c.name for c in self.children]
        front = ["dispatcher"] + [n for n in names if n.startswith("jobmanager")]
        middle = [n for n in names if n.startswith("taskmanager")]
        back = ["resourcemanager", "redis", "zookeeper"]
        by_name = {c.name: c for c in self.children}
        for group in (front, middle, back):
            live = [by_name[n] for n in group if n in by_name and by_name[n].proc.poll() is None]
            for c in live:
                _signal_group(c.proc.pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout_s
            for c in live:
                try:
                    c.proc.wait(max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
                _signal_group(c.proc.pid, signal.SIGKILL)
                try:
                    c.proc.wait(5)
                except subprocess.TimeoutExpired:
                    pass

    def __enter__(self) -> "LocalCluster":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass
