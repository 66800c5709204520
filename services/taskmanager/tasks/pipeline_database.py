"""A lineage's own pipelines database (shared/pipeline_databases.py), handed to the driver that
runs the lineage's task and taken back when the task ends.

    <pipeline_databases_dir>/                     root's (0711): drivers pass, never list or write
        <lineage>/                                the running task's user's (0700) while it runs,
                                                  root's (0700) between its tasks
            pipelines.db (+ -journal, -wal, -shm) what the lineage's SQL sinks and sources wrote

When every pipeline wrote one SQLite file, a pipeline could read and change another job's SQL
sink output and its fences (`_headrace_sink_fences`) there. Now a lineage's directory is reachable
by the one driver running its task. SQLite writes its journal beside the file, so the directory,
not only the file, is the task's. Root works there through directory descriptors only
(shared/safe_fs.py): a previous holder's symbolic links are removed, never followed, and a file
with other hard links is not handed on.

Handing over: the directory is closed (root's, 0700) before its entries change owner, so no one
else adds an entry meanwhile; a newer task of the lineage (a restart that overlaps a task still
ending elsewhere) takes it from an older one, whose release then leaves it alone. Grants and
releases of the machine's TaskManagers are serialised by a flock on the top directory, which no
driver can open. A TaskManager killed with -9 cannot release: the lineage's next task takes the
directory, and before the pool hands that user to anyone (shared/sandbox_users.py) every lineage
directory it still owns is taken back, so it never reaches the user's next holder.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path
from typing import Callable

from shared import safe_fs
from shared.pipeline_databases import COMPANIONS, FILE, database_path, locked, open_directory, sqlite_url, take_back
from shared.untrusted_code import UntrustedUser

log = logging.getLogger("headrace.taskmanager.pipeline_database")


class LineageDatabase:
    """The database of the lineage of one task, run by `user`."""

    def __init__(self, directory: Path, owners: safe_fs.Ownership, user: UntrustedUser):
        self.directory, self.owners, self.user = directory, owners, user
        self.lineage: str | None = None  # set once granted

    @property
    def ids(self) -> tuple[int, int]:
        return (self.user.uid, self.user.gid) if self.user.isolated else (os.geteuid(), os.getegid())

    def grant(self, lineage: str) -> str:
        """The lineage's directory, made (or taken from its previous holder) for the task's user;
        returns the database's URL. ValueError for a lineage id that is not a plain name."""
        path = database_path(self.directory, lineage)
        uid, gid = self.ids
        me = os.geteuid()
        with safe_fs.opened(open_directory(self.directory, self.owners)) as top, locked(top):
            try:
                os.mkdir(lineage, 0o700, dir_fd=top)
            except FileExistsError:
                pass
            with safe_fs.opened(safe_fs.open_dir_at(top, lineage)) as fd:
                os.fchown(fd, me, os.getegid())
                os.fchmod(fd, 0o700)
                safe_fs.chown_tree(
                    fd, uid, gid, only=lambda u: u == me or self.owners.driver_uid(u), adopt=True, single_links=True
                )
                _make_file(fd, uid, gid)
                os.fchown(fd, uid, gid)  # last: from here on the task may write in it
        self.lineage = lineage
        log.info("pipelines database of lineage %s handed to %s: %s", lineage, self.user.name or f"uid {uid}", path)
        return sqlite_url(path)

    def release(self) -> None:
        """The task ended and its processes are gone: the directory is root's again, unless a
        newer task of the lineage holds it."""
        lineage, self.lineage = self.lineage, None
        uid, _ = self.ids
        if lineage is None or uid == os.geteuid():
            return
        try:
            with (
                safe_fs.opened(open_directory(self.directory, self.owners, create=False)) as top,
                locked(top),
                safe_fs.opened(safe_fs.open_dir_at(top, lineage)) as fd,
            ):
                if os.fstat(fd).st_uid != uid:
                    return
                take_back(fd, uid)
        except FileNotFoundError:
            return
        except OSError as exc:
            log.warning("could not take back the pipelines database of lineage %s: %s", lineage, exc)


def _make_file(dir_fd: int, uid: int, gid: int) -> None:
    """The database file, made empty if missing, so that one who reads it before the pipeline
    writes (an operator, as root) finds an empty database rather than making a root-owned file
    in its way."""
    fd = os.open(FILE, safe_fs.FILE_FLAGS | os.O_CREAT, 0o600, dir_fd=dir_fd)
    try:
        st = os.fstat(fd)
        if stat.S_ISREG(st.st_mode) and st.st_uid != uid and st.st_nlink == 1:  # chown_tree's rule
            os.fchown(fd, uid, gid)
    finally:
        os.close(fd)


def prepare(directory: Path, owners: safe_fs.Ownership, *, in_use: Callable[[int], bool]) -> None:
    """At a TaskManager's start: the top directory root's and closed; the one database every
    pipeline shared before closed to pipelines (kept for the operator); a lineage directory a
    killed TaskManager left with a user that no process runs as now (`in_use`) taken back."""
    with safe_fs.opened(open_directory(directory, owners)) as top, locked(top):
        for name in (FILE, *(FILE + c for c in COMPANIONS)):
            _close_shared_file(top, name, directory)
        for name in os.listdir(top):
            try:
                st = os.lstat(name, dir_fd=top)
                if stat.S_ISDIR(st.st_mode) and owners.driver_uid(st.st_uid) and not in_use(st.st_uid):
                    with safe_fs.opened(safe_fs.open_dir_at(top, name)) as fd:
                        take_back(fd, st.st_uid)
                    log.info(
                        "took back the pipelines database directory %s/%s left with uid %d", directory, name, st.st_uid
                    )
            except OSError as exc:
                log.warning("could not take back %s/%s: %s", directory, name, exc)


def _close_shared_file(top: int, name: str, directory: Path) -> None:
    try:
        st = os.lstat(name, dir_fd=top)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        return
    if not stat.S_ISREG(st.st_mode):
        os.unlink(name, dir_fd=top)  # a link or a FIFO a pipeline planted where the shared file was
        return
    if st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) == 0o600:
        return
    fd = os.open(name, safe_fs.FILE_FLAGS, dir_fd=top)
    try:
        os.fchown(fd, os.geteuid(), os.getegid())
        os.fchmod(fd, 0o600)
    finally:
        os.close(fd)
    log.warning(
        "%s/%s is the pipelines database every pipeline shared before each lineage got one of its own: "
        "kept, now root's and closed to pipelines (docs/runbooks/auth.md)",
        directory,
        name,
    )
