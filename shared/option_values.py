"""How a job option's value is read and how a value that cannot be read is reported: the readers
every option of a job's configuration shares (shared/job_options.py, shared/restart_options.py).
Each reader returns the value or raises ValueError; pure, so tested as unit tests."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from shared import durations
from shared.errors import ConfigError

DURATION_EXPECTED = durations.FLINK_EXPECTED
MAX_DURATION_S = durations.MAX_DURATION_S
# Flink's counts and parallelisms are Java ints; so are the catalog's columns (PostgreSQL
# `integer`): a larger value would overflow the insert, a 500 instead of a 400.
MAX_INT = 2**31 - 1


@dataclass(frozen=True)
class OptionProblem:
    """One option with a value Headrace cannot use."""

    option: str
    value: Any
    expected: str
    example: Any  # a good value, as it would be written in the configuration
    example_option: str | None = None  # the option the example sets, if not this one (a typo)
    missing: bool = False  # the option is absent but required by others
    reason: str | None = None  # what is wrong, when "must be <expected>" does not say it

    @property
    def message(self) -> str:
        example = json.dumps({self.example_option or self.option: self.example})
        if self.reason:
            return f"{self.reason}, got {_show(self.value)}; for example {example}"
        if self.missing:
            return f"is required: {self.expected}; for example {example}"
        if self.example_option:
            return f"is not an option ({self.expected}); for example {example}"
        return f"must be {self.expected}, got {_show(self.value)}; for example {example}"


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


# --- value readers: each returns the value or raises ValueError --------------------------------


def duration_s(value: Any, *, positive: bool = False) -> float:
    """Seconds of a duration option of a job's configuration, read as Flink reads it ("10 s",
    "500 ms", "2 min"; "10000" is milliseconds): shared/durations.py's parse_flink_duration."""
    seconds = durations.parse_flink_duration(value)  # InvalidDuration is a ValueError
    if positive and seconds <= 0:
        raise ValueError("not positive")
    return seconds


def noop_seconds(value: Any, *, allow_negative: bool = False) -> float:
    """Seconds of a no-op task's option (Headrace's test tasks, documented in seconds): a number
    of seconds, negative where the option allows one, or a string with a unit
    (shared/durations.py's parse_duration)."""
    if allow_negative and _negative_number(value):
        seconds = float(value)
        if not -MAX_DURATION_S <= seconds:  # -inf, or beyond a century
            raise ValueError("out of range")
        return seconds
    return durations.parse_duration(value)  # InvalidDuration is a ValueError


def _negative_number(value: Any) -> bool:
    if isinstance(value, str):
        return re.fullmatch(r"\s*-\d{1,30}(\.\d{1,30})?\s*", value) is not None
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value < 0


def integer(value: Any, minimum: int, maximum: int = MAX_INT) -> int:
    if isinstance(value, bool):
        raise ValueError("not an integer")
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, str) and re.fullmatch(r"\s*-?\d{1,30}\s*", value):
        value = int(value)
    if not isinstance(value, int) or not minimum <= value <= maximum:
        raise ValueError("out of range")
    return value


def integer_expected(value: Any, minimum: int) -> str:
    """The upper bound is named only when it is what was crossed: it is rarely the mistake."""
    try:
        above = integer(value, minimum, maximum=10**4000) > MAX_INT
    except ValueError:
        above = False
    return f"an integer between {minimum} and {MAX_INT}" if above else f"an integer >= {minimum}"


class RefusedValue(ConfigError, ValueError):
    """A value refused for a reason of its own, which the problem states instead of "must be
    <expected>" (its message is that reason)."""


def refusal_reason(exc: Exception) -> str | None:
    """What to say of a refused value when "must be <expected>" does not say it: a duration
    refused for its missing unit (how to write it), or a RefusedValue's reason; None otherwise."""
    if isinstance(exc, durations.InvalidDuration) and exc.hint:
        return f"{exc.reason}: {exc.hint}"
    if isinstance(exc, RefusedValue):
        return str(exc)
    return None
