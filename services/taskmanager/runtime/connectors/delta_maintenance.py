"""Keeping a streaming Delta table healthy: OPTIMIZE (compaction) and VACUUM (clean-up), run by
the sink between micro-batches in the driver, so the job never stops for them.

Streaming writes at least one small file per partition per micro-batch; readers pay for every
file. OPTIMIZE rewrites them into few large ones (a commit that changes no data, so downstream
streaming readers and the sink's undo ignore it). The files it replaced stay on disk, still part
of older versions, until VACUUM deletes those removed longer ago than its retention.

Configured per sink (`options`) or for every Delta sink of a job (its configuration, so per
deployment), the sink's option winning:

    optimize.every     / sink.delta.optimize.every       compact after every N micro-batches
    optimize.interval  / sink.delta.optimize.interval    ... or when this long has passed ("10 min")
    vacuum.every       / sink.delta.vacuum.every         clean up after every N micro-batches
    vacuum.interval    / sink.delta.vacuum.interval      ... or when this long has passed
    vacuum.retention   / sink.delta.vacuum.retention     keep removed files this long (default
                                                         "7 d", Delta's own default)
    logCheckpoint.every / sink.delta.logCheckpoint.every checkpoint the table's Delta log with
                                                         delta-rs after every N commits (default
                                                         10; 0: inside them, as Delta does;
                                                         delta_log_checkpoint.py)

OPTIMIZE and VACUUM are off by default. Each run is a line in the driver's log (what it did, how
long it took), a waiting reason on the attempt while it runs, and a commit tagged with the sink in
the table's history. A failed run is logged and tried again at the next due batch: maintenance never
fails the task.

Retention never deletes what a snapshot still needs. Every checkpoint and savepoint the sink
takes part in pins the version it recorded (`_headrace/pins-<app id>.json` beside the table;
Delta skips `_`-prefixed names): while the snapshot's directory exists (the JobManager deletes
checkpoints beyond `state.checkpoints.num-retained`; savepoints stay until disposed of), VACUUM
keeps every file removed after that version was committed, whatever the configured retention.
A retention below Delta's 7 days is allowed when configured so (Delta's own check is turned off
for that command only); readers running longer than it may then miss files.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from shared import job_options

from . import delta_log
from .delta_log_checkpoint import DEFAULT_EVERY

OPTION_KEYS = (
    "optimize.every",
    "optimize.interval",
    "vacuum.every",
    "vacuum.interval",
    "vacuum.retention",
    "logCheckpoint.every",
)
JOB_PREFIX = "sink.delta."
DELTA_MIN_RETENTION_S = 7 * 86400.0
RETENTION_CHECK_CONF = "spark.databricks.delta.retentionDurationCheck.enabled"
PIN_GRACE_S = 3600.0  # a pin younger than this holds even before its snapshot's directory appears
PINS_DIR = "_headrace"


@dataclass(frozen=True)
class Policy:
    optimize_every: int = 0
    optimize_interval_s: float = 0.0
    vacuum_every: int = 0
    vacuum_interval_s: float = 0.0
    vacuum_retention_s: float = DELTA_MIN_RETENTION_S
    log_checkpoint_every: int = DEFAULT_EVERY

    @property
    def any(self) -> bool:
        return bool(self.optimize_every or self.optimize_interval_s or self.vacuum_every or self.vacuum_interval_s)

    @classmethod
    def read(cls, options: Mapping[str, Any], job_config: Mapping[str, Any]) -> "Policy":
        """From the sink's options, else the job's configuration; ValueError naming a bad one."""

        def value(key: str) -> Any:
            return options[key] if key in options else job_config.get(JOB_PREFIX + key)

        def count(key: str, default: int = 0, unit: str = "micro-batches (0: never)") -> int:
            raw = value(key)
            try:
                n = int(raw) if raw is not None else default
            except (TypeError, ValueError):
                n = -1
            if n < 0:
                raise ValueError(
                    f"Delta sink option {key} (or job option {JOB_PREFIX}{key}) must be a whole number "
                    f"of {unit}, got {raw!r}"
                )
            return n

        def duration(key: str, default: float) -> float:
            raw = value(key)
            if raw is None:
                return default
            try:
                return job_options.duration_s(raw)
            except ValueError:
                raise ValueError(
                    f"Delta sink option {key} (or job option {JOB_PREFIX}{key}) must be a duration "
                    f'such as "10 min" or "7 d", got {raw!r}'
                ) from None

        return cls(
            optimize_every=count("optimize.every"),
            optimize_interval_s=duration("optimize.interval", 0.0),
            vacuum_every=count("vacuum.every"),
            vacuum_interval_s=duration("vacuum.interval", 0.0),
            vacuum_retention_s=duration("vacuum.retention", DELTA_MIN_RETENTION_S),
            log_checkpoint_every=count("logCheckpoint.every", DEFAULT_EVERY, "commits (0: inside them, as Delta does)"),
        )


class Pins:
    """The versions the snapshots of one sink need, kept beside the table."""

    def __init__(self, path: str, app_id: str):
        self.dir = Path(path) / PINS_DIR
        self.file = self.dir / f"pins-{app_id}.json"
        self._lock = threading.Lock()

    def add(self, snapshot: str, version: int, committed_ms: int, now_ms: int | None = None) -> None:
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        with self._lock:
            pins = [p for p in self._read(self.file) if _live(p, now_ms)]
            pins.append({"snapshot": snapshot, "version": version, "committed_ms": committed_ms, "pinned_ms": now_ms})
            self.dir.mkdir(exist_ok=True)
            tmp = self.file.with_name(f".{self.file.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(pins))
            os.replace(tmp, self.file)

    def oldest_needed_ms(self, now_ms: int) -> int | None:
        """When the oldest version a live snapshot (of any sink of the table) needs was committed."""
        times = [
            int(p["committed_ms"]) for f in self.dir.glob("pins-*.json") for p in self._read(f) if _live(p, now_ms)
        ]
        return min(times) if times else None

    @staticmethod
    def _read(file: Path) -> list[dict]:
        try:
            data = json.loads(file.read_text())
        except (FileNotFoundError, ValueError):
            return []
        return data if isinstance(data, list) else []


def _live(pin: dict, now_ms: int) -> bool:
    if now_ms - int(pin.get("pinned_ms", 0)) < PIN_GRACE_S * 1000:
        return True
    return (Path(str(pin.get("snapshot", ""))) / "_metadata").exists()


class Maintenance:
    """Runs a policy for one sink (module docstring)."""

    def __init__(
        self,
        path: str,
        app_id: str,
        policy: Policy,
        pins: Pins,
        on_wait: Callable[[str | None], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.path, self.app_id, self.policy, self.pins = path, app_id, policy, pins
        self.on_wait, self.clock = on_wait, clock
        self.batches = 0
        self._last = {"optimize": clock(), "vacuum": clock()}
        self._since = {"optimize": 0, "vacuum": 0}

    def after_batch(self, spark: Any, batch_id: int) -> None:
        if not self.policy.any:
            return
        for kind, every, interval in (
            ("optimize", self.policy.optimize_every, self.policy.optimize_interval_s),
            ("vacuum", self.policy.vacuum_every, self.policy.vacuum_interval_s),
        ):
            self._since[kind] += 1
            due = (every and self._since[kind] >= every) or (interval and self.clock() - self._last[kind] >= interval)
            if due:
                self._since[kind], self._last[kind] = 0, self.clock()
                self._run(spark, kind, batch_id)

    def retention_s(self, now_ms: int | None = None) -> float:
        """The configured retention, longer when a live snapshot needs an older version."""
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        oldest = self.pins.oldest_needed_ms(now_ms)
        needed = (now_ms - oldest) / 1000 + PIN_GRACE_S if oldest is not None else 0.0
        return max(self.policy.vacuum_retention_s, needed)

    def _run(self, spark: Any, kind: str, batch_id: int) -> None:
        started = time.monotonic()
        what = f"{kind.upper()} of the Delta table {self.path} after batch {batch_id}"
        if self.on_wait is not None:
            self.on_wait(f"running {what}")
        try:
            with delta_log.tagged(spark, delta_log.tag(self.app_id, f"{kind} after batch {batch_id}")):
                done = self._optimize(spark) if kind == "optimize" else self._vacuum(spark)
            print(f"delta: {what}: {done} in {time.monotonic() - started:.1f} s", flush=True)
        except Exception as exc:  # noqa: BLE001 - maintenance never fails the task; the next due batch tries again
            print(
                f"delta: {what} failed after {time.monotonic() - started:.1f} s, tried again later: "
                f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300]}",
                file=sys.stderr,
                flush=True,
            )
        finally:
            if self.on_wait is not None:
                self.on_wait(None)

    def _optimize(self, spark: Any) -> str:
        rows = spark.sql(f"OPTIMIZE {delta_log.quoted(self.path)}").collect()
        metrics = rows[0]["metrics"].asDict() if rows else {}
        return f"{metrics.get('numFilesRemoved', 0)} files compacted into {metrics.get('numFilesAdded', 0)}"

    def _vacuum(self, spark: Any) -> str:
        retention = self.retention_s()
        hours = retention / 3600
        before = _data_files(self.path)
        relax = retention < DELTA_MIN_RETENTION_S
        previous = spark.conf.get(RETENTION_CHECK_CONF, None)
        if relax:  # configured below Delta's own minimum: allowed for this command only
            spark.conf.set(RETENTION_CHECK_CONF, "false")
        try:
            spark.sql(f"VACUUM {delta_log.quoted(self.path)} RETAIN {hours:.4f} HOURS").collect()
        finally:
            if relax:
                if previous is None:
                    spark.conf.unset(RETENTION_CHECK_CONF)
                else:
                    spark.conf.set(RETENTION_CHECK_CONF, previous)
        return f"{before - _data_files(self.path)} files deleted (retention {hours:.2f} h)"


def _data_files(path: str) -> int:
    """Data files on disk (Delta's log and `_`/`.`-prefixed names aside)."""
    count = 0
    for _root, dirs, files in os.walk(path):
        dirs[:] = [d for d in dirs if not d.startswith(("_", "."))]
        count += sum(1 for f in files if not f.startswith(("_", ".")))
    return count
