"""Prometheus exposition shared by every service (docs/runbooks/metrics.md).

Each process keeps its own CollectorRegistry (never prometheus_client's global one: tests run
several apps in one interpreter). The JobManager, ResourceManager and TaskManagers serve it on
their own port with `serve`; the dispatcher serves it at GET /metrics on its REST port.
Numbers that live in the catalog or Redis are read at scrape time by a `CachedCollector`, so a
scrape costs one set of queries, at most one every CACHE_S seconds however many scrapers ask.

The same small server answers GET /logs (the process's log files, `shared/log_files.py`) and
GET /logs/<name>?tail=<bytes>, but only to a request the control plane signed, and it signs its
answer (shared/log_access.py): the dispatcher fetches a TaskManager's or the leading JobManager's
logs there for an operator (docs/runbooks/logs.md). /metrics carries no token: bind metrics_host
to an address only the cluster reaches.
"""

from __future__ import annotations

import json
import logging
import socket
import socketserver
import threading
import time
from typing import Any, Iterable
from urllib.parse import parse_qs, unquote
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, disable_created_metrics, make_wsgi_app
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from shared import log_files
from shared.log_access import ANSWER_HEADER, HEADER, LogGuard
from shared.log_files import LogFiles

log = logging.getLogger("headrace.metrics")

# A `*_created` sample per counter doubles the series for nothing Prometheus uses.
disable_created_metrics()

PREFIX = "headrace"
CACHE_S = 2.0
DISABLED = -1  # a *_metrics_port of -1 serves nothing; 0 asks the OS for a free port


def name(suffix: str) -> str:
    return f"{PREFIX}_{suffix}"


def serve(
    registry: CollectorRegistry,
    *,
    host: str,
    port: int,
    service: str,
    logs: LogFiles | None = None,
    log_file: str | None = None,
    log_guard: LogGuard | None = None,
) -> int | None:
    """Serve `registry` at /metrics and `logs` (default: this process's own log file, `log_file`
    if the setting names one) at /logs to the requests `log_guard` admits (none without one)
    over HTTP in a daemon thread; returns the port, or None when disabled or when the port is
    taken. A service without metrics still runs its jobs: a taken port is logged, never fatal."""
    if port == DISABLED:
        log.info("%s metrics disabled (port %d)", service, port)
        return None
    logs = logs if logs is not None else LogFiles.of_this_process(main=log_file)
    try:
        server = make_server(
            host, port, _app(registry, logs, log_guard), server_class=_server_class(host), handler_class=_QuietHandler
        )
    except OSError as exc:
        log.error(
            "%s metrics not served: cannot listen on %s:%d (%s); set another *_metrics_port "
            "(0 = any free port, -1 = off)",
            service,
            host,
            port,
            exc,
        )
        return None
    threading.Thread(target=server.serve_forever, name=f"metrics-{service}", daemon=True).start()
    actual = server.server_port
    _served[service] = actual
    log.info(
        "%s metrics on http://%s:%d/metrics, logs on /logs (%s)",
        service,
        host,
        actual,
        logs.main or "no log file of its own",
    )
    return actual


# The port each service of this process serves on (the OS picks it for port 0): what
# `advertised_url` tells other processes. One entry per service name, written once at start.
_served: dict[str, int] = {}

WILDCARD_HOSTS = ("", "0.0.0.0", "::", "[::]")


def advertised_host(settings: Any) -> str:
    """The host other machines reach this process's metrics/log endpoint by: the setting
    `advertised_host`, else metrics_host, else (a wildcard listen address) this host's name,
    the one a TaskManager registers with."""
    explicit = getattr(settings, "advertised_host", None)
    if explicit:
        return explicit
    host = getattr(settings, "metrics_host", "") or ""
    return socket.gethostname() if host in WILDCARD_HOSTS else host


def advertised_url(service: str, settings: Any) -> str | None:
    """http://host:port of the endpoint `serve` started for `service` in this process; None
    when it serves none (disabled, or the port was taken)."""
    port = _served.get(service)
    if port is None:
        return None
    host = advertised_host(settings)
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # the base class's name
        pass  # a scrape every few seconds must not fill the log it serves


def _server_class(host: str) -> type[WSGIServer]:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET

    class _Server(socketserver.ThreadingMixIn, WSGIServer):
        address_family = family
        daemon_threads = True

    return _Server


def _app(registry: CollectorRegistry, logs: LogFiles, guard: LogGuard | None):
    metrics_app = make_wsgi_app(registry)

    def app(environ, start_response):
        path = environ.get("PATH_INFO") or "/"
        if path != "/logs" and not path.startswith("/logs/"):
            return metrics_app(environ, start_response)
        query = environ.get("QUERY_STRING") or ""
        header = environ.get("HTTP_" + HEADER.upper())
        refused = (
            "no key to check requests with"
            if guard is None
            else guard.refusal(environ.get("REQUEST_METHOD") or "GET", path + (f"?{query}" if query else ""), header)
        )
        if refused is not None:
            body = json.dumps({"errors": [refused]}).encode()
            start_response("403 Forbidden", _headers(body, "application/json"))
            return [body]
        assert guard is not None  # refused otherwise
        status, body, content_type = _logs_answer(path, query, logs)
        start_response(
            status,
            _headers(body, content_type) + [(ANSWER_HEADER, guard.sign_answer(header, int(status.split()[0]), body))],
        )
        return [body]

    return app


def _headers(body: bytes, content_type: str) -> list[tuple[str, str]]:
    return [("Content-Type", content_type), ("Content-Length", str(len(body))), ("Cache-Control", "no-store")]


def _logs_answer(path: str, query_string: str, logs: LogFiles) -> tuple[str, bytes, str]:
    """(status, body, content type) of an admitted request for the log listing or a file."""

    def error(status: str, message: str) -> tuple[str, bytes, str]:
        return status, json.dumps({"errors": [message]}).encode(), "application/json"

    if path == "/logs" or path == "/logs/":
        return "200 OK", json.dumps({"logs": logs.listing(), "main": logs.main_name}).encode(), "application/json"
    name = unquote(path[len("/logs/") :])
    try:
        tail = log_files.parse_tail(next(iter(parse_qs(query_string).get("tail") or []), None))
    except ValueError as exc:
        return error("400 Bad Request", str(exc))
    if not log_files.valid_name(name):
        return error("400 Bad Request", f"not a log file name: {name[:80]!r}")
    found = logs.path_of(name)
    if found is None:
        return error("404 Not Found", f"no log file {name!r} here")
    try:
        data = log_files.read_tail(found, tail)
    except OSError as exc:
        return error("404 Not Found", f"log file {name!r} cannot be read: {exc}")
    return "200 OK", data, "text/plain; charset=utf-8"


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
        errors = GaugeMetricFamily(
            name("scrape_errors"), "failed metric queries since start, by source", labels=["source"]
        )
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
    length = GaugeMetricFamily(
        name("stream_length"), "entries in the stream (capped by stream_maxlen)", labels=["stream"]
    )
    lag = GaugeMetricFamily(
        name("stream_group_lag"),
        "entries of the stream not yet delivered to the consumer group",
        labels=["stream", "group"],
    )
    pending = GaugeMetricFamily(
        name("stream_group_pending"),
        "entries delivered to the consumer group but not acknowledged",
        labels=["stream", "group"],
    )
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
