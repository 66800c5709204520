"""The two settings tables, README.md's ("Configuration") and deploy/README.md's ("Settings"), say
what shared/settings.py does: every documented default is Settings' own default. A literal one
(a number, a size, a boolean, a JSON value, a word) is compared with the field's default; one that
describes a default computed at run time (`$HEADRACE_HOME/checkpoints`, "CPU count") must be one
of the descriptions listed below, each checked against the code. The tables once disagreed with
each other on a warm driver's memory and on which services read the log level."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Callable

import pytest

from shared.settings import Settings
from shared.sizes import parse_bytes

ROOT = Path(__file__).resolve().parents[2]
TABLES = {"README.md": "## Configuration", "deploy/README.md": "## Settings"}
NAME = re.compile(r"`(HEADRACE_[A-Z0-9_]+|_[A-Z0-9_]+)`")


def at_home() -> Settings:
    """The defaults with home /h, whatever HEADRACE_* variables this process has."""
    return Settings.model_construct(home=Path("/h"))


# Defaults computed at run time: field -> (how a table may say it, what the code does).
DESCRIBED: dict[str, tuple[set[str], Callable[[], bool]]] = {
    "home": ({"~/.headrace"}, lambda: default("home") == Path.home() / ".headrace"),
    "catalog_url": (
        {
            "SQLite in home",
            "SQLite $HEADRACE_HOME/catalog.db",
            "SQLite in home; headrace up --ha: a PostgreSQL server it runs (data in $HEADRACE_HOME/postgres)",
        },
        lambda: at_home().catalog == "sqlite:////h/catalog.db",
    ),
    "checkpoint_dir": ({"$HEADRACE_HOME/checkpoints"}, lambda: at_home().checkpoints == Path("/h/checkpoints")),
    "savepoint_dir": ({"$HEADRACE_HOME/savepoints"}, lambda: at_home().savepoints == Path("/h/savepoints")),
    "artifact_dir": ({"$HEADRACE_HOME/artifacts"}, lambda: at_home().artifacts == Path("/h/artifacts")),
    "cluster_secret": (
        {"$HEADRACE_HOME/secrets/cluster-secret (0600, created on first use)"},
        lambda: default("cluster_secret") is None,
    ),
    "pipeline_redis_url": ({"HEADRACE_REDIS_URL"}, lambda: default("pipeline_redis_url") is None),
    "pipeline_kafka_bootstrap_servers": (
        {"none (headrace up --kafka: its broker)", "unset"},
        lambda: default("pipeline_kafka_bootstrap_servers") is None,
    ),
    "catalog_port": ({"a free one"}, lambda: default("catalog_port") == 0),
    "lake_dir": ({"$HEADRACE_HOME/lake"}, lambda: at_home().lake == Path("/h/lake")),
    "kafka_controller_port": ({"a free one", "a free port"}, lambda: default("kafka_controller_port") == 0),
    "taskmanager_cores": ({"CPU count"}, lambda: default("taskmanager_cores") == float(os.cpu_count() or 1)),
    "warm_parallelism": ({"slots", "the TaskManager's slots"}, lambda: default("warm_parallelism") is None),
    "driver_memory_limit": ({"driver memory + 2g"}, lambda: default("driver_memory_limit") is None),
    "advertised_host": ({"the metrics host, or this host's name"}, lambda: default("advertised_host") is None),
}


def default(field: str) -> Any:
    return Settings.model_fields[field].get_default(call_default_factory=True)


def field_of(env_name: str) -> str | None:
    name = env_name.removeprefix("HEADRACE_").lower()
    return name if name in Settings.model_fields else None


def names_of(cell: str) -> list[str]:
    """`HEADRACE_A_B_X` / `_Y` -> HEADRACE_A_B_X, HEADRACE_A_B_Y (a suffix replaces the end of the
    first name that makes a setting of it)."""
    found = NAME.findall(cell)
    names = [found[0]]
    for suffix in found[1:]:
        if suffix.startswith("HEADRACE_"):
            names.append(suffix)
            continue
        parts = found[0].split("_")
        candidates = ["_".join(parts[:k]) + suffix for k in range(len(parts) - 1, 0, -1)]
        names.append(next((c for c in candidates if field_of(c)), candidates[0]))
    return names


def rows(path: str, heading: str) -> list[tuple[int, str, str]]:
    """(line, setting name, documented default) of each setting in the table under `heading`."""
    lines = (ROOT / path).read_text().splitlines()
    start = lines.index(heading)
    out = []
    for number, line in enumerate(lines[start:], start + 1):
        if line.startswith("## ") and number > start + 1:
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("| `HEADRACE_") else []
        if len(cells) < 3:
            continue
        names = names_of(cells[0])
        values = [v.strip() for v in cells[1].split(" / ")] if len(names) > 1 else [cells[1]]
        assert len(values) == len(names), f"{path}:{number}: {len(names)} settings but defaults {values}"
        out += [(number, name, value.replace("`", "").strip()) for name, value in zip(names, values, strict=True)]
    assert len(out) > 20, f"{path}: the table under {heading!r} was not found"
    return out


def literal_matches(documented: str, value: Any) -> bool:
    text = documented.strip()
    if value is None:
        return text in ("none", "unset")
    if isinstance(value, bool):
        return text == str(value).lower()
    if isinstance(value, (dict, list)):
        try:
            return json.loads(text) == value
        except ValueError:
            return False
    if isinstance(value, (int, float)):
        try:
            return float(text) == float(value)
        except ValueError:
            try:  # a size: "100 MB" is 100 * 1024**2, as the settings read it
                return parse_bytes(text) == value
            except ValueError:
                return False
    return text == str(value)


CASES = [(path, *row) for path, heading in TABLES.items() for row in rows(path, heading)]


@pytest.mark.parametrize("path, line, name, documented", CASES, ids=[f"{c[0]}:{c[2]}" for c in CASES])
def test_a_documented_default_is_the_settings_default(path, line, name, documented):
    field = field_of(name)
    if field is None:
        assert name == "HEADRACE_CONFIG" and documented == "unset", f"{path}:{line}: {name} is no setting"
        return
    if field in DESCRIBED:
        said, holds = DESCRIBED[field]
        if documented in said:
            assert holds(), f"{path}:{line}: {name}'s default is no longer {documented!r}"
            return
    value = default(field)
    assert literal_matches(documented, value), (
        f"{path}:{line}: {name} documented as {documented!r}, but shared/settings.py's default is {value!r}"
    )
