"""When a local cluster is up: the dispatcher answers and counts every TaskManager registered
(or, when it asks for a token, the catalog does); and, later, when every TaskManager has a warm
Spark driver ready, so that a submission or a failover starts in about a second."""

from __future__ import annotations

import http.client
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence
from urllib.parse import urlsplit

import redis

from shared import warm_pools
from shared.catalog import Catalog

if TYPE_CHECKING:
    from services.cluster.child_processes import Child


def wait_until_ready(
    dispatcher_url: str, children: Sequence[Child], taskmanagers: int, catalog_url: str, wait_s: float, logs: Path
) -> str | None:
    """None once `taskmanagers` TaskManagers are registered; otherwise why not: a child exited
    first, or `wait_s` passed."""
    deadline = time.monotonic() + wait_s
    url = urlsplit(dispatcher_url)
    if url.hostname is None:
        return f"the dispatcher's address {dispatcher_url!r} names no host"
    while time.monotonic() < deadline:
        for c in children:
            if c.proc.poll() is not None:
                return f"{c.name} exited with code {c.proc.returncode}; see {c.log}"
        # The standard library's client, not httpx: its import and SSL context cost ~0.5 s of
        # CPU while the TaskManagers' drivers start on the same cores (docs/benchmarks.md).
        conn = http.client.HTTPConnection(url.hostname, url.port, timeout=1)
        try:
            conn.request("GET", "/overview")
            r = conn.getresponse()
            body = r.read()
            if r.status == 401:
                # Auth required (HEADRACE_AUTH): the dispatcher answers, the catalog says
                # how many TaskManagers registered.
                if registered_taskmanagers(catalog_url) >= taskmanagers:
                    return None
            elif r.status == 200 and json.loads(body).get("taskmanagers", 0) >= taskmanagers:
                return None
        except (OSError, http.client.HTTPException, ValueError, AttributeError):
            pass  # not listening yet, or an answer that is not the overview: ask again
        finally:
            conn.close()
        time.sleep(0.2)
    return f"cluster not ready within {wait_s:.0f} s; logs in {logs}"


def registered_taskmanagers(catalog_url: str) -> int:
    from shared.catalog import repository as repo

    try:
        with Catalog(catalog_url).session() as session:
            return len(repo.list_taskmanagers(session))
    except Exception:  # noqa: BLE001 - not migrated yet, or briefly locked: ask again
        return 0


def wait_for_warm_drivers(
    redis_url: str, taskmanager_ids: Sequence[str], wait_s: float, stopped: Callable[[], bool] = lambda: False
) -> list[str]:
    """Wait until every TaskManager reports a ready warm driver (hr:tm:<id>:warm, which each one
    refreshes with its heartbeat), or wants none (no free slot a driver would fit). Returns the
    TaskManagers still without one after `wait_s`, or when `stopped()` (Ctrl-C) says so: a task
    submitted before then may start on a driver still warming, and a failover to such a
    TaskManager waits for its warm-up."""
    client = redis.Redis.from_url(redis_url, socket_timeout=2)
    deadline = time.monotonic() + wait_s
    waiting = list(taskmanager_ids)
    try:
        while waiting and time.monotonic() < deadline and not stopped():
            waiting = [tm for tm in waiting if not warm_pools.taskmanager_settled(client, tm)]
            if waiting:
                time.sleep(0.2)
    finally:
        client.close()
    return waiting
