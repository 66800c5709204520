"""What Settings (shared/settings.py) checks beyond each field's own type.

`CommaSeparated`: a setting holding a comma-separated list, as its environment variable spells
it; YAML (or a caller) may give a list instead, which is joined. `check(settings)`: the rules
between settings, run once every field is read; a broken one is a ValueError naming the setting.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import BeforeValidator

if TYPE_CHECKING:
    from shared.settings import Settings

SPARK_STANDALONE_MASTER = re.compile(r"spark://[^\s/:,]+:\d+(,[^\s/:,]+:\d+)*")


def _joined(value: Any) -> Any:
    return ",".join(map(str, value)) if isinstance(value, (list, tuple)) else value


CommaSeparated = Annotated[str | None, BeforeValidator(_joined)]


def check(settings: Settings) -> None:
    """Raise ValueError for the first rule between settings that `settings` breaks."""
    if settings.heartbeat_interval_s <= 0:
        raise ValueError("heartbeat_interval_s must be > 0")
    if settings.heartbeat_interval_s >= settings.heartbeat_timeout_s:
        raise ValueError(
            f"heartbeat_interval_s ({settings.heartbeat_interval_s}) must be smaller than "
            f"heartbeat_timeout_s ({settings.heartbeat_timeout_s})"
        )
    if settings.spark_master != "local" and not SPARK_STANDALONE_MASTER.fullmatch(settings.spark_master):
        raise ValueError(
            f"spark_master must be 'local' or a standalone master URL such as "
            f"'spark://127.0.0.1:7077'; got {settings.spark_master!r}"
        )
    if settings.taskmanager_slots < 1:
        raise ValueError("taskmanager_slots must be at least 1")
    if settings.high_availability == "zookeeper" and not settings.zookeeper_quorum:
        raise ValueError(
            "high_availability 'zookeeper' needs zookeeper_quorum (HEADRACE_ZOOKEEPER_QUORUM), e.g. '127.0.0.1:2181'"
        )
