"""What several end-to-end drills share: the clickstream example's fixed input and what it must
count, the Spark drivers a TaskManager runs, a savepoint over REST, and a TaskManager killed under
its task."""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from datetime import timezone

import psutil
import psycopg

from services.taskmanager.runtime.connectors.datagen import generate_events
from tests.clusters import Rest
from tests.waiting import wait_for

SEED, TOTAL = 42, 2400
ARGS = [
    "--total",
    str(TOTAL),
    "--rate",
    "800",
    "--seed",
    str(SEED),
    "--events-per-minute",
    "600",
    "--max-delay-ms",
    "5000",
    "--table",
    "e2e_clicks",
]


def expected_counts() -> Counter:
    counts = Counter()
    for e in generate_events(SEED, 0, TOTAL, events_per_minute=600, max_delay_ms=5000):
        t = e["event_time"].astimezone(timezone.utc).replace(tzinfo=None)
        counts[(t.replace(second=0, microsecond=0), e["url"])] += 1
    return counts


def sink_counts(pg: str, table: str) -> Counter:
    """(window start in UTC, url) -> count, as the pipeline left it in PostgreSQL."""
    with psycopg.connect(pg) as conn:
        rows = conn.execute(f"SELECT window_start, url, count FROM {table}").fetchall()
    got = Counter()
    for start, url, count in rows:
        start = start.astimezone(timezone.utc).replace(tzinfo=None) if start.tzinfo else start
        got[(start, url)] += count
    return got


def runner_processes(tm_pid: int) -> list[psutil.Process]:
    """The Spark driver processes a TaskManager supervises (each leads its own session)."""
    out = []
    for p in psutil.Process(tm_pid).children(recursive=False):
        try:
            if p.status() != psutil.STATUS_ZOMBIE and "services.taskmanager.runtime.runner" in " ".join(p.cmdline()):
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


def settled_drivers(c, names, timeout_s: float = 60) -> dict[str, set[int]]:
    """Wait until each TaskManager runs exactly its one warm driver (the previous task's driver
    has exited), then return their pids."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = {n: {p.pid for p in runner_processes(c.child(n).proc.pid)} for n in names}
        if all(len(pids) == 1 for pids in found.values()) or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


def savepoint(rest: Rest, job: str, path: str, body: dict) -> str:
    r = rest.http.post(f"/jobs/{job}/{path}", json=body)
    assert r.status_code == 202, r.text
    rid = r.json()["request-id"]

    def done():
        st = rest.get(f"/jobs/{job}/savepoints/{rid}")
        return st if st["status"]["id"] == "COMPLETED" else None

    status = wait_for(f"savepoint {rid}", done, 120, poll_s=0.25)
    assert "location" in status["operation"], status
    return status["operation"]["location"].removeprefix("file:")


def kill_task_taskmanager(c, rest: Rest, job: str, *, respawn: bool = True, timeout_s: float = 120) -> str:
    """kill -9 of the TaskManager running `job`'s task and of its drivers; waits for the next
    attempt to run (elsewhere), then starts the TaskManager again unless `respawn` is False (a
    cluster whose supervisor restarts its children)."""
    attempt = rest.attempts(job)[-1]
    tm = attempt["taskmanager-id"]
    name = {"tm-1": "taskmanager-1", "tm-2": "taskmanager-2"}[tm]
    proc = psutil.Process(c.child(name).proc.pid)
    drivers = runner_processes(proc.pid)
    os.killpg(proc.pid, signal.SIGKILL)
    for d in drivers:
        try:
            os.killpg(d.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    rest.wait_attempt_running(job, attempt["attempt"] + 1, timeout_s=timeout_s)
    if respawn:  # else a supervised cluster has started it again by itself
        c.child(name).proc.wait(10)
        c.respawn(name)
    return name
