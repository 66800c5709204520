"""The JobManager's deletions in checkpoint storage: discarded checkpoints, failed or late
snapshots. A path reaches here from the catalog or, for a late acknowledgement, from a
TaskManager's message, so it is checked like a REST disposal (shared/storage_roots.py): inside
an allowed root, no symlink below it, a Headrace snapshot. A refusal is logged and the files
stay: a leftover is cheap, deleting a user's directory is not."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from shared.checkpoint_storage import SnapshotError, dispose
from shared.settings import Settings
from shared.storage_roots import no_symlinks

log = logging.getLogger("headrace.jobmanager.checkpoints")


def discard_files(paths: list[str], settings: Settings) -> None:
    """Delete snapshot directories (after the catalog stopped pointing at them)."""
    for p in paths:
        if not p:
            continue
        try:
            path = no_symlinks(p, settings, what="discarded snapshot")
        except ValueError as exc:
            log.warning("not deleting %s: %s", p, exc)
            continue
        try:
            dispose(path)
        except SnapshotError:
            # Half-written (its `_metadata` never landed): only an empty directory goes.
            directory = Path(path)
            if directory.is_dir() and not directory.is_symlink() and not any(directory.iterdir()):
                shutil.rmtree(directory, ignore_errors=True)
            else:
                log.warning("not deleting %s: it holds no snapshot metadata", p)
        except OSError as exc:
            log.warning("could not delete snapshot %s: %s", p, exc)
