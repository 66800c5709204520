"""How much of an upload the dispatcher reads, unpacks and parses, and reading it within that.

A 646 KB zip holding a 300 MB `.py` took the dispatcher from 125 MB to 1.85 GB (the member read
whole, decoded, compiled) and its other requests to seconds. So:

- an upload is copied to disk as it arrives, hashed on the way, never held whole in memory;
- a zip's central directory is checked first (member count, the sum and each of the declared
  uncompressed sizes), then every member is read in chunks while its real bytes are counted: a zip
  may lie about its sizes, and a member that unpacks to more than the zip declared is refused as it
  unpacks, not after;
- a `.py` module (an upload or a member) is parsed only up to `max_artifact_source_bytes`.

A limit crossed is a 413 whose body names the limit and the setting that raises it; a broken
archive is a 400.
"""

from __future__ import annotations

import hashlib
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, Any, Iterator

from services.dispatcher.guards.limits import human
from shared import sizes
from shared.errors import ConfigError

CHUNK_BYTES = 256 * 1024
DEFAULT_MAX_UNCOMPRESSED = 200 * 1024**2
DEFAULT_MAX_MEMBERS = 10_000
DEFAULT_MAX_SOURCE = 10 * 1024**2


class ArtifactRejected(ConfigError, ValueError):
    """An upload that cannot be a job (400) or is above a limit (413, with `setting` and `limit`)."""

    def __init__(
        self,
        message: str,
        *,
        line: int | None = None,
        member: str | None = None,
        status: int = 400,
        setting: str | None = None,
        limit: int | None = None,
    ):
        super().__init__(message)
        self.line, self.member, self.status = line, member, status
        self.setting, self.limit = setting, limit


@dataclass(frozen=True)
class ArtifactLimits:
    uncompressed: int = DEFAULT_MAX_UNCOMPRESSED  # all members of a zip together, unpacked
    members: int = DEFAULT_MAX_MEMBERS  # entries of a zip's central directory
    source: int = DEFAULT_MAX_SOURCE  # one .py module the dispatcher parses

    @classmethod
    def from_settings(cls, settings: Any) -> "ArtifactLimits":
        """Raises ValueError naming the setting when one is not a positive size."""

        def size(name: str, default: int) -> int:
            raw = getattr(settings, name, None)
            return default if raw is None else sizes.parse_bytes(raw, what=name)

        return cls(
            uncompressed=size("max_artifact_uncompressed_bytes", DEFAULT_MAX_UNCOMPRESSED),
            members=int(getattr(settings, "max_artifact_members", None) or DEFAULT_MAX_MEMBERS),
            source=size("max_artifact_source_bytes", DEFAULT_MAX_SOURCE),
        )


def too_big(message: str, *, setting: str, limit: int, member: str | None = None) -> ArtifactRejected:
    env = "HEADRACE_" + setting.upper()
    return ArtifactRejected(
        f"{message}; the dispatcher's limit is {human(limit)} ({limit}): an artifact holds code, not data "
        f"(read data through a source); to raise the limit set {setting} ({env}) and restart the dispatcher",
        member=member,
        status=413,
        setting=setting,
        limit=limit,
    )


def spool(src: IO[bytes], dest: Path, max_bytes: int) -> tuple[int, str]:
    """Copy an upload to `dest` in chunks, fsynced; (size, sha256). Returns max_bytes + 1 as the
    size once the upload passes max_bytes (the caller refuses it; `dest` is then incomplete)."""
    digest = hashlib.sha256()
    size = 0
    with open(dest, "wb") as out:
        while chunk := src.read(CHUNK_BYTES):
            size += len(chunk)
            if size > max_bytes:
                return max_bytes + 1, ""
            digest.update(chunk)
            out.write(chunk)
        out.flush()
        os.fsync(out.fileno())
    return size, digest.hexdigest()


def read_source(path: Path, limits: ArtifactLimits, filename: str) -> bytes:
    """A whole .py upload, if it is within the parse limit."""
    size = path.stat().st_size
    if size > limits.source:
        raise too_big(
            f"'{filename}' is a module of {human(size)}", setting="max_artifact_source_bytes", limit=limits.source
        )
    with open(path, "rb") as f:
        return f.read(limits.source + 1)


