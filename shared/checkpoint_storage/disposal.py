"""Disposing of a snapshot directory (and only of one)."""

from __future__ import annotations

import json
import os
import secrets
import shutil
from pathlib import Path

from shared.checkpoint_storage.layout import FORMAT, METADATA_FILE, SnapshotError, _snapshot_dir


def dispose(path: str | Path) -> None:
    """Delete a snapshot directory. Gone already: nothing to do. A directory without `_metadata`
    is refused (SnapshotError): it is not ours to delete."""
    directory = _snapshot_dir(path)
    if not os.path.lexists(directory):
        return
    if os.path.islink(directory):  # renaming it would move the link and leave the link's target
        raise SnapshotError(f"{directory} is a symlink; a snapshot is disposed of by its real path only")
    meta_path = directory / METADATA_FILE
    if not directory.is_dir() or not meta_path.is_file():
        raise SnapshotError(f"{directory} is not a snapshot (no {METADATA_FILE}); refusing to delete it")
    try:
        fmt = json.loads(meta_path.read_text(encoding="utf-8")).get("format")
    except (OSError, ValueError, AttributeError):
        fmt = None
    if fmt != FORMAT:
        # e.g. a Flink savepoint, which also has a _metadata file: not ours to delete
        raise SnapshotError(f"{meta_path} is not {FORMAT!r} metadata; refusing to delete {directory}")
    # Renamed away first: a crash mid-delete must not leave a `_metadata` over a partial tree.
    trash = directory.parent / f".{directory.name}.disposing-{secrets.token_hex(6)}"
    try:
        os.rename(directory, trash)
    except FileNotFoundError:
        return
    shutil.rmtree(trash)
