"""An outside producer of numbered events and the totals a counting job must end with: shared by
the end-to-end drills (checkpoints, outages and chaos)."""

from __future__ import annotations

import json
import threading
import time
from collections import defaultdict
from datetime import datetime, timedelta, timezone

import psycopg
import redis

from tests.clusters import Rest

KEYS = 5
BASE = datetime(2026, 11, 22, 10, 0, tzinfo=timezone.utc)
STEP_MS = 20  # event time advances 20 ms per event: a 10 s window holds 500 events
# The drills' trigger and checkpoint interval. They test exact counts and failover, not latency,
# on 2 shared cores: one counting job at 150 events/s keeps 0.78 cores busy with a 500 ms trigger
# and a checkpoint a second, 0.52 with these (docs/benchmarks.md, "The drills' trigger").
TRIGGER = "1 second"
CHECKPOINT_INTERVAL = "2 s"


class Producer:
    """An outside producer: numbered JSON events at a steady rate (changed with `set_rate`), until
    stopped."""

    def __init__(self, url: str, stream: str, rate: float = 150.0):
        self.client = redis.Redis.from_url(url)
        self.stream, self.rate = stream, rate
        self.produced = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._since, self._produced_then = time.monotonic(), 0
        self._thread = threading.Thread(target=self._run, daemon=True)

    def event(self, n: int, key: str | None = None, when: datetime | None = None) -> dict:
        t = when or BASE + timedelta(milliseconds=n * STEP_MS)
        return {"key": key or f"k{n % KEYS}", "n": n, "value": n, "event_time": t.isoformat()}

    def start(self) -> "Producer":
        self._since = time.monotonic()
        self._thread.start()
        return self

    def set_rate(self, rate: float) -> None:
        """From now on `rate` events per second."""
        with self._lock:
            self._since, self._produced_then, self.rate = time.monotonic(), self.produced, rate

    def _run(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                due = self._produced_then + int((time.monotonic() - self._since) * self.rate)
            if due > self.produced:
                pipe = self.client.pipeline(transaction=False)
                for n in range(self.produced, due):
                    pipe.xadd(self.stream, {"json": json.dumps(self.event(n))})
                pipe.execute()
                self.produced = due
            time.sleep(0.02)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(10)
        return self.produced

    def flush_windows(self) -> None:
        """One far-future event: the watermark passes every real window, so all of them close."""
        far = BASE + timedelta(hours=1)
        self.client.xadd(self.stream, {"json": json.dumps(self.event(10**9, key="_flush", when=far))})


def expected_totals(produced: int) -> dict[str, tuple[int, int]]:
    out: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for n in range(produced):
        out[f"k{n % KEYS}"][0] += 1
        out[f"k{n % KEYS}"][1] += n
    return {k: (c, s) for k, (c, s) in out.items()}


def sql_totals(pg: str, table: str) -> dict[str, tuple[int, int]]:
    """The sink's rows; empty while the job has not created its table yet (no batch committed)."""
    with psycopg.connect(pg) as conn:
        try:
            rows = conn.execute(f"SELECT key, count, total FROM {table}").fetchall()
        except psycopg.errors.UndefinedTable:
            return {}
    return {k: (cnt, tot) for k, cnt, tot in rows}


def completed_checkpoints(rest: Rest, job: str) -> int:
    return rest.get(f"/jobs/{job}/checkpoints")["counts"]["completed"]
