"""The local cluster's child processes (services/cluster/local_cluster.py): each started in a
session of its own with its output in <run>/logs/<name>.log, and, where it reads a config file,
with its own <run>/<config>.yaml; a member started again gets a note in its log first; and
stopping them all in the order the services depend on each other: SIGTERM to each group (the
TaskManagers stop their Spark drivers), a wait, then SIGKILL for what is left, so no JVM outlives
the cluster."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from services.cluster import catalog_server, redis_auth
from services.cluster.pinned_ports import role_of


@dataclass
class Child:
    name: str
    proc: subprocess.Popen
    log: Path
    env: dict = field(default_factory=dict, repr=False)
    cmd: list[str] = field(default_factory=list)  # what respawn() runs again
    # How stop() asks it to end: None, SIGTERM to its process group; a signal, that signal to its
    # own process only, which ends the rest itself (PostgreSQL's postmaster: SIGINT, fast shutdown).
    shutdown_signal: int | None = None


def config_name(name: str) -> str | None:
    """Whose <run>/<config>.yaml a child reads: taskmanager-3 is TaskManager tm-3, with a file
    (and Redis user) of its own; the other services one per role."""
    role = role_of(name)
    return f"tm-{name.rsplit('-', 1)[1]}" if role == redis_auth.TASKMANAGER else role


def spawn(name: str, cmd: list[str], env: dict, run_dir: Path) -> Child:
    """Start `cmd` as child `name` in a session of its own, its output appended to its log."""
    role = config_name(name)
    if role is not None and env.get("HEADRACE_CONFIG"):
        env = env | {"HEADRACE_CONFIG": str(run_dir / f"{role}.yaml")}
    log = run_dir / "logs" / f"{name}.log"
    env = env | {"HEADRACE_LOG_FILE": str(log)}  # what its metrics port serves at /logs
    with open(log, "ab") as f:
        proc = subprocess.Popen(
            cmd, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True
        )
    return Child(name, proc, log, env, cmd=list(cmd))


def prepare_respawn(old: Child) -> None:
    """Before the exited `old` is started again: kill what it left in its process group (a Celery
    or ZooKeeper helper must not compete with its successor), and say in its log that it starts again."""
    _signal_group(old.proc.pid, signal.SIGKILL)
    with open(old.log, "ab") as f:
        f.write(
            f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} {old.name} (pid {old.proc.pid}) "
            f"exited with code {old.proc.returncode}; starting it again ---\n".encode()
        )


def stop_in_order(children: list[Child], timeout_s: float, *, after_taskmanagers: Callable[[], None]) -> None:
    """Stop every child, a group at a time: the front (dispatcher, JobManagers), the TaskManagers
    (then `after_taskmanagers()`), the Spark workers and master, the back (ResourceManager, Redis,
    ZooKeeper, Kafka), the catalog server, and whatever else runs."""
    by_name = {c.name: c for c in children}
    names = list(by_name)
    front = ["dispatcher"] + [n for n in names if n.startswith("jobmanager")]
    middle = [n for n in names if n.startswith("taskmanager")]
    # The Spark workers after the TaskManagers (whose drivers use their executors), and
    # whatever else runs: nothing started here may outlive stop().
    spark = [n for n in names if n.startswith("spark-worker")] + ["spark-master"]
    back = ["resourcemanager", "redis", "zookeeper", "kafka"]  # the drivers used the broker till here
    catalog = [catalog_server.CHILD]  # the last service that used it has ended
    rest = [n for n in names if n not in {*front, *middle, *spark, *back, *catalog}]
    for group in (front, middle, spark, back, catalog, rest):
        _stop_group([by_name[n] for n in group if n in by_name and by_name[n].proc.poll() is None], timeout_s)
        if group is middle:
            after_taskmanagers()


def _stop_group(live: list[Child], timeout_s: float) -> None:
    for c in live:
        if c.shutdown_signal is None:
            _signal_group(c.proc.pid, signal.SIGTERM)
        else:
            _signal_process(c.proc.pid, c.shutdown_signal)
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


def _signal_process(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass
