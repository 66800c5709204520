"""What a snapshot directory is: its names and format, its `_metadata` (read, and written
atomically under a hidden in-progress sibling), the errors, and the path forms a snapshot is
given as."""

from __future__ import annotations

import json
import os
import re
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlparse

from shared.errors import StateError

FORMAT = "headrace-snapshot/1"
METADATA_FILE = "_metadata"
SPARK_DIR = "spark"
INPROGRESS = ".inprogress-"


class SnapshotError(StateError):
    """A snapshot cannot be taken, read, restored or disposed of; the message names the path."""


@dataclass(frozen=True)
class SnapshotInfo:
    path: str
    batch_id: int
    state_size: int
    files: int
    duration_ms: int
    source_offsets: tuple[str, ...]
    metadata: dict = field(compare=False)


def local_path(path: str | os.PathLike) -> Path:
    """A plain path or a `file:` URI (`file:///p`, `file:/p`, `file://localhost/p`) as a Path."""
    text = os.fspath(path)
    if isinstance(text, str) and re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:/", text):
        url = urlparse(text)
        if url.scheme.lower() != "file":
            raise SnapshotError(
                f"{text}: scheme {url.scheme!r} is not supported; checkpoint storage is a "
                f"filesystem path (plain or file:///...)"
            )
        if url.netloc not in ("", "localhost"):
            raise SnapshotError(
                f"{text}: a file URI with host {url.netloc!r} is not supported; write file:///absolute/path"
            )
        return Path(unquote(url.path))
    return Path(text)


def new_savepoint_dir(parent: str | Path, job_id: str) -> Path:
    """Flink's savepoint naming: `<parent>/savepoint-<first 6 of the job id>-<12 hex>` (not created)."""
    return local_path(parent) / f"savepoint-{job_id[:6]}-{secrets.token_hex(6)}"


def dir_size(path: Path) -> int:
    """Bytes of every regular file under `path` (a hard-linked file counts in full)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except FileNotFoundError:
                pass
    return total


def _fsync(path: Path, *, directory: bool = False) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _write_json_atomic(path: Path, obj: dict) -> None:
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, sort_keys=True)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _inprogress_dir(target: Path) -> Path:
    return target.parent / f".{target.name}{INPROGRESS}{secrets.token_hex(6)}"


def resolve_snapshot(path: str | Path) -> Path:
    """The snapshot directory for a path given as the directory, its `_metadata` file or a
    `file:` URI of either. Raises SnapshotError unless it is a complete snapshot."""
    directory, _meta = _load(path)
    return directory


def read_metadata(path: str | Path) -> dict:
    """The `_metadata` of a complete snapshot (same path forms as resolve_snapshot)."""
    _directory, meta = _load(path)
    return meta


def _snapshot_dir(path: str | Path) -> Path:
    p = local_path(path)
    return p.parent if p.name == METADATA_FILE and not p.is_dir() else p


def _load(path: str | Path) -> tuple[Path, dict]:
    directory = _snapshot_dir(path)
    if not directory.exists():
        raise SnapshotError(f"{directory} does not exist")
    if not directory.is_dir():
        raise SnapshotError(
            f"{directory} is a file, not a snapshot directory (expected a directory holding "
            f"{METADATA_FILE}, or its {METADATA_FILE} file)"
        )
    meta_path = directory / METADATA_FILE
    if not meta_path.is_file():
        if INPROGRESS in directory.name:
            raise SnapshotError(
                f"{directory} is an unfinished snapshot (still being written, or its writer "
                f"crashed): it has no {METADATA_FILE}; it cannot be restored"
            )
        raise SnapshotError(
            f"{directory} is not a snapshot: it holds no {METADATA_FILE} file (give the directory "
            f"of a completed checkpoint or savepoint, e.g. .../chk-<n> or .../savepoint-...)"
        )
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise SnapshotError(f"{meta_path}: unreadable snapshot metadata ({exc})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        got = meta.get("format") if isinstance(meta, dict) else type(meta).__name__
        raise SnapshotError(
            f"{meta_path}: format {got!r} is not {FORMAT!r}; this is not a Headrace snapshot "
            f"or it was written by an incompatible version"
        )
    if not (directory / SPARK_DIR).is_dir():
        raise SnapshotError(f"{directory}: its {SPARK_DIR}/ directory is missing; the snapshot is damaged")
    return directory, meta
