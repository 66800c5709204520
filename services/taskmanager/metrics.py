"""A TaskManager process's metrics: its slots, warm drivers and inbox, and per running task the
numbers of its newest micro-batch (Spark's StreamingQueryProgress, as the driver reports it).

Per-task series carry the labels job and execution and are dropped when the task ends, so a
long-lived TaskManager does not accumulate one series per attempt it ever ran.

The same numbers go to Redis too (`streams.progress_key`, a hash per attempt expiring
PROGRESS_TTL_S after its newest report), where the dispatcher reads them for the dashboard's live
charts (GET /jobs/{id}/progress) without scraping every TaskManager, with the last ten minutes of
them (`streams.progress_history_key`, GET /jobs/{id}/progress/history) so a chart opened late
starts full."""

from __future__ import annotations

import json
import logging
import threading
import time
from urllib.parse import urlsplit, urlunsplit

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import GaugeMetricFamily

from services.taskmanager.memory import task_memory
from shared import metrics, streams

TASK_LABELS = ("taskmanager", "job", "execution")
# The figures of a history point (streams.progress_history_key): the hash's, without the ids.
HISTORY_FIELDS = (
    "batch_id",
    "input_rows_per_second",
    "processed_rows_per_second",
    "num_input_rows",
    "timestamp",
    "batch_duration_ms",
    "source_lag",
    "source_partitions",
)
PARTITION_LABELS = (*TASK_LABELS, "topic", "partition")
log = logging.getLogger("headrace.taskmanager.metrics")


def rehost(url: str | None, host: str | None) -> str | None:
    """The driver's Spark UI URL with the host others reach this TaskManager by (the driver
    binds its UI where Spark chooses, and names it by a host only this machine may resolve)."""
    if not url or not host:
        return url or None
    parts = urlsplit(url)
    netloc = f"[{host}]" if ":" in host else host
    if parts.port:
        netloc += f":{parts.port}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


