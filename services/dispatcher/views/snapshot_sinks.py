"""What a completed snapshot says about its sink, for the job's Checkpoints tab: a Delta sink's
table and the table version the snapshot's batch committed (the "sink" entry its driver wrote into
`_metadata`, runtime/snapshots.py). Read from the snapshot's own files, so nothing about sinks is
stored in the catalog; a snapshot never changes once complete, so each is read once per process."""

from __future__ import annotations

import functools
from typing import Any

from shared import checkpoint_storage as storage

CACHED = 512  # snapshots whose entry is kept (the history shows 10)


@functools.lru_cache(maxsize=CACHED)
def _entry(path: str) -> tuple[tuple[str, Any], ...]:
    sink = storage.read_metadata(path).get("sink")
    if not isinstance(sink, dict) or sink.get("kind") != "delta":
        return ()
    fields: dict[str, Any] = {"sink_table": sink.get("path"), "sink_version": sink.get("version")}
    undone = sink.get("undone")
    if isinstance(undone, dict) and undone.get("batches"):
        fields["sink_undone"] = (
            f"batches {undone['batches'][0]}..{undone['batches'][-1]} undone at the restore "
            f"(table back at version {undone.get('to_version')})"
        )
    return tuple(fields.items())


def sink_fields(path: str | None) -> dict[str, Any]:
    """{"sink_table", "sink_version"[, "sink_undone"]} of a Delta sink's snapshot; {} otherwise or
    when the snapshot cannot be read (moved, disposed of)."""
    if not path:
        return {}
    try:
        return dict(_entry(str(storage.local_path(path))))
    except (OSError, ValueError, storage.SnapshotError):
        return {}
