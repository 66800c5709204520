"""Prometheus exposition shared by every service (docs/runbooks/metrics.md).

Each process keeps its own CollectorRegistry (never prometheus_client's global one: tests run
several apps in one interpreter). The JobManager, ResourceManager and TaskManagers serve it on
their own port with `serve`; the dispatcher serves it at GET /metrics on its REST port.
Numbers that live in the catalog or Redis are read at scrape time by a `CachedCollector`, so a
scrape costs one set of queries, at most one every CACHE_S seconds however many scrapers ask.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Iterable

from prometheus_client import CollectorRegistry, disable_created_metrics, start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

log = logging.getLogger("headrace.metrics")

# A `*_created` sample per counter doubles the series for nothing Prometheus uses.
disable_created_metrics()

PREFIX = "headrace"
CACHE_S = 2.0
DISABLED = -1  # a *_metrics_port of -1 serves nothing; 0 asks the OS for a free port


def name(suffix: str) -> str:
    return f"{PREFIX}_{suffix}"


def serve(registry: CollectorRegistry, *, host: str, port: int, service: str) -> int | None:
    """Serve `registry` over HTTP in a daemon thread; returns the port, or None when disabled or
    when the port is taken. A service without metrics still runs its jobs: a taken port is
    logged, never fatal."""
    if port == DISABLED:
        log.info("%s metrics disabled (port %d)", service, port)
        return None
    try:
        server, _thread = start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        log.error("%s metrics not served: cannot listen on %s:%d (%s); set another *_metrics_port "
                  "(0 = any free port, -1 = off)", service, host, port, exc)
        return None
    actual = server.server_port
    log.info("%s metrics on http://%s:%d/metrics", service, host, actual)
    return actual


class CachedCollector(Collector):
    """Runs `gather()` (the subclass's queries) at most once per CACHE_S and hands every scrape
    in that window the same families. A failed gather (catalog or Redis down) keeps no stale
    numbers: it yields only `headrace_scrape_errors`, so dashboards show a gap, not old values."""

    def __init__(self, source: str, cache_s: float = CACHE_S, clock=time.monotonic):
        self.source, self.cache_s, self.clock = source, cache_s, clock
        self._lock = threading.Lock()
        self._families: list[Metric] = []
        self._at = -1e18
        self._errors = 0

    def gather(self) -> Iterable[Metric]:  # pragma: no cover - abstract
        raise NotImplementedError

    def describe(self) -> list[Metric]:
        return []  # unknown until the first gather: registering must not query anything

    def collect(self) -> Iterable[Metric]:
        with self._lock:
            if self.clock() - self._at >= self.cache_s:
                try:
                    self._families = list(self.gather())
                except Exception as exc:  # noqa: BLE001 - a scrape must answer, whatever failed
                    self._errors += 1
                    self._families = []
                    log.warning("%s metrics: %s: %s", self.source, type(exc).__name__, exc)
                self._at = self.clock()
            families = list(self._families)
        errors = GaugeMetricFamily(name("scrape_errors"), "failed metric queries since start, by source",
                                   labels=["source"])
        errors.add_metric([self.source], self._errors)
        return families + [errors]


def stream_group_families(client, stream_names: Iterable[str]) -> list[Metric]:
    """Length of each stream and, per consumer group, its lag (entries not yet delivered to the
    group) and pending entries (delivered, not yet acknowledged): XLEN + XINFO GROUPS in one
    round trip. A stream not created yet counts as empty."""
    stream_names = list(stream_names)
    pipe = client.pipeline(transaction=False)
    for s in stream_names:
        pipe.xlen(s)
        pipe.xinfo_groups(s)
    answers = pipe.execute(raise_on_error=False)
    length = GaugeMetricFamily(name("stream_length"), "entries in the stream (capped by stream_maxlen)",
                               labels=["stream"])
    lag = GaugeMetricFamily(name("stream_group_lag"), "entries of the stream not yet delivered to the consumer group",
                            labels=["stream", "group"])
    pending = GaugeMetricFamily(name("stream_group_pending"),
                                "entries delivered to the consumer group but not acknowledged",
                                labels=["stream", "group"])
    for i, s in enumerate(stream_names):
        xlen, groups = answers[2 * i], answers[2 * i + 1]
        length.add_metric([s], xlen if isinstance(xlen, int) else 0)
        if isinstance(groups, Exception):
            if "no such key" in str(groups).lower():
                continue
            raise groups
        for g in groups:
            group = _text(g.get("name"))
            # Redis computes lag only while it can (None after deletions past the group): count
            # nothing rather than guess.
            lag.add_metric([s, group], float(g.get("lag") or 0))
            pending.add_metric([s, group], float(g.get("pending") or 0))
    return [length, lag, pending]


def _text(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)
