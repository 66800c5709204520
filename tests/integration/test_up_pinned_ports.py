"""`headrace up --ha --redis-port R --zookeeper-port Z --metrics-port-base B`, run as a user runs
it: its Redis answers on R, its ZooKeeper on Z, and the ResourceManager's, JobManagers' and
TaskManager's metrics on B, B+1, B+2, B+3, as cluster.json says; a pinned port that is taken stops
it with one line before anything starts."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from services.cluster.infrastructure import port_taken
from shared.ports import free_port

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 240


def environment(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HEADRACE_")}
    # No warm drivers and drivers as this user: nothing here runs a task.
    return env | {
        "HEADRACE_HOME": str(home),
        "PYTHONPATH": str(REPO),
        "HEADRACE_WARM_DRIVERS": "0",
        "HEADRACE_DRIVER_USER": "",
    }


def free_run(count: int) -> int:
    """The first of `count` consecutive free ports."""
    for _ in range(100):
        base = free_port()
        if all(not port_taken("127.0.0.1", base + i) for i in range(count)):
            return base
    raise AssertionError(f"no {count} consecutive free ports")


def test_up_listens_where_it_is_told(tmp_path):
    redis_port, zookeeper_port, base, dispatcher = free_port(), free_port(), free_run(4), free_port()
    log = tmp_path / "up.log"
    with open(log, "wb") as out:
        up = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "services.cli",
                "up",
                "--ha",
                "-n",
                "1",
                "--port",
                str(dispatcher),
                "--redis-port",
                str(redis_port),
                "--zookeeper-port",
                str(zookeeper_port),
                "--metrics-port-base",
                str(base),
            ],
            cwd=REPO,
            env=environment(tmp_path / "home"),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while "Press Ctrl-C to stop." not in log.read_text(errors="replace"):
            assert up.poll() is None and time.monotonic() < deadline, log.read_text(errors="replace")[-3000:]
            time.sleep(0.5)
        [run] = (tmp_path / "home" / "runs").iterdir()
        described = json.loads((run / "cluster.json").read_text())
        assert described["redis_port"] == redis_port
        assert described["zookeeper"] == f"127.0.0.1:{zookeeper_port}"
        assert described["metrics"] == {
            "resourcemanager": f"http://127.0.0.1:{base}/metrics",
            "jobmanager": f"http://127.0.0.1:{base + 1}/metrics",
            "jobmanager-2": f"http://127.0.0.1:{base + 2}/metrics",
            "taskmanager-1": f"http://127.0.0.1:{base + 3}/metrics",
            "dispatcher": f"http://127.0.0.1:{dispatcher}/metrics",
        }
        for url in described["metrics"].values():
            assert httpx.get(url, timeout=30).status_code == 200, url
        with socket.create_connection(("127.0.0.1", redis_port), timeout=5) as redis:
            redis.sendall(b"PING\r\n")
            assert redis.recv(64).startswith((b"+PONG", b"-NOAUTH"))
        with socket.create_connection(("127.0.0.1", zookeeper_port), timeout=5) as zookeeper:
            zookeeper.sendall(b"srvr")
            assert zookeeper.recv(256)  # the four-letter word may be refused, but the server answers
    finally:
        if up.poll() is None:
            os.kill(up.pid, signal.SIGINT)
            try:
                up.wait(90)
            except subprocess.TimeoutExpired:
                os.killpg(up.pid, signal.SIGKILL)
                up.wait(10)


def test_a_taken_pinned_port_stops_it_before_anything_starts(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "services.cli",
                "up",
                "-n",
                "1",
                "--port",
                str(free_port()),
                "--redis-port",
                str(port),
            ],
            cwd=REPO,
            env=environment(tmp_path / "home"),
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr.strip() == (
        f"error: port {port} for redis (--redis-port) is taken on 127.0.0.1: another "
        f"process listens there (ss -ltnp 'sport = :{port}'); stop it or choose another "
        "port"
    )
    assert not (tmp_path / "home" / "runs").exists()
