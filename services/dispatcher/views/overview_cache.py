"""The encoded answer of `GET /jobs/overview`, built at most once per time-to-live.

Why: with 1,000 jobs one answer costs tens of milliseconds of the dispatcher's CPU, and the
dashboard (every open tab, once a second) and scripts poll it; building it per request made the
dispatcher fall behind at 200 requests/s (docs/benchmarks.md, "At 10,000 TaskManagers"). Flink
does the same with its REST handlers' ExecutionGraphCache: an execution graph is fetched once and
served until its time-to-live (web.refresh-interval) runs out. Here the time-to-live is
`settings.overview_cache_ms` (1 s, the dashboard's refresh interval; 0: no cache).

Rules, in `get`:
- within the time-to-live, every request gets the same bytes;
- after it, exactly one request rebuilds (a lock: single flight); requests arriving meanwhile get
  the earlier answer (stale-while-revalidate) rather than queueing behind the rebuild;
- `invalidate()` (this dispatcher's own writes: a submission) makes the next request rebuild and
  wait for it, so a client that submits and then lists sees its job; an answer whose build began
  before the invalidation is never served afterwards;
- a failed build drops the earlier answer: a catalog outage is answered with its error (503), not
  with ever-older jobs.

Pure: no I/O, no FastAPI; the clock is injected (tests use a fake one). One instance per app,
made by `create_app`.
"""

from __future__ import annotations

import threading
import time
from typing import Callable, NamedTuple


class Entry(NamedTuple):
    body: bytes
    built_at: float  # the cache clock's reading when its build began (seconds)
    generation: int  # invalidations seen when its build began


class OverviewCache:
    def __init__(self, ttl_s: float, *, clock: Callable[[], float] = time.monotonic):
        self.ttl_s = max(0.0, ttl_s)
        self.clock = clock
        self._build_lock = threading.Lock()  # held by the one request rebuilding
        self._gen_lock = threading.Lock()
        self._generation = 0
        self._entry: Entry | None = None  # replaced whole, so a reader never sees half an update

    @property
    def enabled(self) -> bool:
        return self.ttl_s > 0

    def invalidate(self) -> None:
        """The catalog changed under this dispatcher's hand: the next request rebuilds."""
        with self._gen_lock:
            self._generation += 1

    def peek(self) -> Entry | None:
        """The answer `get` would give without building or waiting: a fresh one, or the earlier
        one while another request rebuilds it; else None. Never blocks."""
        entry = self._entry
        if entry is None or entry.generation != self._generation:
            return None
        if self._fresh(entry) or self._build_lock.locked():
            return entry
        return None

    def get(self, build: Callable[[], bytes]) -> Entry:
        """The answer: cached, stale while another request rebuilds it, or built now by `build`."""
        if not self.enabled:
            return Entry(build(), self.clock(), self._generation)
        entry = self._entry
        if entry is not None and self._fresh(entry):
            return entry
        if entry is not None and entry.generation == self._generation:
            # Expired but not invalidated: rebuild unless someone else is; then serve it stale.
            if not self._build_lock.acquire(blocking=False):
                return entry
        else:
            self._build_lock.acquire()  # nothing servable: wait for the rebuild under way, or do it
        try:
            entry = self._entry  # a rebuild may have finished while this request waited
            if entry is not None and self._fresh(entry):
                return entry
            generation, started = self._generation, self.clock()
            try:
                body = build()
            except BaseException:
                self._entry = None
                raise
            entry = Entry(body, started, generation)
            self._entry = entry
            return entry
        finally:
            self._build_lock.release()

    def age_s(self, entry: Entry) -> float:
        return max(0.0, self.clock() - entry.built_at)

    def _fresh(self, entry: Entry) -> bool:
        return entry.generation == self._generation and self.clock() - entry.built_at < self.ttl_s
