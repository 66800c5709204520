"""A restore-check planner's copy of the lineage's own pipelines database.

Where the cluster keeps one SQLite database per lineage (shared/pipeline_databases.py), the
lineage's directory belongs to the driver running its task and is handed to no one else. A
changed pipeline that reads a table while it builds (`ctx.sources.sql_table`: a dimension table
for a stream-static join) must still find its rows when the dispatcher plans it against the
lineage's snapshot, so the planner gets a copy: taken by root through directory descriptors that
follow no link, of regular files with no other hard link, and given to the planner's own user in
its sandbox (submission/planner_sandbox.py). Root never opens the file as a database: it holds
bytes a pipeline wrote.

The copy is of a database another process may be writing: the file and its write-ahead log are
copied until neither changed while they were read (a checkpoint moving the log into the file
between the two copies would pair a file and a log of different generations).
"""

from __future__ import annotations

import logging
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from shared import pipeline_databases, safe_fs
from shared.errors import StateError

if TYPE_CHECKING:
    from services.dispatcher.submission.planner_sandbox import PlannerSandbox
    from shared.settings import Settings

log = logging.getLogger(__name__)

MAX_BYTES = 1024**3  # a planner reads dimension tables, not a warehouse
ATTEMPTS = 3
WAL = pipeline_databases.FILE + "-wal"
COPY_DIR = "database"
NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class NotCopied(StateError, OSError):
    """The lineage's database could not be copied safely (the planner gets none)."""


@dataclass(frozen=True)
class LineageDatabase:
    directory: Path  # the cluster's pipeline_databases_dir
    lineage: str

    @classmethod
    def for_restore(
        cls, settings: "Settings", lineage: str | None, config: Mapping[str, Any]
    ) -> "LineageDatabase | None":
        """The database the restored job's task will get, when it is a lineage's local one."""
        if lineage is None or pipeline_databases.local_database(settings, lineage, config) is None:
            return None
        assert settings.pipeline_databases_dir is not None
        return cls(Path(settings.pipeline_databases_dir), lineage)

    def planner_config(self, box: "PlannerSandbox", config: Mapping[str, Any]) -> dict[str, Any]:
        """`config` with catalog_url naming the planner's copy, if one could be made."""
        try:
            copy = self.place(box)
        except (OSError, ValueError) as exc:
            log.warning(
                "restore check: the planner gets no copy of lineage %s's pipelines database (%s); "
                "a pipeline that reads a table while it builds fails the check",
                self.lineage,
                exc,
            )
            return dict(config)
        if copy is None:
            return dict(config)
        return {**config, "catalog_url": pipeline_databases.sqlite_url(copy)}

    def place(self, box: "PlannerSandbox") -> Path | None:
        """Copy the database into the planner's sandbox, owned by its user; its path, or None when
        the lineage has no database yet."""
        top = Path(os.path.abspath(self.directory))
        if not top.is_dir():
            return None
        with safe_fs.opened(safe_fs.open_trusted(top)) as top_fd:
            try:
                source = safe_fs.open_dir_at(top_fd, pipeline_databases.database_path(top, self.lineage).parent.name)
            except FileNotFoundError:
                return None
            with safe_fs.opened(source):
                uid, gid = box.owner()
                with safe_fs.opened(box.make_dir(COPY_DIR, uid=uid, gid=gid)) as target:
                    if not _copy_consistent(source, target, uid, gid):
                        return None
        return box.tmp / COPY_DIR / pipeline_databases.FILE


def _copy_consistent(source: int, target: int, uid: int, gid: int) -> bool:
    """Copy the file and its log until neither changed meanwhile; False if there is no file."""
    for _ in range(ATTEMPTS):
        before = _versions(source)
        if before[pipeline_databases.FILE] is None:
            return False
        for name, version in before.items():
            safe_fs.remove(target, name)
            if version is not None:
                _copy_one(source, name, target, uid, gid)
        if _versions(source) == before:
            return True
    raise NotCopied(f"the database changed during each of {ATTEMPTS} copies")


def _versions(dir_fd: int) -> dict[str, tuple[int, int, int] | None]:
    found: dict[str, tuple[int, int, int] | None] = {}
    for name in (pipeline_databases.FILE, WAL):
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            found[name] = None
            continue
        found[name] = (st.st_ino, st.st_size, st.st_mtime_ns)
    return found


def _copy_one(source: int, name: str, target: int, uid: int, gid: int) -> None:
    fd = os.open(name, safe_fs.FILE_FLAGS, dir_fd=source)
    with os.fdopen(fd, "rb") as src:
        st = os.fstat(src.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
            raise NotCopied(f"{name} is not a regular file of one link")
        if st.st_size > MAX_BYTES:
            raise NotCopied(f"{name} holds {st.st_size} bytes, more than the {MAX_BYTES} a planner is given")
        dst_fd = os.open(name, NEW_FILE, 0o600, dir_fd=target)
        with os.fdopen(dst_fd, "wb") as dst:
            left = st.st_size  # what it held when looked at: a file growing meanwhile is copied again
            while left > 0:
                chunk = src.read(min(left, 1024 * 1024))
                if not chunk:
                    break
                dst.write(chunk)
                left -= len(chunk)
            os.fchown(dst.fileno(), uid, gid)
