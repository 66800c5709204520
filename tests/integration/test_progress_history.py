"""The recent history of a task's figures that a TaskManager keeps in Redis (services/taskmanager/
metrics.py, streams.progress_history_key), on a real redis-server: one point a second at most,
oldest first, nothing older than ten minutes, at most PROGRESS_HISTORY_POINTS, expiring ten
minutes after the last point, and kept when the task ends (what led to a failure)."""

from __future__ import annotations

import time
from itertools import pairwise
from types import SimpleNamespace

import redis

from services.taskmanager.metrics import TaskMetrics
from shared import streams
from shared.clock import FakeClock
from shared.task_protocol import Progress

SPEC = SimpleNamespace(job_id="j" * 32, vertex_id="v" * 32, execution_id="e" * 32, attempt=0)


def history(client) -> list[tuple[int, dict]]:
    return [
        (int(i.decode().split("-")[0]), {k.decode(): v.decode() for k, v in f.items()})
        for i, f in client.xrange(streams.progress_history_key("tm-1", SPEC.execution_id))
    ]


def test_history_is_one_point_a_second_ordered_and_bounded_to_ten_minutes(redis_url):
    client = redis.Redis.from_url(redis_url)
    start = int(time.time() * 1000) - 900_000  # 15 minutes ago, batches every 250 ms since
    clock = FakeClock(start)  # milliseconds here
    m = TaskMetrics(client, clock_ms=clock.now)
    for n in range(3600):
        m.progress(
            "tm-1",
            SPEC,
            Progress(
                batch_id=n,
                num_input_rows=10,
                input_rows_per_second=40.0,
                processed_rows_per_second=50.0,
                batch_duration_ms=200,
                source_lag=n % 7,
            ),
        )
        clock.advance(250)
    points = history(client)
    newest = clock.now() - 250
    times = [t for t, _ in points]
    assert times == sorted(times) and len(set(times)) == len(times)
    assert all(b - a >= streams.PROGRESS_HISTORY_STEP_MS for a, b in pairwise(times))
    assert len(points) <= streams.PROGRESS_HISTORY_POINTS
    assert times[0] >= newest - streams.PROGRESS_HISTORY_S * 1000 and times[-1] >= newest - 1000
    assert len(points) >= streams.PROGRESS_HISTORY_POINTS - 2  # ten minutes at one a second
    last = points[-1][1]
    assert set(last) == {
        "batch_id",
        "input_rows_per_second",
        "processed_rows_per_second",
        "num_input_rows",
        "timestamp",
        "batch_duration_ms",
        "source_lag",
    }
    assert int(last["timestamp"]) == times[-1] and last["input_rows_per_second"] == "40.0"
    ttl = client.ttl(streams.progress_history_key("tm-1", SPEC.execution_id))
    assert 0 < ttl <= streams.PROGRESS_HISTORY_S
    # The task ends: its live figures go, its history stays until it expires.
    m.forget("tm-1", SPEC)
    assert not client.exists(streams.progress_key("tm-1", SPEC.execution_id))
    assert len(history(client)) == len(points)
    client.close()


def test_slow_batches_keep_every_point_and_a_lost_redis_does_not_fail_the_task(redis_url, redis_server):
    client = redis.Redis.from_url(redis_url, socket_timeout=2)
    clock = FakeClock(int(time.time() * 1000) - 60_000)  # milliseconds here
    m = TaskMetrics(client, clock_ms=clock.now)
    for n in range(5):
        m.progress("tm-1", SPEC, Progress(batch_id=n))
        clock.advance(5000)
    assert [int(f["batch_id"]) for _, f in history(client)] == [0, 1, 2, 3, 4]
    redis_server.stop()
    m.progress("tm-1", SPEC, Progress(batch_id=5))  # best effort: logged, not raised
    client.close()