def _check_directory(zf: zipfile.ZipFile, limits: ArtifactLimits, filename: str) -> list[zipfile.ZipInfo]:
    infos = zf.infolist()
    if len(infos) > limits.members:
        raise too_big(f"'{filename}' holds {len(infos)} members", setting="max_artifact_members", limit=limits.members)
    declared = 0
    for info in infos:
        p = PurePosixPath(info.filename)
        if p.is_absolute() or ".." in p.parts:
            raise ArtifactRejected(
                f"'{filename}' member {info.filename} points outside the archive", member=info.filename
            )
        declared += info.file_size
        if info.filename.endswith(".py") and info.file_size > limits.source:
            raise too_big(
                f"'{filename}' member {info.filename} is a module of {human(info.file_size)}",
                setting="max_artifact_source_bytes",
                limit=limits.source,
                member=info.filename,
            )
    if declared > limits.uncompressed:
        raise too_big(
            f"'{filename}' unpacks to {human(declared)}",
            setting="max_artifact_uncompressed_bytes",
            limit=limits.uncompressed,
        )
    return infos


def zip_sources(path: Path, limits: ArtifactLimits, filename: str) -> Iterator[tuple[str, bytes]]:
    """(member name, source) of every .py member of the zip at `path`, after checking the whole
    archive: central directory within the limits, every member unpacking to no more than it
    declares and passing its CRC. A generator: one member's source in memory at a time.
    Raises ArtifactRejected."""
    try:
        zf = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError, ValueError) as exc:
        raise ArtifactRejected(f"'{filename}' is not a valid zip archive ({exc})") from None
    found = False
    with zf:
        infos = _check_directory(zf, limits, filename)
        unpacked = 0
        for info in infos:
            if info.is_dir():
                continue
            is_py = info.filename.endswith(".py")
            kept: list[bytes] = []
            seen = 0
            try:
                with zf.open(info) as member:  # its CRC is checked when the end is read
                    while chunk := member.read(CHUNK_BYTES):
                        seen += len(chunk)
                        unpacked += len(chunk)
                        if seen > info.file_size:
                            raise ArtifactRejected(
                                f"'{filename}' member {info.filename} unpacks to more than "
                                f"the {info.file_size} bytes its archive declares",
                                member=info.filename,
                            )
                        if unpacked > limits.uncompressed:
                            raise too_big(
                                f"'{filename}' unpacks to more than {human(limits.uncompressed)}",
                                setting="max_artifact_uncompressed_bytes",
                                limit=limits.uncompressed,
                            )
                        if is_py:
                            kept.append(chunk)
            except (
                zipfile.BadZipFile,
                zipfile.LargeZipFile,
                EOFError,
                OSError,
                NotImplementedError,
                RuntimeError,
                ValueError,
            ) as exc:  # CRC, truncation, encryption, unknown compression
                raise ArtifactRejected(
                    f"'{filename}' is corrupt or unreadable: member {info.filename}: {exc}", member=info.filename
                ) from None
            if is_py:
                found = True
                yield info.filename, b"".join(kept)
    if not found:
        raise ArtifactRejected(f"'{filename}' contains no .py files: zip your pipeline's Python modules")


def zip_module_source(path: Path, module: str, limits: ArtifactLimits) -> bytes | None:
    """The source of `module` ("pkg.mod" or "pkg") inside a stored zip, read within the parse
    limit; None when the zip has no such module or cannot be read."""
    base = module.replace(".", "/")
    try:
        with zipfile.ZipFile(path) as zf:
            for name in (f"{base}.py", f"{base}/__init__.py"):
                try:
                    info = zf.getinfo(name)
                except KeyError:
                    continue
                if info.file_size > limits.source:
                    return None
                with zf.open(info) as member:
                    return member.read(limits.source + 1)[: limits.source]
    except (zipfile.BadZipFile, OSError, RuntimeError, NotImplementedError, ValueError):
        return None
    return None
