"""What a running driver reports besides its state: a Progress event per committed micro-batch
(rows, rates, the sources' backlog, the Spark UI link) and the text of a failure."""

from __future__ import annotations

import json
import traceback
from collections.abc import Callable
from typing import Any

from shared.task_protocol import Progress

from .driver_io import EventWriter, PhaseLog


class ProgressReporter:
    """Emits a Progress per batch committed since the last one it reported."""

    def __init__(self, events: EventWriter, phases: PhaseLog, spark_ui: str | None,
                 on_first_batch: Callable[[], None]) -> None:
        self.events = events
        self.phases = phases
        self.spark_ui = spark_ui
        self.on_first_batch = on_first_batch
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
                    self.on_first_batch()
                self.last = p.batchId
                self.events.emit(Progress(
                    batch_id=p.batchId,
                    num_input_rows=int(p.numInputRows or 0),
                    input_rows_per_second=finite(p.inputRowsPerSecond),
                    processed_rows_per_second=finite(p.processedRowsPerSecond),
                    batch_duration_ms=int(p.batchDuration) if p.batchDuration is not None else None,
                    source_lag=source_lag(p),
                    spark_ui=self.spark_ui,
                ))


def ui_url(spark: Any) -> str | None:
    try:
        return spark.sparkContext.uiWebUrl or None
    except Exception:  # noqa: BLE001 - a link for the dashboard, never worth failing a task
        return None


def source_lag(progress: Any) -> float | None:
    """The largest backlog any source of the batch reports, or None: Kafka's metric
    maxOffsetsBehindLatest, or the entries a Redis stream source counted beyond its batch (in the
    latest offset it reports, see connectors/redis_streams.py)."""
    lags = []
    for source in getattr(progress, "sources", None) or ():
        metrics = getattr(source, "metrics", None) or {}
        raw = metrics.get("maxOffsetsBehindLatest")
        if raw is None:
            raw = reported_behind(getattr(source, "latestOffset", None))
        try:
            if raw is not None:
                lags.append(float(raw))
        except (TypeError, ValueError):
            continue
    return max(lags) if lags else None


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
    (for a failed streaming query it holds the worker's Python traceback)."""
    text = "".join(traceback.format_exception(e))
    desc = getattr(e, "desc", None) or getattr(e, "_desc", None)
    if desc and str(desc) not in text:
        text += "\n" + str(desc)
    return text