class TaskMetrics:
    def __init__(
        self, redis_client=None, *, advertised_host: str | None = None, clock_ms=lambda: int(time.time() * 1000)
    ) -> None:
        self.redis, self.advertised_host, self.clock_ms = redis_client, advertised_host, clock_ms
        self.registry = CollectorRegistry(auto_describe=True)
        r, n = self.registry, metrics.name
        self._lock = threading.Lock()
        self._live: set[tuple[str, str, str]] = set()
        self._history_at: dict[str, int] = {}  # execution id -> when its newest history point was written (ms)
        self.batch_id = Gauge(
            n("task_last_batch_id"), "id of the task's newest completed micro-batch", TASK_LABELS, registry=r
        )
        self.batch_duration = Gauge(
            n("task_batch_duration_seconds"), "duration of the newest micro-batch", TASK_LABELS, registry=r
        )
        self.input_rate = Gauge(
            n("task_input_rows_per_second"),
            "rows per second arriving at the sources (Spark's inputRowsPerSecond)",
            TASK_LABELS,
            registry=r,
        )
        self.processed_rate = Gauge(
            n("task_processed_rows_per_second"),
            "rows per second processed (Spark's processedRowsPerSecond)",
            TASK_LABELS,
            registry=r,
        )
        self.source_lag = Gauge(
            n("task_source_lag"), "entries the sources hold beyond what the task read", TASK_LABELS, registry=r
        )
        self.input_rows = Counter(
            n("task_input_rows"), "rows read by the task's micro-batches", TASK_LABELS, registry=r
        )
        self.partition_lag = Gauge(
            n("task_source_partition_lag"),
            "records of a Kafka partition beyond what the task read (its consumer lag)",
            PARTITION_LABELS,
            registry=r,
        )
        self._partitions: dict[tuple[str, str, str], set[tuple[str, str]]] = {}
        self.sink_version = Gauge(
            n("task_sink_table_version"),
            "the table version the task's sink committed last (a Delta sink)",
            TASK_LABELS,
            registry=r,
        )
        self.sink_files = Counter(
            n("task_sink_files_added"),
            "data files the task's sink added to its table (a Delta sink; compaction's rewrites not counted)",
            TASK_LABELS,
            registry=r,
        )
        self._per_task = (
            self.batch_id,
            self.batch_duration,
            self.input_rate,
            self.processed_rate,
            self.source_lag,
            self.input_rows,
            self.sink_version,
            self.sink_files,
        )

    def progress(self, taskmanager_id: str, spec, event) -> None:
        """Record one driver Progress event (shared/task_protocol.py)."""
        key = (taskmanager_id, spec.job_id, spec.execution_id)
        with self._lock:
            self._live.add(key)
            self.batch_id.labels(*key).set(event.batch_id)
            self.input_rate.labels(*key).set(event.input_rows_per_second)
            self.processed_rate.labels(*key).set(event.processed_rows_per_second)
            self.input_rows.labels(*key).inc(max(0, event.num_input_rows))
            # Newer drivers report these; until then the series stay absent rather than 0.
            duration_ms = getattr(event, "batch_duration_ms", None)
            if duration_ms is not None:
                self.batch_duration.labels(*key).set(duration_ms / 1000)
            lag = getattr(event, "source_lag", None)
            if lag is not None:
                self.source_lag.labels(*key).set(lag)
            self._partition_lags(key, getattr(event, "partition_lag", None) or {})
            sink = getattr(event, "sink_commit", None) or {}
            if "version" in sink:
                self.sink_version.labels(*key).set(sink["version"])
                self.sink_files.labels(*key).inc(max(0, int(sink.get("files_added", 0))))
        self._publish(taskmanager_id, spec, event)

    def _partition_lags(self, key: tuple[str, str, str], lags: dict[str, int]) -> None:
        """One series per Kafka partition; a partition no longer read loses its series."""
        now = {tuple(name.rsplit("/", 1)) for name in lags if "/" in name}
        for gone in self._partitions.get(key, set()) - now:
            try:
                self.partition_lag.remove(*key, *gone)
            except KeyError:
                pass
        for name, lag in lags.items():
            if "/" in name:
                self.partition_lag.labels(*key, *name.rsplit("/", 1)).set(lag)
        self._partitions[key] = now  # type: ignore[assignment]

    def _publish(self, taskmanager_id: str, spec, event) -> None:
        """The newest figures of this attempt for the dashboard; best effort (Redis away: the
        Prometheus series above still have them)."""
        if self.redis is None:
            return
        fields = {
            "job_id": spec.job_id,
            "vertex_id": spec.vertex_id,
            "execution_id": spec.execution_id,
            "attempt": spec.attempt,
            "taskmanager_id": taskmanager_id,
            "batch_id": event.batch_id,
            "input_rows_per_second": event.input_rows_per_second,
            "processed_rows_per_second": event.processed_rows_per_second,
            "num_input_rows": event.num_input_rows,
            "timestamp": self.clock_ms(),
        }
        partitions = getattr(event, "partition_lag", None)
        optional = {
            "batch_duration_ms": getattr(event, "batch_duration_ms", None),
            "source_lag": getattr(event, "source_lag", None),
            "partition_lag": json.dumps(partitions, sort_keys=True) if partitions else None,
            "source_partitions": len(partitions) if partitions else None,
            "sink_version": (getattr(event, "sink_commit", None) or {}).get("version"),
            "spark_ui": rehost(getattr(event, "spark_ui", None), self.advertised_host),
        }
        fields.update({k: v for k, v in optional.items() if v is not None})
        key = streams.progress_key(taskmanager_id, spec.execution_id)
        try:
            pipe = self.redis.pipeline(transaction=True)
            # Replaced whole: a figure the newest batch lacks (lag) must not show an old value.
            pipe.delete(key)
            pipe.hset(key, mapping={k: str(v) for k, v in fields.items()})
            pipe.expire(key, streams.PROGRESS_TTL_S)
            self._add_to_history(pipe, taskmanager_id, spec.execution_id, fields)
            pipe.execute()
        except Exception as exc:  # noqa: BLE001 - figures are best effort, the task is not
            log.debug("could not publish the progress of %s: %s", spec.execution_id, exc)

    def _add_to_history(self, pipe, taskmanager_id: str, execution_id: str, fields: dict) -> None:
        """A point of the attempt's recent history (streams.progress_history_key), at most one
        per PROGRESS_HISTORY_STEP_MS: a task with 10 batches a second keeps 10 minutes too."""
        now = int(fields["timestamp"])
        with self._lock:
            if now - self._history_at.get(execution_id, -(1 << 62)) < streams.PROGRESS_HISTORY_STEP_MS:
                return
            self._history_at[execution_id] = now
        key = streams.progress_history_key(taskmanager_id, execution_id)
        point = {k: str(v) for k, v in fields.items() if k in HISTORY_FIELDS}
        # Ids are the batch times (ms), so the history is read by time on any host.
        pipe.xadd(key, point, id=f"{now}-*", maxlen=streams.PROGRESS_HISTORY_POINTS, approximate=False)
        pipe.xtrim(key, minid=now - streams.PROGRESS_HISTORY_S * 1000, approximate=False)
        pipe.expire(key, streams.PROGRESS_HISTORY_S)

    def forget(self, taskmanager_id: str, spec) -> None:
        key = (taskmanager_id, spec.job_id, spec.execution_id)
        with self._lock:
            # Its history stays until it expires: a chart opened after a failure shows what led to it.
            self._history_at.pop(spec.execution_id, None)
        if self.redis is not None:
            try:
                self.redis.delete(streams.progress_key(taskmanager_id, spec.execution_id))
            except Exception:  # noqa: BLE001 - it expires anyway
                pass
        with self._lock:
            if key not in self._live:
                return
            self._live.discard(key)
            for metric in self._per_task:
                try:
                    metric.remove(*key)
                except KeyError:
                    pass  # that number was never reported for this task
            self._partition_lags(key, {})
            self._partitions.pop(key, None)


