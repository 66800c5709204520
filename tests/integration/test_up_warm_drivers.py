"""`headrace up` says when every TaskManager has a warm Spark driver ready (after "Headrace is
up", which comes as soon as they are registered): from then on a submission, and a failover to
the other TaskManager, starts in about a second. The TaskManagers' first warm-ups are urgent
(services/taskmanager/drivers/warm_pool.py: no driver, no task), and their logs say so."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import redis
import yaml

from shared import streams
from shared.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
WARM_LINE = "Warm drivers ready on every TaskManager"


def test_headrace_up_says_when_every_taskmanager_has_a_ready_warm_driver(tmp_path):
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith("HEADRACE_")}
    # A TMPDIR of its own: the machine's warm-up tokens live under it, and other clusters of the
    # suite may hold the shared ones for a while.
    (tmp_path / "tmp").mkdir()
    env |= {"HEADRACE_HOME": str(home), "HEADRACE_DISPATCHER_PORT": str(free_port()), "TMPDIR": str(tmp_path / "tmp")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "services.cli", "up"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=ROOT,
        start_new_session=True,
    )
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()
    seen: list[str] = []
    try:
        deadline = time.monotonic() + 420
        while not any(WARM_LINE in line for line in seen):
            assert time.monotonic() < deadline, f"no warm-drivers line within 420 s: {seen}"
            assert proc.poll() is None or not lines.empty(), f"headrace up exited: {seen}"
            try:
                seen.append(lines.get(timeout=1))
            except queue.Empty:
                continue
            assert "No warm driver ready" not in seen[-1], seen
        order = [
            next(i for i, line in enumerate(seen) if text in line)
            for text in ("Headrace is up", "Warming up a Spark driver on each TaskManager", WARM_LINE)
        ]
        assert order == sorted(order), seen
        config = next(home.glob("runs/*/config.yaml"))
        with redis.Redis.from_url(yaml.safe_load(config.read_text())["redis_url"]) as client:
            for tm in ("tm-1", "tm-2"):
                assert json.loads(client.get(streams.tm_warm_key(tm)))["ready"] >= 1, tm
        logs = "".join(p.read_text() for p in home.glob("runs/*/logs/taskmanager-*.log"))
        assert logs.count("(local[2], urgent)") == 2, "each TaskManager's first warm-up is urgent"
        drivers = "".join(p.read_text(errors="replace") for p in home.rglob("driver-*.log"))
        assert drivers.count("warm-up took") >= 2, "by default a warm driver runs its warm-up query"
    finally:
        os.killpg(proc.pid, signal.SIGINT)  # as Ctrl-C does
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def test_the_wait_for_warm_drivers_ends_when_each_taskmanager_has_one_or_wants_none(redis_url):
    from services.cluster.readiness import wait_for_warm_drivers

    def publish(tm: str, ready: int, starting: int = 0, waiting: int = 0) -> None:
        client.set(
            streams.tm_warm_key(tm),
            json.dumps({"ready": ready, "starting": starting, "waiting": waiting, "parallelism": 2}),
        )

    with redis.Redis.from_url(redis_url) as client:
        publish("tm-1", ready=1)
        publish("tm-2", ready=0, starting=1)
        publish("tm-4", ready=0)  # no free slot a driver would fit: nothing to wait for
        client.set(streams.tm_warm_key("tm-5"), '["not a pool"]')
        # tm-3 has published nothing yet: not ready
        everyone = ["tm-1", "tm-2", "tm-3", "tm-4", "tm-5"]
        assert wait_for_warm_drivers(redis_url, everyone, 0.5) == ["tm-2", "tm-3", "tm-5"]
        assert wait_for_warm_drivers(redis_url, ["tm-2"], 30, stopped=lambda: True) == ["tm-2"]
        threading.Timer(0.5, lambda: publish("tm-2", ready=1)).start()
        started = time.monotonic()
        assert wait_for_warm_drivers(redis_url, ["tm-1", "tm-2"], 30) == []
        assert time.monotonic() - started < 10


def test_the_spare_planner_leaves_its_reserve_once_no_taskmanager_that_publishes_starts_a_driver_urgently(redis_url):
    """What ends the dispatcher's spare planner's reserve (shared/warm_pools.py)."""
    from shared import warm_pools

    def publish(tm: str, **pool) -> None:
        client.set(streams.tm_warm_key(tm), json.dumps({"ready": 0, "starting": 0, "waiting": 0, **pool}))

    everyone = ["tm-1", "tm-2", "tm-3", "tm-9"]
    with redis.Redis.from_url(redis_url) as client:
        assert not warm_pools.no_urgent_warm_up(client, everyone)  # nothing published: a cluster starting
        assert not warm_pools.no_urgent_warm_up(client, [])  # no TaskManager registered yet
        publish("tm-1", ready=1)
        publish("tm-2", starting=1, urgent=True)  # no driver, no task: the next failover lands here
        client.set(streams.tm_warm_key("tm-9"), "[1, 2]")  # not a pool: as if unpublished
        assert not warm_pools.no_urgent_warm_up(client, everyone)
        assert warm_pools.no_urgent_warm_up(client, ["tm-1"])  # only the registered ones count
        publish("tm-2", starting=1, urgent=False)  # a replacement warming niced beside its task
        assert warm_pools.no_urgent_warm_up(client, everyone)
        publish("tm-3", waiting=1, urgent=True)  # waits for a token to warm up urgently
        assert not warm_pools.no_urgent_warm_up(client, everyone)
    assert not warm_pools.no_urgent_warm_up(
        redis.Redis(port=1, socket_timeout=1), everyone
    )  # no answer: stay in reserve
