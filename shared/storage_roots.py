"""Where snapshots may live: the one parser and check of the `storage_roots` setting.

The JobManager's and TaskManagers' drivers write savepoints wherever a REST caller names, as the
services' OS user; the dispatcher deletes what `POST /savepoint-disposal` names. Without a
fence, an operator token is a way to write into /etc or delete a home directory. So every
directory a snapshot is written to, restored from or disposed of, and every per-job checkpoint
directory, must lie inside one of the allowed roots: the cluster's checkpoint directory, its
savepoint directory (`state.savepoints.dir`), and the directories listed in `storage_roots`.

Two strengths of the check:
  * `confine`: containment after resolving `..` and symlinks (realpath), for targets and restore
    paths. A symlink inside a root that points into the same root is harmless there.
  * `no_symlinks`: for deletions, the path as given must lie lexically under a root and none of
    its components below that root may be a symlink (lstat each), so a disposal can never be
    redirected, not even into another root, and nothing is renamed before the check passed.
The dispatcher (400 at the REST call) and the JobManager (before it triggers or deletes) both
call these functions: one parser, one message.
"""

from __future__ import annotations

import os
import posixpath
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

from shared.checkpoint_storage import SnapshotError, local_path
from shared.errors import ConfigError

if TYPE_CHECKING:
    from shared.settings import Settings

SETTING = "storage_roots (HEADRACE_STORAGE_ROOTS)"


class OutsideStorageRoots(ConfigError, ValueError):
    """A path outside every allowed root, or one reached through a symlink where that is refused.
    `roots` are the allowed roots, for the caller's error body."""

    def __init__(self, message: str, roots: tuple[str, ...]):
        super().__init__(message)
        self.roots = roots


def parse_roots(raw: str | Iterable[str] | None) -> list[str]:
    """The entries of a `storage_roots` value: comma-separated text or a list; blanks dropped."""
    if raw is None:
        return []
    items = raw.split(",") if isinstance(raw, str) else [str(x) for x in raw]
    return [item.strip() for item in items if item.strip()]


def configured_roots(settings: Settings) -> tuple[str, ...]:
    """The allowed roots as configured (absolute, normalised, symlinks kept), checkpoint dir and
    savepoint dir first. A relative entry is refused: it would mean something else in every
    service's working directory."""
    out: list[str] = []
    own = [str(Path(settings.checkpoints).absolute()), str(Path(settings.savepoints).absolute())]
    for entry in [*own, *parse_roots(settings.storage_roots)]:
        try:
            path = os.fspath(local_path(entry))
        except SnapshotError as exc:
            raise ValueError(f"{SETTING}: {exc}") from None
        if not path.startswith("/"):
            raise ValueError(
                f"{SETTING}: {entry!r} is not an absolute path; list absolute directories, "
                f"comma-separated, e.g. /data/savepoints,/mnt/shared/checkpoints"
            )
        norm = posixpath.normpath(path)
        if norm == "/":
            raise ValueError(
                f"{SETTING}: '/' would allow every directory of the machine; list the directories that hold snapshots"
            )
        if norm not in out:
            out.append(norm)
    return tuple(out)


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _describe(roots: tuple[str, ...]) -> str:
    return ", ".join(roots)


def _normalised(raw: str | os.PathLike, roots: tuple[str, ...], what: str) -> str:
    try:
        path = posixpath.normpath(os.fspath(local_path(raw)))
    except SnapshotError as exc:
        raise OutsideStorageRoots(f"{what}: {exc}", roots) from None
    if not path.startswith("/"):
        raise OutsideStorageRoots(f"{what} {raw!s} is not an absolute path; give the full path", roots)
    return path


def confine(raw: str | os.PathLike, settings: Settings, *, what: str) -> str:
    """The path (plain or `file:` URI) normalised, if it lies inside an allowed root once `..`
    and symlinks are resolved; raises OutsideStorageRoots naming the roots and the setting.
    `what` names the path in the message ("savepoint target", "restore path", ...)."""
    roots = configured_roots(settings)
    path = _normalised(raw, roots, what)
    real = os.path.realpath(path)
    if any(_under(real, os.path.realpath(root)) for root in roots):
        return path
    shown = path if real == path else f"{path} (which resolves to {real})"
    raise OutsideStorageRoots(
        f"{what} {shown} is outside the allowed storage roots ({_describe(roots)}); choose a directory "
        f"under one of them, or add its parent to {SETTING} on the dispatcher and the JobManager",
        roots,
    )


def no_symlinks(raw: str | os.PathLike, settings: Settings, *, what: str) -> str:
    """The path normalised, if it lies lexically under an allowed root and no component below
    that root is a symlink (checked with lstat, nothing followed); raises OutsideStorageRoots.
    For deletions: what is checked is exactly what will be renamed and removed."""
    roots = configured_roots(settings)
    path = _normalised(raw, roots, what)
    candidates = [r for r in roots if _under(path, r)]
    candidates += [real for r in roots if (real := os.path.realpath(r)) != r and _under(path, real)]
    if not candidates:
        raise OutsideStorageRoots(
            f"{what} {path} is not under an allowed storage root ({_describe(roots)}); only snapshots "
            f"inside them can be disposed of ({SETTING})",
            roots,
        )
    root = max(candidates, key=len)  # the innermost root: fewest components left to trust
    current = root
    for part in Path(path).relative_to(root).parts:
        current = posixpath.join(current, part)
        try:
            mode = os.lstat(current).st_mode
        except FileNotFoundError:
            return path  # nothing there (any more): nothing to redirect
        if stat.S_ISLNK(mode):
            raise OutsideStorageRoots(
                f"{what} {path} goes through the symlink {current} (to {os.readlink(current)}); a "
                f"snapshot is disposed of only by its real path, so nothing was renamed or deleted",
                roots,
            )
    return path
