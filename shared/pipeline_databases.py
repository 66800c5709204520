"""Where a lineage's own SQLite pipelines database is, when the cluster keeps them locally.

`headrace up` without a `pipeline_catalog_url` gives each lineage (a job and the jobs that
continue it: restarts, upgrades, restores; shared/job_lineage.py) a database of its own,
`<pipeline_databases_dir>/<lineage>/pipelines.db`. The TaskManager makes the lineage's directory
for the task's OS user, 0700, for as long as the task runs, and takes it back when it ends
(services/taskmanager/tasks/pipeline_database.py), so no other pipeline can open it, nor the SQL
sinks' fence table in it. The dispatcher shows the path in a job's details.

A cluster-wide `pipeline_catalog_url` (the operator's database) wins: every job then shares it.

Root's side, shared by the TaskManager and the pool of users: the top directory (`open_directory`:
root's, 0711, so drivers pass and never list or write), the flock that serialises a host's changes
there (`locked`), and taking a lineage's directory back from a user (`take_back`, `reclaim`: the
pool calls the latter before it hands a user out again, shared/sandbox_users.py).
"""

from __future__ import annotations

import fcntl
import logging
import os
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from shared import safe_fs
from shared.pipeline_redis import check_lineage

if TYPE_CHECKING:
    from shared.settings import Settings

log = logging.getLogger("headrace.pipeline_databases")

DIRECTORY = "pipelines"
FILE = "pipelines.db"
# What SQLite keeps beside the file while it writes (a rollback journal or the WAL's).
COMPANIONS = ("-journal", "-wal", "-shm")


def database_path(directory: Path, lineage: str) -> Path:
    """The lineage's database file under `directory` (ValueError for a lineage id that is not one
    plain path component)."""
    return Path(directory) / check_lineage(lineage) / FILE


def sqlite_url(path: Path) -> str:
    return f"sqlite:///{path}"


def local_database(settings: "Settings", lineage: str, job_config: Mapping[str, Any] | None = None) -> Path | None:
    """The lineage's own local database when a job of it gets one (the cluster keeps them locally,
    names no database for every job, and the job names none of its own); None otherwise."""
    directory = settings.pipeline_databases_dir
    if directory is None or settings.pipeline_catalog_url or (job_config or {}).get("catalog_url"):
        return None
    return database_path(directory, lineage)


def open_directory(directory: Path, owners: safe_fs.Ownership, *, create: bool = True) -> int:
    """The top directory by fd: root's, 0711 (created unless not `create`; its parent is the
    operator's, as configured)."""
    directory = Path(os.path.abspath(directory))
    if create:
        directory.parent.mkdir(parents=True, exist_ok=True)
    with safe_fs.opened(safe_fs.open_trusted(directory.parent)) as parent:
        fd = safe_fs.ensure_dirs(parent, directory.name, owners, mode=0o711, where=str(directory.parent), create=create)
    st = os.fstat(fd)
    if (st.st_uid, st.st_gid) != (os.geteuid(), os.getegid()):
        os.fchown(fd, os.geteuid(), os.getegid())
    if stat.S_IMODE(st.st_mode) != 0o711:
        os.fchmod(fd, 0o711)  # an older Headrace left it group-writable, setgid and sticky
    return fd


class locked:
    """An exclusive flock on the top directory's fd, waited for within safe_fs.LOCK_TIMEOUT_S."""

    def __init__(self, fd: int):
        self.fd = fd

    def __enter__(self) -> None:
        safe_fs.lock_exclusive(self.fd, "the pipelines' databases directory")

    def __exit__(self, *exc: object) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_UN)


def take_back(fd: int, uid: int) -> None:
    """The lineage directory open at `fd`, and what `uid` owns in it, root's (0700)."""
    os.fchown(fd, os.geteuid(), os.getegid())
    os.fchmod(fd, 0o700)
    safe_fs.chown_tree(fd, os.geteuid(), os.getegid(), only=lambda u: u == uid)


def reclaim(directory: Path, uid: int) -> int:
    """Take back every lineage directory under `directory` that `uid` owns: called when a user of
    the pool changes hands (shared/sandbox_users.py), so a directory its previous holder kept (a
    TaskManager killed with -9 gives its users back with its descriptors) never reaches the next.
    Returns how many were taken back."""
    taken = 0
    with safe_fs.opened(safe_fs.open_trusted(directory)) as top, locked(top):
        for name in os.listdir(top):
            try:
                st = os.lstat(name, dir_fd=top)
                if stat.S_ISDIR(st.st_mode) and st.st_uid == uid:
                    with safe_fs.opened(safe_fs.open_dir_at(top, name)) as fd:
                        take_back(fd, uid)
                    taken += 1
                    log.info("took back the pipelines database directory %s/%s left with uid %d", directory, name, uid)
            except OSError as exc:
                log.warning("could not take back %s/%s from uid %d: %s", directory, name, uid, exc)
    return taken
