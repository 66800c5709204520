"""The one reading of a switch in a request or a job's configuration: a JSON boolean, or the
string "true"/"false" in any case (Flink's configuration files write them so). Other spellings
(yes, 1, on) are refused rather than guessed."""

from __future__ import annotations

from typing import Any


def parse_boolean(value: Any) -> bool:
    """True or False; raises ValueError for anything else."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise ValueError(f"not a boolean: {value!r}")
