"""The OS users a TaskManager's Spark drivers run as (`driver_user`, default `headrace-driver`).

A pipeline is code the cluster did not write. Its driver runs as an unprivileged user, so the
services' config files, the Redis credentials, the cluster secret and the catalog (all 0600/0700
to the services' user) are out of its reach whatever it reads or scans; and as a user no other
running driver has (one of the pool `headrace-driver-0..N-1`, shared/sandbox_users.py), so that
drivers can neither write, read, signal nor ptrace each other. Switching user needs root: a
TaskManager that is not root refuses to start unless `driver_user` is "" (drivers run as the
TaskManager's own user, without that isolation; logged as a warning).

What every driver must reach, it reaches by traversal only (o+x, never o+r on the services'
directories): the Python interpreter and its packages, the checkout, the jar cache and the class
archive (made so by `scripts/bootstrap`, which runs `python -m services.taskmanager.drivers.user
--prepare`: it also creates the group `headrace-driver` and the `driver_users` users of the pool),
and the TaskManager's work, checkpoint and savepoint directories (made so by the TaskManager at
start). What a driver writes is handed to its user by the TaskManager, one directory made for it
at a time (tasks/storage.py); a directory every pipeline may use is the operator's to give to the
group (`give_to_drivers`).

    python -m services.taskmanager.drivers.user --prepare   # as root: create the users, open paths
    python -m services.taskmanager.drivers.user --check     # what the drivers' users cannot reach
"""

from __future__ import annotations

import argparse
import grp
import logging
import os
import pwd
import stat
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from shared import safe_fs
from shared.errors import TaskError
from shared.import_root import IMPORT_ROOT
from shared.sandbox_users import Lease, SandboxUsers, SandboxUsersError, user_name
from shared.spark_runtime import SparkRuntime
from shared.untrusted_code import UntrustedUser

log = logging.getLogger("headrace.taskmanager.driver_user")

DEFAULT_NAME = "headrace-driver"
SETTING = "driver_user (HEADRACE_DRIVER_USER)"
SIZE_SETTING = "driver_users (HEADRACE_DRIVER_USERS)"


class DriverUserError(TaskError, RuntimeError):
    """The TaskManager cannot run its drivers as the configured user; the message says why and what to do."""


class DriverUser(UntrustedUser):
    """An untrusted-code user (shared/untrusted_code.py: how its processes start) as the
    TaskManager checks it: which paths it can reach. Name None: the TaskManager's own user."""

    def make_traversable(self, path: Path) -> list[Path]:
        """Give others search permission (o+x, not read) on every directory above `path` that this
        user cannot pass; returns the directories changed."""
        if not self.isolated:
            return []
        changed = []
        for d in reversed(Path(os.path.abspath(path)).parents):
            try:
                st = d.stat()
            except FileNotFoundError:
                break
            if not _allows(st, self.uid, self._gids(), stat.S_IXUSR):
                os.chmod(d, stat.S_IMODE(st.st_mode) | stat.S_IXOTH)
                changed.append(d)
        return changed

    def blocked_at(self, path: Path, *, write: bool = False) -> Path | None:
        """The first directory (or the file itself) on `path` this user cannot pass (or read,
        or write into with `write`); None if it can."""
        gids = self._gids()
        p = Path(os.path.abspath(path))
        for d in reversed(p.parents):
            try:
                if not _allows(d.stat(), self.uid, gids, stat.S_IXUSR):
                    return d
            except FileNotFoundError:
                return None
        try:
            st = p.stat()
        except FileNotFoundError:
            return None
        need = stat.S_IRUSR | (stat.S_IXUSR if stat.S_ISDIR(st.st_mode) else 0) | (stat.S_IWUSR if write else 0)
        return None if _allows(st, self.uid, gids, need) else p

    def _gids(self) -> set[int]:
        if not self.isolated:
            return set(os.getgroups()) | {os.getegid()}
        return {self.gid, *self.groups}  # started with no other supplementary groups (popen_kwargs)


def _allows(st: os.stat_result, uid: int, gids: set[int], owner_bits: int) -> bool:
    if uid == 0:
        return True
    if st.st_uid == uid:
        bits = owner_bits
    elif st.st_gid in gids:
        bits = owner_bits >> 3
    else:
        bits = owner_bits >> 6
    return st.st_mode & bits == bits


@dataclass(frozen=True)
class DriverUsers:
    """The pool the TaskManager's drivers take their users from (None: no isolation, every driver
    runs as `sample`, the TaskManager's own user), and a user that stands for any of them."""

    pool: SandboxUsers | None
    sample: DriverUser

    @property
    def isolated(self) -> bool:
        return self.pool is not None

    def ownership(self) -> safe_fs.Ownership:
        return self.pool.ownership() if self.pool is not None else safe_fs.Ownership()

    def acquire(self, purpose: str) -> Lease | None:
        """A user of its own for one driver; None without isolation. Raises SandboxUsersError."""
        return self.pool.acquire(purpose) if self.pool is not None else None


