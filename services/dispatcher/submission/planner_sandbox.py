"""Where a restore-check planner runs the pipeline's code: a user of its own and a directory the
dispatcher makes for it.

A planner builds a pipeline, code the cluster did not write, like a TaskManager's driver does, so
it is confined the same way (shared/untrusted_code.py, shared/sandbox_users.py): when the
dispatcher runs as root, as a user of the drivers' pool no other running driver or planner has,
else as the dispatcher's own user (logged). Its directory:

    <tmp>/                  the dispatcher's, group the planner's own (0750): it may look in
        work/               the planner's user's (0700): HOME, TMPDIR, working directory
        artifact/<name>     the dispatcher's (0750 / 0640): the pipeline, copied before it is read
        database/           the planner's user's (0700): a copy of its lineage's pipelines database,
                            where the cluster keeps one per lineage (submission/planner_database.py)
        planner.log

so the dispatcher never writes where the planner could have put a link (issue 43: the spare
planner's artifact was copied as root into a directory its user owned).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path

from shared import safe_fs, untrusted_code
from shared.sandbox_users import Lease, SandboxUsers, SandboxUsersError

log = logging.getLogger(__name__)

DEFAULT_USERS = 32  # Settings.driver_users' default


class PlannerSandbox:
    def __init__(self, run_as: str | None, users: int = DEFAULT_USERS, *, prefix: str = "headrace-planner-"):
        self.lease = _lease(run_as, users)
        self.user = self.lease.user if self.lease is not None else _own_user()
        self.tmp = Path(tempfile.mkdtemp(prefix=prefix))
        try:
            gid = self.user.gid if self.user.isolated else os.getegid()
            os.chown(self.tmp, -1, gid)
            os.chmod(self.tmp, 0o750)
            with safe_fs.opened(safe_fs.open_trusted(self.tmp)) as fd:
                uid = self.user.uid if self.user.isolated else os.geteuid()
                os.close(safe_fs.make_dir(fd, "work", mode=0o700, uid=uid, gid=gid))
                os.close(safe_fs.make_dir(fd, "artifact", mode=0o750, uid=os.geteuid(), gid=gid))
        except BaseException:
            self.close()
            raise
        self.home = self.tmp / "work"

    def owner(self) -> tuple[int, int]:
        """The planner's uid and gid (the dispatcher's own where it has no user of its own)."""
        if self.user.isolated:
            return self.user.uid, self.user.gid
        return os.geteuid(), os.getegid()

    def make_dir(self, name: str, *, uid: int, gid: int) -> int:
        """A new directory `name` in the sandbox (0700, `uid`'s), open: files placed through it
        land where a planner that runs meanwhile cannot have put a link."""
        with safe_fs.opened(safe_fs.open_trusted(self.tmp)) as fd:
            return safe_fs.make_dir(fd, name, mode=0o700, uid=uid, gid=gid)

    def place_artifact(self, source: str | os.PathLike) -> Path:
        """A copy of the pipeline the planner may read and not change."""
        name = Path(source).name
        gid = self.user.gid if self.user.isolated else os.getegid()
        with safe_fs.opened(safe_fs.open_trusted(self.tmp / "artifact")) as fd:
            safe_fs.remove(fd, name)
            safe_fs.copy_file(source, fd, name, mode=0o640, uid=os.geteuid(), gid=gid)
        return self.tmp / "artifact" / name

    def close(self) -> None:
        """After the planner's processes were killed: its directory goes, its user is given back."""
        shutil.rmtree(self.tmp, ignore_errors=True)
        if self.lease is not None:
            self.lease.release()
            self.lease = None

    def __enter__(self) -> "PlannerSandbox":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _own_user() -> untrusted_code.UntrustedUser:
    user = untrusted_code.switchable_user(None)
    assert user is not None
    return user


def _lease(run_as: str | None, users: int) -> Lease | None:
    if not run_as:
        return None
    if os.geteuid() != 0:
        log.warning(
            "restore check: cannot run the planner as one of the drivers' users %s-0.. (this dispatcher is "
            "not root); it runs as the dispatcher's own user, with a scrubbed environment",
            run_as,
        )
        return None
    try:
        return SandboxUsers(run_as, users).acquire("restore-check planner")
    except SandboxUsersError as exc:
        log.warning(
            "restore check: cannot run the planner as one of the drivers' users (%s); it runs as the "
            "dispatcher's own user, with a scrubbed environment",
            exc,
        )
        return None
