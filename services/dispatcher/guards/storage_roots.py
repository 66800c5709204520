"""The REST side of the storage roots (shared/storage_roots.py): a savepoint target, a restore
path or a disposal outside the allowed roots is a 400 naming the roots and the setting, and a
disposal of anything the catalog does not record as a completed snapshot is a 404, before a row
is written or a file touched. The JobManager checks targets again before it triggers."""

from __future__ import annotations

from sqlalchemy.orm import Session

from services.dispatcher.errors import ApiError
from shared import storage_roots
from shared.catalog import repository
from shared.settings import Settings

_HINT = (
    "the cluster writes and reads snapshots only inside its checkpoint and savepoint directories and the "
    "directories listed in storage_roots (HEADRACE_STORAGE_ROOTS), set on the dispatcher and the JobManager"
)


def _refused(exc: ValueError, field: str, raw: object) -> ApiError:
    roots = getattr(exc, "roots", ())
    return ApiError.of(
        400,
        str(exc),
        field=field,
        got=raw,
        prefix=False,
        hint=_HINT,
        expected=f"a directory under one of: {', '.join(roots)}" if roots else "an allowed directory",
        **{"allowed-roots": list(roots)},
    )


def confined(path: str, settings: Settings, *, field: str, what: str) -> str:
    """`path` (already absolute and normalised) if it is inside the roots; else 400."""
    try:
        return storage_roots.confine(path, settings, what=what)
    except ValueError as exc:
        raise _refused(exc, field, path) from None


def path_variants(path: str) -> set[str]:
    """The forms a snapshot's path may be recorded in (plain, trailing slash, file: URIs)."""
    bare = {path.rstrip("/") or "/"}
    candidates = bare | {p + "/" for p in bare}
    return candidates | {f"file:{p}" for p in candidates} | {f"file://{p}" for p in candidates}


def known_snapshot(s: Session, path: str, settings: Settings, *, field: str) -> str:
    """The path of a completed savepoint or retained checkpoint the catalog records, inside the
    roots and reached without a symlink; else 400 (roots, symlink) or 404 (unknown). Nothing on
    disk is touched here."""
    try:
        path = storage_roots.no_symlinks(path, settings, what="savepoint")
    except ValueError as exc:
        raise _refused(exc, field, path) from None
    directory = path[: -len("/_metadata")] if path.endswith("/_metadata") else path
    if not repository.is_completed_snapshot(s, path_variants(directory)):
        raise ApiError.of(
            404,
            f"not a savepoint this cluster knows: {directory} (no completed savepoint or "
            f"retained checkpoint is recorded at this path); nothing was deleted",
            field=field,
            got=path,
            prefix=False,
            expected="the location of a savepoint or retained checkpoint "
            "of this cluster, as GET /jobs/{jobid}/checkpoints or `headrace savepoint` printed it",
            hint="a directory copied or moved elsewhere is not disposed of through the API: delete it yourself",
        )
    return directory