def resolve(name: str | None, size: int = 1) -> DriverUsers:
    """The drivers' users for the `driver_user` and `driver_users` settings; raises
    DriverUserError when this process cannot run drivers as them."""
    if not name:
        log.warning(
            "drivers run as this TaskManager's own user (%s is empty): a pipeline can read every "
            "file this TaskManager can, its config and credentials included",
            SETTING,
        )
        return DriverUsers(None, DriverUser(None, os.geteuid(), os.getegid()))
    euid = os.geteuid()
    if euid != 0:
        raise DriverUserError(
            f"this TaskManager runs as uid {euid}, not root, so it cannot start drivers as the users {name}-0.. "
            f'({SETTING}): run it as root, or set {SETTING}="" to run drivers as its own user, without isolation'
        )
    try:
        pool = SandboxUsers(name, size)
    except SandboxUsersError as exc:
        raise DriverUserError(
            f'{exc}; {SETTING}="" runs drivers as the TaskManager\'s own user, without isolation'
        ) from None
    s = pool.sample()
    return DriverUsers(pool, DriverUser(s.name, s.uid, s.gid, groups=s.groups))


def give_to_drivers(directory: Path, name: str | None, files: tuple[str, ...] = ()) -> None:
    """Open a directory every pipeline writes in (the lake of Delta tables, an operator's shared
    input or output directory) to the drivers' group, when this process is root and the group
    exists: group-writable, setgid (what is made there keeps the group) and sticky (a pipeline
    removes or renames only what its own user made), with `files` made group-readable and
    -writable in it (created empty if missing).
    Otherwise leave it as it is."""
    if not name or os.geteuid() != 0:
        return
    try:
        gid = grp.getgrnam(name).gr_gid
    except KeyError:
        return
    os.chown(directory, -1, gid, follow_symlinks=False)
    os.chmod(directory, 0o3770)
    for f in files:
        fd = os.open(directory / f, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o660)
        try:
            os.fchown(fd, -1, gid)
            os.fchmod(fd, 0o660)
        finally:
            os.close(fd)
    DriverUser(name, -1, gid).make_traversable(directory)


def runtime_paths(runtime: SparkRuntime | None = None) -> list[Path]:
    """What every driver reads: the interpreter, its packages, the checkout, the jar cache and the
    class archive."""
    paths = [
        Path(os.path.realpath(sys.executable)),
        Path(sysconfig.get_paths()["purelib"]),
        Path(sysconfig.get_paths()["platlib"]),
        IMPORT_ROOT / "services",
    ]
    if runtime is not None:
        paths += runtime.paths()
    return list(dict.fromkeys(paths))


def unreachable(user: DriverUser, paths: list[Path]) -> list[str]:
    """'path (blocked at dir)' for every path the driver user cannot reach."""
    out = []
    for p in paths:
        at = user.blocked_at(p)
        if at is not None:
            out.append(f"{p} (blocked at {at}, mode {stat.filemode(at.stat().st_mode)})")
    return out


def _run(cmd: list[str]) -> None:
    subprocess.run(cmd, check=True)


def create_users(name: str, size: int) -> int:
    """The group `name` and the users `name-0`..`name-<size-1>`, each with a group of its own and
    `name` as a supplementary one; only what is missing is created. Returns how many users were."""
    try:
        grp.getgrnam(name)
    except KeyError:
        _run(["groupadd", "--system", name])
        print(f"driver users: created the group {name}")
    made = 0
    for i in range(size):
        user = user_name(name, i)
        try:
            pwd.getpwnam(user)
            continue
        except KeyError:
            pass
        own_group = ["--gid", user] if _group_exists(user) else ["--user-group"]
        _run(
            [
                "useradd",
                "--system",
                "--no-create-home",
                "--home-dir",
                "/nonexistent",
                "--shell",
                "/usr/sbin/nologin",
                *own_group,
                "--groups",
                name,
                user,
            ]
        )
        made += 1
    if made:
        print(f"driver users: created {made} of {name}-0..{name}-{size - 1}")
    return made


def _group_exists(name: str) -> bool:
    try:
        grp.getgrnam(name)
        return True
    except KeyError:
        return False


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m services.taskmanager.drivers.user", description=__doc__.split("\n")[0])
    p.add_argument("--prepare", action="store_true", help="as root: create the users, make the runtime traversable")
    p.add_argument("--check", action="store_true", help="list what the drivers' users cannot reach")
    args = p.parse_args(argv)
    from shared.settings import load_settings

    settings = load_settings()
    name, size = settings.driver_user, settings.driver_users
    if not name:
        print(f"driver users: none ({SETTING} is empty): drivers run as the TaskManager's own user")
        return 0
    if args.prepare:
        if os.geteuid() != 0:
            print(
                f"driver users: not root, so {name}-0.. are neither created nor given access; the TaskManagers "
                f'need {SETTING}="" or root',
                file=sys.stderr,
            )
            return 1
        create_users(name, size)
    try:
        pool = SandboxUsers(name, size)
    except SandboxUsersError as exc:
        print(f"driver users: {exc}", file=sys.stderr)
        return 1
    s = pool.sample()
    user = DriverUser(s.name, s.uid, s.gid, groups=s.groups)
    paths = runtime_paths(SparkRuntime.from_settings(settings))
    if args.prepare:
        for path in paths:
            for d in user.make_traversable(path):
                print(f"driver users: made {d} traversable (o+x) for {name}-0..")
    missing = unreachable(user, paths)
    for line in missing:
        print(f"driver users: {user.name} cannot reach {line}", file=sys.stderr)
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
