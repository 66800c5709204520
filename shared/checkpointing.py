"""Checkpoint and savepoint configuration, with Flink's option names and (mostly) its defaults.

A job's `config` (the `flinkConfiguration` of its submission) may set any of these; what it
leaves out comes from the cluster default (`Settings.checkpointing`, a mapping with the same
keys), then from the defaults below:

  execution.checkpointing.interval                  periodic checkpoints; absent or 0: none
  execution.checkpointing.timeout                   10 min: a pending checkpoint older fails
  execution.checkpointing.min-pause                 0: pause after a completed one
  execution.checkpointing.max-concurrent-checkpoints 1
  execution.checkpointing.tolerable-failed-checkpoints 0: consecutive failures before failover
  state.checkpoints.num-retained                    3 completed checkpoints kept
  execution.checkpointing.externalized-checkpoint-retention
                                                    RETAIN_ON_CANCELLATION (kept when the job is
                                                    cancelled) | DELETE_ON_CANCELLATION
                                                    (NO_EXTERNALIZED_CHECKPOINTS is read as DELETE)
  state.savepoints.dir                              default target of savepoints
  execution.savepoint.path                          restore the first attempt from this snapshot
  execution.savepoint.ignore-unclaimed-state        allowNonRestoredState
  execution.savepoint-restore-mode                  NO_CLAIM (default) | CLAIM

Durations are read as Flink reads them (shared/durations.py, parse_flink_duration): strings like
"500 ms", "10 s", "2 min", and a string without a unit is milliseconds ("10000" is 10 s); a JSON
number other than 0 is refused as ambiguous. Everything here is pure: the dispatcher validates a
submission with it and the JobManager reads it back.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal, Mapping

from shared.booleans import parse_boolean
from shared.durations import InvalidDuration, flink_text, parse_flink_duration
from shared.errors import ConfigError

INTERVAL = "execution.checkpointing.interval"
TIMEOUT = "execution.checkpointing.timeout"
MIN_PAUSE = "execution.checkpointing.min-pause"
MAX_CONCURRENT = "execution.checkpointing.max-concurrent-checkpoints"
TOLERABLE = "execution.checkpointing.tolerable-failed-checkpoints"
NUM_RETAINED = "state.checkpoints.num-retained"
RETENTION = "execution.checkpointing.externalized-checkpoint-retention"
SAVEPOINT_DIR = "state.savepoints.dir"
RESTORE_PATH = "execution.savepoint.path"
ALLOW_NON_RESTORED = "execution.savepoint.ignore-unclaimed-state"
RESTORE_MODE = "execution.savepoint-restore-mode"

KEYS = (
    INTERVAL,
    TIMEOUT,
    MIN_PAUSE,
    MAX_CONCURRENT,
    TOLERABLE,
    NUM_RETAINED,
    RETENTION,
    SAVEPOINT_DIR,
    RESTORE_PATH,
    ALLOW_NON_RESTORED,
    RESTORE_MODE,
)

Retention = Literal["RETAIN_ON_CANCELLATION", "DELETE_ON_CANCELLATION"]
RestoreMode = Literal["NO_CLAIM", "CLAIM"]


class InvalidCheckpointConfig(ConfigError, ValueError):
    """A checkpoint option with a value we cannot use; `field` is the option's name."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


@dataclass(frozen=True)
class CheckpointConfig:
    interval_s: float | None = None  # None: no periodic checkpoints (savepoints still work)
    timeout_s: float = 600.0
    min_pause_s: float = 0.0
    max_concurrent: int = 1
    tolerable_failures: int = 0
    num_retained: int = 3
    retention: Retention = "RETAIN_ON_CANCELLATION"
    savepoint_dir: str | None = None
    restore_path: str | None = None
    allow_non_restored_state: bool = False
    restore_mode: RestoreMode = "NO_CLAIM"

    @property
    def periodic(self) -> bool:
        return self.interval_s is not None

    def as_flink(self) -> dict[str, Any]:
        """The effective options, keyed and written as Flink writes them ("10 s"), so that each
        reads back the same in a job's configuration (for GET /jobs/{id}/checkpoints/config)."""
        return {
            INTERVAL: flink_text(self.interval_s) if self.interval_s is not None else None,
            TIMEOUT: flink_text(self.timeout_s),
            MIN_PAUSE: flink_text(self.min_pause_s),
            MAX_CONCURRENT: self.max_concurrent,
            TOLERABLE: self.tolerable_failures,
            NUM_RETAINED: self.num_retained,
            RETENTION: self.retention,
            SAVEPOINT_DIR: self.savepoint_dir,
        }


def _duration(raw: Any, key: str) -> float:
    try:
        return parse_flink_duration(raw)
    except InvalidDuration as exc:
        raise InvalidCheckpointConfig(key, str(exc).split(": ", 1)[-1]) from None


def _int(raw: Any, key: str, minimum: int) -> int:
    if isinstance(raw, str) and raw.strip().lstrip("-").isdigit():
        raw = int(raw.strip())
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < minimum:
        raise InvalidCheckpointConfig(key, f"expected an integer >= {minimum}, got {raw!r}")
    return raw