class TaskManagerCollector(metrics.CachedCollector):
    """Slots, warm drivers and the tasks' memory figures from the supervisors' memory, the inbox's
    consumer group from Redis."""

    def __init__(self, supervisors: dict, redis_client, **kw):
        super().__init__("taskmanager", **kw)
        self.supervisors, self.redis = supervisors, redis_client

    def gather(self):
        n = metrics.name
        slots = GaugeMetricFamily(n("taskmanager_slots"), "slots of this TaskManager", labels=["taskmanager"])
        free = GaugeMetricFamily(
            n("taskmanager_slots_free"), "slots of this TaskManager running no task", labels=["taskmanager"]
        )
        tasks = GaugeMetricFamily(
            n("taskmanager_tasks"), "tasks this TaskManager holds, by state", labels=["taskmanager", "state"]
        )
        warm = GaugeMetricFamily(
            n("taskmanager_warm_drivers"), "warm Spark drivers, ready or starting", labels=["taskmanager", "status"]
        )
        for tm, sup in self.supervisors.items():
            slots.add_metric([tm], len(sup.slots))
            free.add_metric([tm], sup.free_slots())
            by_state: dict[str, int] = {}
            for report in sup.running_reports():
                state = getattr(report.state, "value", str(report.state))
                by_state[state] = by_state.get(state, 0) + 1
            for state, count in sorted(by_state.items()):
                tasks.add_metric([tm, state], count)
            if sup.warm is not None:
                status = sup.warm.status()
                warm.add_metric([tm, "ready"], status.get("ready", 0))
                warm.add_metric([tm, "starting"], status.get("starting", 0))
        yield from (slots, free, tasks, warm)
        yield from self._memory()
        if self.redis is not None and len(self.supervisors) <= 16:  # simulated fleets: too many inboxes to ask
            yield from metrics.stream_group_families(self.redis, [streams.tm_inbox(tm) for tm in self.supervisors])

    def _memory(self):
        """Each task's latest memory figure and its limit, as its memory watch measured them
        (services/taskmanager/memory/task_memory.py): the figure the limit is compared with."""
        n = metrics.name
        used = GaugeMetricFamily(
            n("task_memory_bytes"),
            "the task's processes' memory as its limit is measured "
            "(label measure: PSS summed over its processes, or its cgroup's charge)",
            labels=[*TASK_LABELS, "measure"],
        )
        limit = GaugeMetricFamily(
            n("task_memory_limit_bytes"), "the task's memory limit (absent: none)", labels=list(TASK_LABELS)
        )
        for tm, sup in self.supervisors.items():
            for f in task_memory.figures(sup.task_drivers()):
                used.add_metric([tm, f.job_id, f.execution_id, f.measure], f.used)
                if f.limit is not None:
                    limit.add_metric([tm, f.job_id, f.execution_id], f.limit)
        yield from (used, limit)
