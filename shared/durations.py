"""Durations as every service reads them: the one parser, its units and its bounds.

A duration is seconds as a number (`10`, `2.5`), a string of such a number (`"10"`: a job's
configuration often arrives as strings), or a number with a unit in Flink's spellings
(TimeUtils.parseDuration): `"500 ms"`, `"10s"`, `"10 sec"`, `"1 min"`, `"2 h"`, `"1 d"`, any
letter case, a space or none between number and unit. One departure from Flink: a string
without a unit is seconds, as a JSON number is here, where Flink reads it as milliseconds.

The dispatcher (REST bodies, job options), the JobManager (restart strategies, slot request
timeout, checkpoint options) and the TaskManagers (no-op tasks, start-up timeout) all read
durations through `parse_duration`, so a value accepted at submission means the same everywhere.
"""

from __future__ import annotations

import math
import re
from typing import Any

from shared.errors import ConfigError

# Durations end in timers, whose waits Python refuses above threading.TIMEOUT_MAX (~292 years);
# Flink's are Java longs of milliseconds. A century is beyond any real setting.
MAX_DURATION_S = 100 * 365 * 86400.0


def _labels(seconds: float, *singular: str, plural: tuple[str, ...] = ()) -> dict[str, float]:
    """Flink's labels of one unit: the singular ones as written, the plural ones also with "s"."""
    out = {label: seconds for label in singular}
    out.update({label: seconds for name in plural for label in (name, name + "s")})
    return out


# Flink's labels (TimeUtils.TimeUnit), plus "mins" and "m", which Headrace accepted before.
UNITS: dict[str, float] = {
    **_labels(86400.0, "d", plural=("day",)),
    **_labels(3600.0, "h", plural=("hour",)),
    **_labels(60.0, "min", "m", "mins", plural=("minute",)),
    **_labels(1.0, "s", plural=("sec", "second")),
    **_labels(1e-3, "ms", plural=("milli", "millisecond")),
    **_labels(1e-6, "µs", "us", plural=("micro", "microsecond")),
    **_labels(1e-9, "ns", plural=("nano", "nanosecond")),
}

EXPECTED = 'seconds as a number, or a duration string such as "10 s", "500 ms" or "2 min"'

_TEXT = re.compile(r"\s*(\d{1,30}(?:\.\d{1,30})?)\s*([^\W\d_]*)\s*")


class InvalidDuration(ConfigError, ValueError):
    """A value that is not a duration Headrace can wait for."""

    def __init__(self, value: Any, reason: str = "not a duration"):
        super().__init__(f"{reason}: expected {EXPECTED}, got {_show(value)}")
        self.value, self.reason = value, reason


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def parse_duration(value: Any) -> float:
    """Seconds from a number or a duration string; at least 0 and at most MAX_DURATION_S.
    Raises InvalidDuration (a ValueError) for anything else."""
    seconds: float | None = None
    if isinstance(value, bool):
        seconds = None
    elif isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str):
        match = _TEXT.fullmatch(value)
        if match is not None:
            unit = match.group(2).lower()
            factor = UNITS.get(unit) if unit else 1.0
            if factor is not None:
                seconds = float(match.group(1)) * factor
    if seconds is None:
        raise InvalidDuration(value)
    if not math.isfinite(seconds) or not 0 <= seconds <= MAX_DURATION_S:
        raise InvalidDuration(value, "out of range (0 to 100 years)")
    return seconds
