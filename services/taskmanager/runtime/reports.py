"""What a running driver reports besides its state: a Progress event per committed micro-batch
(rows, rates, the sources' backlog, the Spark UI link) and the text of a failure."""

from __future__ import annotations

import json
import re
import traceback
from collections.abc import Callable
from typing import Any

from shared.task_protocol import Progress

from .driver_io import EventWriter, PhaseLog


class ProgressReporter:
    """Emits a Progress per batch committed since the last one it reported."""

    def __init__(
        self,
        events: EventWriter,
        phases: PhaseLog,
        spark_ui: str | None,
        sink_figures: Callable[[int], dict[str, int] | None] | None = None,
    ) -> None:
        self.events = events
        self.sink_figures = sink_figures  # SinkHandle.commit_figures
        self.phases = phases
        self.spark_ui = spark_ui
        self.last = -1  # the newest batch id reported

    def report(self, query: Any, latest: Any) -> None:
        if latest is None or latest.batchId <= self.last:
            return
        # recentProgress parses up to 100 JSON reports: only worth it when batches were missed.
        batches = [latest] if latest.batchId == self.last + 1 else query.recentProgress
        for p in batches:
            if p.batchId > self.last:
                if self.last < 0:
                    self.phases.announce(f"first batch {p.batchId} committed: {json.dumps(p.durationMs)}")
                self.last = p.batchId
                self.events.emit(
                    Progress(
                        batch_id=p.batchId,
                        num_input_rows=int(p.numInputRows or 0),
                        input_rows_per_second=finite(p.inputRowsPerSecond),
                        processed_rows_per_second=finite(p.processedRowsPerSecond),
                        batch_duration_ms=int(p.batchDuration) if p.batchDuration is not None else None,
                        source_lag=source_lag(p),
                        partition_lag=partition_lag(p),
                        sink_commit=self.sink_figures(p.batchId) if self.sink_figures is not None else None,
                        spark_ui=self.spark_ui,
                    )
                )


def ui_url(spark: Any) -> str | None:
    try:
        return spark.sparkContext.uiWebUrl or None
    except Exception:  # noqa: BLE001 - a link for the dashboard, never worth failing a task
        return None


def source_lag(progress: Any) -> float | None:
    """The largest backlog any source of the batch reports, or None: a Kafka source's records
    between what the batch read and each partition's end, summed over its partitions, or the
    entries a Redis stream source counted beyond its batch (in the latest offset it reports, see
    connectors/redis_streams.py)."""
    lags = []
    for source in getattr(progress, "sources", None) or ():
        kafka = kafka_partition_lag(source)
        metrics = getattr(source, "metrics", None) or {}
        if kafka is not None:
            raw: Any = sum(kafka.values())
        else:
            raw = metrics.get("maxOffsetsBehindLatest")
        if raw is None:
            raw = reported_behind(getattr(source, "latestOffset", None))
        try:
            if raw is not None:
                lags.append(float(raw))
        except (TypeError, ValueError):
            continue
    return max(lags) if lags else None


def partition_lag(progress: Any) -> dict[str, int] | None:
    """Each Kafka partition's lag ("topic/partition" -> records) over the batch's sources, or None
    when no source is a Kafka source."""
    found: dict[str, int] = {}
    for source in getattr(progress, "sources", None) or ():
        found.update(kafka_partition_lag(source) or {})
    return found or None


def kafka_partition_lag(source: Any) -> dict[str, int] | None:
    """Records between a Kafka source's end offsets for the batch and the latest offsets Spark saw
    when it planned the batch, per partition; None for any other source (its offsets are not
    Kafka's {"topic": {"partition": offset}})."""
    if not str(getattr(source, "description", "")).startswith("Kafka"):
        return None
    end, latest = _offsets(getattr(source, "endOffset", None)), _offsets(getattr(source, "latestOffset", None))
    if end is None or latest is None:
        return None
    return {
        f"{topic}/{part}": max(0, int(latest[topic][part]) - int(offset))
        for topic, parts in end.items()
        for part, offset in parts.items()
        if part in latest.get(topic, {}) and int(offset) >= 0
    }


def _offsets(raw: Any) -> dict[str, dict[str, Any]] | None:
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except ValueError:
            return None
    if not isinstance(raw, dict) or not all(isinstance(v, dict) for v in raw.values()):
        return None
    return raw


def reported_behind(latest: Any) -> Any:
    from .connectors.redis_streams import BEHIND_KEY  # imported with Spark, as build_spark does

    if isinstance(latest, str):
        try:
            latest = json.loads(latest)
        except ValueError:
            return None
    return latest.get(BEHIND_KEY) if isinstance(latest, dict) else None


def finite(x: Any) -> float:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return 0.0
    return v if v == v and v not in (float("inf"), float("-inf")) else 0.0


def format_failure(e: BaseException) -> str:
    """The Python traceback of the failure; for Spark errors also the message Spark carries
    (for a failed streaming query it holds the worker's Python traceback). A failure Headrace
    recognises ends with a line that says it plainly (the line a summary of the cause shows)."""
    text = "".join(traceback.format_exception(e))
    desc = getattr(e, "desc", None) or getattr(e, "_desc", None)
    if desc and str(desc) not in text:
        text += "\n" + str(desc)
    plain = kafka_data_loss(text)
    return f"{text.rstrip()}\n{plain}" if plain else text


# What Spark's Kafka source says when records it must read are gone (failOnDataLoss).
_LOST_RANGE = re.compile(r"Could not read records in offset \[(\d+), (\d+)\) for topic partition (\S+)")
_OFFSET_CHANGED = re.compile(r"Partition (\S+)'s offset was changed from (\d+) to (\d+)")
_PARTITIONS_GONE = re.compile(r"(\S+) (?:is|are) gone")


def kafka_data_loss(text: str) -> str | None:
    """One line naming the Kafka partitions and offsets a failure says were lost, or None."""
    if "Some data may have been lost" not in text and "failOnDataLoss" not in text:
        return None
    lost = [f"{tp}, offsets {a} to {int(b) - 1}" for a, b, tp in _LOST_RANGE.findall(text)]
    lost += [f"{tp}, offsets {a} to {int(b) - 1}" for tp, a, b in _OFFSET_CHANGED.findall(text) if int(b) > int(a)]
    lost += [f"{tp}, every offset (the partition is gone)" for tp in _PARTITIONS_GONE.findall(text)]
    where = "; ".join(dict.fromkeys(lost)) or "see the trace above"
    return (
        f"KafkaDataLoss: Kafka records were lost before this query read them: {where} (retention removed "
        "them, or the topic was deleted and made again); the job cannot read them back. See "
        'docs/runbooks/kafka.md, "Data lost to retention"'
    )
