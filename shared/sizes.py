"""Sizes in bytes as every service reads them: the one parser, in Flink's spellings.

A size is a whole number of bytes (`104857600`, or the string `"104857600"`) or a whole number
with a unit, as Flink's MemorySize.parseBytes reads it: `"512m"`, `"512 mb"`, `"1g"`, `"1 gb"`,
`"64 kb"`, `"3 gibibytes"`; any letter case, a space or none between number and unit; units of
1024 (b/bytes, k/kb/kibibytes, m/mb/mebibytes, g/gb/gibibytes, t/tb/tebibytes). Spark's memory
strings (`spark.driver.memory = "1g"`) are the same spellings without the space.

Flink refuses fractions ("1.5g") and the IEC symbols ("1 GiB"); so does this parser, with a
message that says how to write the same size ("1536m", "1g"), so a value accepted here means the
same in a Flink configuration.

The dispatcher's upload and archive limits, the job option headrace.task.memory-limit and the
TaskManagers' driver_memory_limit all read sizes through `parse_bytes`.
"""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Any

from shared.errors import ConfigError


def _labels(factor: int, *labels: str) -> dict[str, int]:
    return dict.fromkeys(labels, factor)


# Flink's labels (MemorySize.MemoryUnit), compared in lower case.
UNITS: dict[str, int] = {
    **_labels(1, "b", "bytes"),
    **_labels(1024, "k", "kb", "kibibytes"),
    **_labels(1024**2, "m", "mb", "mebibytes"),
    **_labels(1024**3, "g", "gb", "gibibytes"),
    **_labels(1024**4, "t", "tb", "tebibytes"),
}
MAX_BYTES = 2**63 - 1  # Flink's sizes are Java longs
EXPECTED = 'a whole number of bytes, or one with a unit such as "512m", "512 mb", "1g" or "64 kb" (units of 1024)'

# Digits bounded: a 19-digit number already exceeds MAX_BYTES, and int() of a huge string is slow.
_TEXT = re.compile(r"\s*(\d{1,30})\s*([^\W\d_]*)\s*")
_FRACTION = re.compile(r"\s*(\d{1,30}\.\d{1,30})\s*([^\W\d_]*)\s*")
_IEC = {"kib": "k", "mib": "m", "gib": "g", "tib": "t"}


class InvalidSize(ConfigError, ValueError):
    """A value that is not a size in bytes; the message says what is expected and, where it can,
    how to write the value the way Flink does."""

    def __init__(self, value: Any, what: str, reason: str):
        super().__init__(f"{what}: {reason}: expected {EXPECTED}, got {_show(value)}")
        self.value, self.what, self.reason = value, what, reason


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _spelled(value: Decimal, unit: str) -> str | None:
    """The same size as a whole number of the largest unit that gives one, e.g. 1.5g -> "1536m"."""
    factor = UNITS.get(unit) or UNITS.get(_IEC.get(unit, ""))
    if factor is None:
        return None
    size = value * factor
    if size != size.to_integral_value():
        return None
    return spark_spelling(int(size)) if size >= 1 else None


def _why_not(text: str) -> str:
    """What is wrong with a string that is not a size, with the Flink spelling when one exists."""
    fraction = _FRACTION.fullmatch(text)
    if fraction is not None:
        unit = fraction.group(2).lower()
        spelled = _spelled(Decimal(fraction.group(1)), unit)
        return "a fraction" + (f" (write {spelled!r})" if spelled else "")
    match = _TEXT.fullmatch(text)
    if match is not None and match.group(2).lower() in _IEC:
        return f"an IEC unit (write {match.group(1) + _IEC[match.group(2).lower()]!r}: units are of 1024 already)"
    if match is not None:
        return f"an unknown unit {match.group(2)!r}"
    return "not a size"


def parse_bytes(value: Any, *, what: str = "size", minimum: int = 1, default_unit: str = "b") -> int:
    """Bytes from an integer or a size string, at least `minimum` and at most MAX_BYTES. A number
    without a unit is of `default_unit` (Flink's MemorySize.parse(text, defaultUnit): bytes, but
    Spark reads spark.executor.memory's bare numbers as mebibytes). Raises InvalidSize (a
    ValueError) naming `what` (the setting or option) otherwise."""
    if isinstance(value, bool):
        raise InvalidSize(value, what, "not a size")
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int):
        size = value * UNITS[default_unit]
    elif isinstance(value, str):
        match = _TEXT.fullmatch(value)
        unit = match.group(2).lower() if match is not None else ""
        if match is None or (unit and unit not in UNITS):
            raise InvalidSize(value, what, _why_not(value))
        size = int(match.group(1)) * UNITS[unit or default_unit]
    else:
        raise InvalidSize(value, what, "not a size")
    if not minimum <= size <= MAX_BYTES:
        raise InvalidSize(value, what, f"out of range ({minimum} to {MAX_BYTES} bytes)")
    return size


def spark_spelling(size: int) -> str:
    """A size as Spark's JVM memory strings take it ("1536m", "2g"; no space, no fraction):
    the largest unit that gives a whole number."""
    for label in ("t", "g", "m", "k"):
        if size % UNITS[label] == 0:
            return f"{size // UNITS[label]}{label}"
    return f"{size}b"
