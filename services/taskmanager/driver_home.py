"""A driver's user and directories, as the TaskManager (root) makes them and takes them back.

    <taskmanager>/drivers/<driver id>/            root's, group the driver's own (0750): it may
                                                  look in, never write
        work/                                     the driver's user's (0700): its HOME, TMPDIR,
                                                  working directory and --workdir
        artifact/<name>                           root's (0750 / 0640): the pipeline it runs
        .task-waiting                             made by root: a task waits (task_protocol.py)

Whatever the TaskManager writes for a driver goes where the driver cannot write, so no name there
can be a link a pipeline planted (issue 43: an artifact copied as root through a symbolic link
in a driver's own directory). The driver's user is its own for as long as it lives
(shared/sandbox_users.py): given when it starts, scrubbed and given back when it has exited, after
its task's snapshots were taken back (task_storage.py).
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

from services.taskmanager.task_storage import StorageRoots, TaskStorage
from shared import safe_fs
from shared import task_protocol as tp
from shared.sandbox_users import Lease
from shared.untrusted_code import UntrustedUser

log = logging.getLogger("headrace.taskmanager.driver_home")

WORK = "work"
ARTIFACT = "artifact"


class DriverHome:
    """The directories of the driver `id` under `drivers`, for `user` (held through `lease`)."""

    def __init__(self, drivers: Path, driver_id: str, user: UntrustedUser, lease: Lease | None = None):
        self.dir = drivers / driver_id
        self.workdir = self.dir / WORK
        self.user, self.lease = user, lease
        self.storage: TaskStorage | None = None

    @property
    def ids(self) -> tuple[int, int]:
        return (self.user.uid, self.user.gid) if self.user.isolated else (os.geteuid(), os.getegid())

    def make(self) -> None:
        """Create the driver's directory and its work directory (neither there before)."""
        self.dir.parent.mkdir(parents=True, exist_ok=True)
        uid, gid = self.ids
        with safe_fs.opened(safe_fs.open_trusted(self.dir.parent)) as drivers:
            with safe_fs.opened(safe_fs.make_dir(drivers, self.dir.name, mode=0o750, uid=os.geteuid(),
                                                 gid=gid)) as home:
                os.close(safe_fs.make_dir(home, WORK, mode=0o700, uid=uid, gid=gid))

    def waiting_marker(self) -> Path:
        return self.dir / tp.TASK_WAITING_MARKER

    def mark_waiting(self) -> None:
        """Tell the driver a task waits for it: a file in its directory, made by root."""
        with safe_fs.opened(safe_fs.open_trusted(self.dir)) as home:
            os.close(os.open(tp.TASK_WAITING_MARKER, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644,
                             dir_fd=home))

    def place_artifact(self, source: Path) -> Path:
        """A copy of the pipeline `source` the driver may read and not change."""
        _, gid = self.ids
        with safe_fs.opened(safe_fs.open_trusted(self.dir)) as home:
            with safe_fs.opened(safe_fs.make_dir(home, ARTIFACT, mode=0o750, uid=os.geteuid(), gid=gid,
                                                 exist_ok=True)) as art:
                safe_fs.remove(art, source.name)
                safe_fs.copy_file(source, art, source.name, mode=0o640, uid=os.geteuid(), gid=gid)
        return self.dir / ARTIFACT / source.name

    def grant_storage(self, roots: StorageRoots, spec: tp.TaskSpec) -> dict:
        """The task's attempt directory (and restore view); the spec's changed fields. Without
        storage roots (a sandbox made without settings) only the directory is made."""
        if not roots.roots:
            Path(spec.checkpoint_dir).mkdir(parents=True, exist_ok=True)
            return {}
        self.storage = TaskStorage(roots, self.user)
        return self.storage.prepare(spec)

    def remove(self) -> None:
        """After the driver exited and its processes are gone: its snapshots taken back, its
        directories removed, its user scrubbed and given back."""
        if self.storage is not None:
            self.storage.release()
        shutil.rmtree(self.dir, ignore_errors=True)
        if self.lease is not None:
            self.lease.release()
            self.lease = None
