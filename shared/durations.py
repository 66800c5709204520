"""Durations as every service reads them: the one parser, its units and its bounds.

A duration with a unit is written in Flink's spellings (TimeUtils.parseDuration): `"500 ms"`,
`"10s"`, `"10 sec"`, `"1 min"`, `"2 h"`, `"1 d"`, any letter case, a space or none between
number and unit. A number without a unit is read by where it is written:

- `parse_flink_duration`, for the options of a job's configuration (`flinkConfiguration`:
  execution.checkpointing.*, restart-strategy.*, slot.request.timeout, and Headrace's own
  headrace.task.startup-timeout and sink.max-retry-time beside them) and the cluster's
  checkpointing defaults: as Flink reads its configuration, a string without a unit is
  milliseconds (`"10000"` is 10 s). A JSON number other than 0 is refused, naming both ways to
  write it: Headrace read it as seconds before, Flink as milliseconds, and a silent factor of
  1000 in a checkpoint interval or a timeout is worse than a 400.
- `parse_duration`, for Headrace's own fields (a REST body's `restartStrategy`, the cluster's
  `restart_strategy`, the no-op tasks' `noop.*` options): a number is seconds, as those fields
  are documented; a string needs a unit (`"10"` is refused, naming both ways to write it).

Settings whose name says the unit (`heartbeat_timeout_s`, `everySeconds`) are plain numbers and
never come here. The dispatcher (REST bodies, job options), the JobManager (restart strategies,
slot request timeout, checkpoint options) and the TaskManagers (no-op tasks, start-up timeout)
all read durations through this module, so a value accepted at submission means the same
everywhere.
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
FLINK_EXPECTED = 'a duration string such as "10 s", "500 ms" or "2 min"; without a unit, milliseconds as in Flink'

_TEXT = re.compile(r"\s*(\d{1,30}(?:\.\d{1,30})?)\s*([^\W\d_]*)\s*")


class InvalidDuration(ConfigError, ValueError):
    """A value that is not a duration Headrace can wait for. `hint` says how to write a number
    whose unit is missing (None for other refusals)."""

    def __init__(
        self, value: Any, reason: str = "not a duration", *, expected: str = EXPECTED, hint: str | None = None
    ):
        super().__init__(f"{reason}: expected {expected}, got {_show(value)}" + (f"; {hint}" if hint else ""))
        self.value, self.reason, self.expected, self.hint = value, reason, expected, hint


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _number(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _with_unit(value: str, expected: str) -> tuple[float, str]:
    """(number, unit in lower case, "" if none) of a duration string; InvalidDuration if it is not one."""
    match = _TEXT.fullmatch(value)
    if match is None or (match.group(2) and match.group(2).lower() not in UNITS):
        raise InvalidDuration(value, expected=expected)
    return float(match.group(1)), match.group(2).lower()


def _bounded(seconds: float, value: Any, expected: str) -> float:
    if not math.isfinite(seconds) or not 0 <= seconds <= MAX_DURATION_S:
        raise InvalidDuration(value, "out of range (0 to 100 years)", expected=expected)
    return seconds


def parse_duration(value: Any) -> float:
    """Seconds of one of Headrace's own duration fields: a number is seconds, a string has a
    unit; at least 0 and at most MAX_DURATION_S. Raises InvalidDuration (a ValueError)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise InvalidDuration(value)
    if not isinstance(value, str):
        return _bounded(float(value), value, EXPECTED)
    number, unit = _with_unit(value, EXPECTED)
    if not unit and number != 0:
        text = value.strip()
        raise InvalidDuration(
            value,
            "no unit",
            hint=f'write {text} (a JSON number of seconds) or "{text} s" (Flink would read "{text}" as milliseconds)',
        )
    return _bounded(number * UNITS[unit] if unit else 0.0, value, EXPECTED)


def flink_text(seconds: float) -> str:
    """A duration as Flink writes one (TimeUtils.formatWithHighestUnit): whole milliseconds in the
    largest unit that divides them, "10 min", "500 ms"; parse_flink_duration reads it back."""
    millis = int(round(seconds * 1000))
    for label, unit_ms in (("d", 86_400_000), ("h", 3_600_000), ("min", 60_000), ("s", 1000)):
        if millis and millis % unit_ms == 0:
            return f"{millis // unit_ms} {label}"
    return f"{millis} ms"


def parse_flink_duration(value: Any) -> float:
    """Seconds of a duration option of a job's configuration, read as Flink reads it: a string
    with a unit, or without one as milliseconds; 0 as a JSON number too (nothing to mistake).
    At most MAX_DURATION_S. Raises InvalidDuration (a ValueError)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise InvalidDuration(value, expected=FLINK_EXPECTED)
    if not isinstance(value, str):
        if value == 0 or not math.isfinite(value) or value < 0:
            return _bounded(float(value), value, FLINK_EXPECTED)
        text = _number(value)
        raise InvalidDuration(
            value,
            "a JSON number has no unit",
            expected=FLINK_EXPECTED,
            hint=f'write "{text} s" for seconds, or the string "{text}" for milliseconds as Flink reads it',
        )
    number, unit = _with_unit(value, FLINK_EXPECTED)
    return _bounded(number * (UNITS[unit] if unit else 1e-3), value, FLINK_EXPECTED)
