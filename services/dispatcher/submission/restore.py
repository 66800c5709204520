"""Snapshot paths and the restore options of a submission (Flink's `savepointPath`,
`allowNonRestoredState`, `claimMode`), checked before a job exists: a path that holds no
completed snapshot, or a checkpoint option the JobManager would refuse, is a 400 naming the
field, not a job that fails minutes later."""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass
from typing import Any

from services.dispatcher.errors import ApiError
from services.dispatcher.guards import storage_roots
from shared import checkpoint_storage
from shared import checkpointing as cp
from shared.settings import Settings

_PATH_EXPECTED = "an absolute path or a file:// URI"
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):")
RESTORE_MODES = ("NO_CLAIM", "CLAIM")


@dataclass(frozen=True)
class Snapshot:
    """A completed checkpoint or savepoint a job is submitted to start from."""

    path: str  # the snapshot directory, resolved and local
    metadata: dict[str, Any]


def local_path(raw: Any, field: str) -> str:
    """A user's directory (plain path, `file:///p`, or `file:/p` as Flink prints locations) as an
    absolute local path. Raises ApiError 400 naming `field`."""
    if not isinstance(raw, str) or not raw.strip():
        raise ApiError.of(400, f"must be {_PATH_EXPECTED}, got {raw!r}", field=field, expected=_PATH_EXPECTED, got=raw)
    text = raw.strip()
    if text.startswith("file:") and not text.startswith("file://"):
        text = "file://" + text[len("file:") :]  # Flink's Path.toString form of a local URI
    scheme = _SCHEME.match(text)
    if scheme is not None and scheme.group(1).lower() != "file":
        raise ApiError.of(
            400,
            f"scheme {scheme.group(1)!r} is not supported, got {raw!r}",
            field=field,
            expected=_PATH_EXPECTED,
            got=raw,
            hint="checkpoint storage is a filesystem every TaskManager mounts: give a path on it, or file:///path",
        )
    try:
        path = cp.to_local_path(text)
    except ValueError as exc:
        raise ApiError.of(
            400,
            str(exc),
            field=field,
            expected=_PATH_EXPECTED,
            got=raw,
            hint="checkpoint storage is a filesystem every TaskManager mounts",
        ) from None
    if not path.startswith("/"):
        raise ApiError.of(
            400,
            f"must be {_PATH_EXPECTED}, got {raw!r}",
            field=field,
            expected=_PATH_EXPECTED,
            got=raw,
            hint="the JobManager and TaskManagers resolve paths from their own working directories; give the full path",
        )
    return posixpath.normpath(path)


def resolve_snapshot(raw: str, field: str) -> Snapshot:
    """The completed snapshot at a user's path, with its metadata. Raises ApiError 400."""
    path = local_path(raw, field)
    try:
        resolved = checkpoint_storage.resolve_snapshot(path)
        metadata = checkpoint_storage.read_metadata(resolved)
    except (checkpoint_storage.SnapshotError, OSError, ValueError) as exc:
        raise ApiError.of(
            400,
            f"no completed checkpoint or savepoint at {path} ({exc})",
            field=field,
            expected="the directory of a completed savepoint or retained checkpoint (it holds a _metadata file)",
            got=raw,
            prefix=False,
            hint="use the location `headrace savepoint` printed, or an external_path from "
            "GET /jobs/{jobid}/checkpoints; a moved savepoint directory works from its new place",
        ) from None
    return Snapshot(path=str(resolved), metadata=dict(metadata))


def claim_mode(raw: Any, field: str) -> str:
    mode = str(raw).strip().upper() if isinstance(raw, str) else None
    if mode == "LEGACY":
        mode = "NO_CLAIM"  # Flink's deprecated mode; a restore here never shares files with the snapshot
    if mode not in RESTORE_MODES:
        raise ApiError.of(
            400,
            f"must be NO_CLAIM or CLAIM, got {raw!r}",
            field=field,
            expected="NO_CLAIM or CLAIM",
            got=raw,
            hint="NO_CLAIM (default) leaves the snapshot alone; CLAIM lets the job own and eventually delete it",
        )
    return mode


def prepare(
    config: dict[str, Any],
    settings: Settings,
    *,
    savepoint_path: str | None,
    path_field: str,
    allow_non_restored: bool | None,
    mode: str | None,
    mode_field: str,
) -> Snapshot | None:
    """Write the restore options into `config` under Flink's option names (the request's fields
    win over the same options in its configuration), validate every checkpoint option, and
    return the snapshot to start from, if any. Raises ApiError 400 naming the field or option."""
    if savepoint_path is None and config.get(cp.RESTORE_PATH):
        savepoint_path, path_field = config[cp.RESTORE_PATH], cp.RESTORE_PATH
    snapshot = None
    if savepoint_path is not None:
        # Reading a snapshot is confined like writing one: no restore from /etc.
        storage_roots.confined(local_path(savepoint_path, path_field), settings, field=path_field, what="restore path")
        snapshot = resolve_snapshot(savepoint_path, path_field)
        config[cp.RESTORE_PATH] = snapshot.path
    if allow_non_restored is not None:
        config[cp.ALLOW_NON_RESTORED] = allow_non_restored
    if mode is not None:
        config[cp.RESTORE_MODE] = claim_mode(mode, mode_field)
    elif config.get(cp.RESTORE_MODE) is not None:
        config[cp.RESTORE_MODE] = claim_mode(config[cp.RESTORE_MODE], cp.RESTORE_MODE)
    if config.get(cp.SAVEPOINT_DIR):
        config[cp.SAVEPOINT_DIR] = storage_roots.confined(
            local_path(config[cp.SAVEPOINT_DIR], cp.SAVEPOINT_DIR),
            settings,
            field=cp.SAVEPOINT_DIR,
            what="the job's savepoint directory",
        )
    try:
        cp.checkpoint_config(config, settings.checkpointing, savepoint_dir=str(settings.savepoints))
    except cp.InvalidCheckpointConfig as exc:
        raise ApiError.of(
            400,
            exc.message,
            field=exc.field,
            expected=f"a valid value for {exc.field}",
            got=config.get(exc.field),
            hint="checkpoint options use Flink's names and values; "
            'durations are strings such as "10 s" or "500 ms" (without a unit: ms)',
        ) from None
    return snapshot
