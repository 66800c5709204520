"""The task's running Spark work, shared between the driver's main thread (which starts and
restarts the query) and the threads that stop it (cancel, no executors)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any


class QuerySlot:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._query: Any = None
        self._batch_running = False

    def start(
        self, handle: Any, live: Path, query_name: str, *, available_now: bool = False, once: bool = False
    ) -> Any:
        """Start the sink handle's streaming query from the live checkpoint `live` (`once`: run
        one micro-batch, the one Spark had planned if it had not committed it, then stop)."""
        with self._lock:
            if available_now or once:
                self._query = handle.start(str(live), query_name=query_name, available_now=available_now, once=once)
            else:
                self._query = handle.start(str(live), query_name=query_name)
            return self._query

    def stop(self, query: Any) -> None:
        with self._lock:
            query.stop()

    def batch_started(self) -> None:
        with self._lock:
            self._batch_running = True

    def current(self) -> tuple[Any, bool]:
        """The streaming query (or None) and whether a batch task's job runs."""
        with self._lock:
            return self._query, self._batch_running
