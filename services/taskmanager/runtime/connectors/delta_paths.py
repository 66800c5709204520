"""Where a Delta table may lie: the one check of a pipeline's table path.

Pipelines are untrusted code running as the drivers' user, and a table path is theirs to choose,
so it is confined as the snapshot targets are (shared/storage_roots.py): a relative path lands in
the lake directory (the setting `lake_dir`, HEADRACE_LAKE_DIR, default `$HEADRACE_HOME/lake`);
an absolute one (or a `file:` URI) must lie inside the lake directory or another allowed storage
root once `..` and symlinks are resolved. Anything else (another scheme such as s3a://, /etc, a
path climbing out of the lake) is refused before Spark touches it. The lake directory and the
roots come with the task (TaskSpec.lake_dir, .storage_roots); the TaskManagers create the lake
directory and hand it to the drivers' user (services/taskmanager/drivers/sandbox.py).
"""

from __future__ import annotations

import os
import posixpath
from typing import Sequence

from shared.checkpoint_storage import SnapshotError, local_path

from .delta_errors import DeltaPathRefused

SETTINGS = "lake_dir (HEADRACE_LAKE_DIR) or storage_roots (HEADRACE_STORAGE_ROOTS)"


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def resolve_table_path(path: str, *, lake_dir: str, roots: Sequence[str] = ()) -> str:
    """The table's absolute, normalised path; DeltaPathRefused naming the allowed directories."""
    allowed = [r for r in (lake_dir, *roots) if r]
    shown = ", ".join(allowed) or "none (this task was given no lake directory)"
    if not isinstance(path, str) or not path.strip():
        raise DeltaPathRefused(
            f"a Delta table needs a path, got {path!r}: a name such as 'clicks/bronze' "
            f"lands in the lake directory ({lake_dir or 'none'})"
        )
    try:
        raw = os.fspath(local_path(path.strip()))
    except SnapshotError as exc:
        raise DeltaPathRefused(
            f"Delta table {path}: {exc}; tables live on the local or shared file system, in "
            f"the lake directory ({shown})"
        ) from None
    if not raw.startswith("/"):
        if not lake_dir:
            raise DeltaPathRefused(
                f"Delta table {path!r} is relative, but this task has no lake directory to "
                f"put it in; give an absolute path under {shown}, or set {SETTINGS}"
            )
        raw = posixpath.join(lake_dir, raw)
    norm = posixpath.normpath(raw)
    real = os.path.realpath(norm)
    if any(_under(real, os.path.realpath(root)) for root in allowed):
        return norm
    where = norm if real == norm else f"{norm} (which resolves to {real})"
    raise DeltaPathRefused(
        f"Delta table {where} is outside the lake directory and the allowed storage roots "
        f"({shown}); give a relative path (it lands in the lake directory) or one under those "
        f"directories, or add its parent to {SETTINGS}"
    )