def _bool(raw: Any, key: str) -> bool:
    try:
        return parse_boolean(raw)
    except ValueError:
        raise InvalidCheckpointConfig(key, f"expected true or false, got {raw!r}") from None


def _path(raw: Any, key: str) -> str:
    if not isinstance(raw, str) or not raw.strip():
        raise InvalidCheckpointConfig(key, f"expected a directory path or file:// URI, got {raw!r}")
    try:
        return to_local_path(raw)
    except ValueError as exc:
        raise InvalidCheckpointConfig(key, str(exc)) from None


def to_local_path(raw: str) -> str:
    """Plain paths and `file://` URIs name the same directory; other schemes are refused with a
    message, since checkpoint storage here is a (shared) filesystem."""
    raw = raw.strip()
    if raw.startswith("file://"):
        rest = raw[len("file://") :]
        # file:///a/b (empty authority) and file://localhost/a/b
        if rest.startswith("localhost/"):
            rest = rest[len("localhost") :]
        if not rest.startswith("/"):
            raise ValueError(f"{raw!r} is not an absolute file:// URI (expected file:///path)")
        return rest
    if raw.startswith("file:/"):  # Flink prints locations as file:/a/b
        return raw[len("file:") :]
    scheme_match = re.match(r"^([A-Za-z][A-Za-z0-9+.-]*)://", raw)
    if scheme_match:
        scheme = scheme_match.group(1)
        raise ValueError(
            f"scheme {scheme!r} is not supported: use a path every TaskManager can reach "
            "(a shared filesystem), or file:///path"
        )
    if "\x00" in raw:
        raise ValueError("a path cannot contain NUL bytes")
    return raw


def checkpoint_config(
    job_config: Mapping[str, Any] | None,
    cluster_default: Mapping[str, Any] | None = None,
    *,
    savepoint_dir: str | None = None,
) -> CheckpointConfig:
    """The effective configuration of one job. Raises InvalidCheckpointConfig naming the option."""
    merged: dict[str, Any] = {**(cluster_default or {}), **(job_config or {})}
    kw: dict[str, Any] = {}
    raw = merged.get(INTERVAL)
    if raw is not None and str(raw).strip().lower() not in ("", "0", "none", "disabled", "off"):
        interval = _duration(raw, INTERVAL)
        if interval > 0:
            if interval < 0.1:
                raise InvalidCheckpointConfig(INTERVAL, f"must be at least 100 ms, got {raw!r}")
            kw["interval_s"] = interval
    if merged.get(TIMEOUT) is not None:
        kw["timeout_s"] = _duration(merged[TIMEOUT], TIMEOUT)
        if kw["timeout_s"] <= 0:
            raise InvalidCheckpointConfig(TIMEOUT, "must be greater than 0")
    if merged.get(MIN_PAUSE) is not None:
        kw["min_pause_s"] = _duration(merged[MIN_PAUSE], MIN_PAUSE)
    if merged.get(MAX_CONCURRENT) is not None:
        kw["max_concurrent"] = _int(merged[MAX_CONCURRENT], MAX_CONCURRENT, 1)
    if merged.get(TOLERABLE) is not None:
        kw["tolerable_failures"] = _int(merged[TOLERABLE], TOLERABLE, 0)
    if merged.get(NUM_RETAINED) is not None:
        kw["num_retained"] = _int(merged[NUM_RETAINED], NUM_RETAINED, 1)
    if merged.get(RETENTION) is not None:
        value = str(merged[RETENTION]).strip().upper()
        if value == "NO_EXTERNALIZED_CHECKPOINTS":
            value = "DELETE_ON_CANCELLATION"
        if value not in ("RETAIN_ON_CANCELLATION", "DELETE_ON_CANCELLATION"):
            raise InvalidCheckpointConfig(
                RETENTION, f"expected RETAIN_ON_CANCELLATION or DELETE_ON_CANCELLATION, got {merged[RETENTION]!r}"
            )
        kw["retention"] = value
    sp_dir = merged.get(SAVEPOINT_DIR) or savepoint_dir
    if sp_dir:
        kw["savepoint_dir"] = _path(str(sp_dir), SAVEPOINT_DIR)
    if merged.get(RESTORE_PATH):
        kw["restore_path"] = _path(merged[RESTORE_PATH], RESTORE_PATH)
    if merged.get(ALLOW_NON_RESTORED) is not None:
        kw["allow_non_restored_state"] = _bool(merged[ALLOW_NON_RESTORED], ALLOW_NON_RESTORED)
    if merged.get(RESTORE_MODE) is not None:
        mode = str(merged[RESTORE_MODE]).strip().upper()
        if mode == "LEGACY":
            mode = "NO_CLAIM"  # Flink's deprecated mode; we never share files with the snapshot
        if mode not in ("NO_CLAIM", "CLAIM"):
            raise InvalidCheckpointConfig(RESTORE_MODE, f"expected NO_CLAIM or CLAIM, got {merged[RESTORE_MODE]!r}")
        kw["restore_mode"] = mode
    return CheckpointConfig(**kw)
