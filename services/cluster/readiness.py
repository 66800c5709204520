"""When a local cluster is up: the dispatcher answers and counts every TaskManager registered
(or, when it asks for a token, the catalog does)."""

from __future__ import annotations

import http.client
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Sequence
from urllib.parse import urlsplit

from shared.catalog import Catalog

if TYPE_CHECKING:
    from services.cluster.local_cluster import Child


def wait_until_ready(dispatcher_url: str, children: Sequence[Child], taskmanagers: int, catalog_url: str,
                     wait_s: float, logs: Path) -> str | None:
    """None once `taskmanagers` TaskManagers are registered; otherwise why not: a child exited
    first, or `wait_s` passed."""
    deadline = time.monotonic() + wait_s
    url = urlsplit(dispatcher_url)
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
