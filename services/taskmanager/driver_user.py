"""The OS user a TaskManager's Spark drivers run as (`driver_user`, default `headrace-driver`).

A pipeline is code the cluster did not write. Its driver runs as an unprivileged user of its own,
so the services' config files, the Redis credentials, the cluster secret and the catalog (all
0600/0700 to the services' user) are out of its reach whatever it reads or scans. Switching user
needs root: a TaskManager that is not root refuses to start unless `driver_user` is "" (drivers
run as the TaskManager's own user, without that isolation; logged as a warning).

What the driver user must reach, it reaches by traversal only (o+x, never o+r on the services'
directories): the Python interpreter and its packages, the checkout, the class archive (made so by
`scripts/bootstrap`, which runs `python -m services.taskmanager.driver_user --prepare`), and the
TaskManager's work, checkpoint and savepoint directories (made so by the TaskManager at start).
The directories a driver writes are handed to it (`hand_over`): its own work directory (0700),
the job's checkpoint directory and a savepoint's parent. The other services run as root and read,
copy and delete what drivers wrote whoever owns it.

    python -m services.taskmanager.driver_user --prepare   # as root: create the user, open paths
    python -m services.taskmanager.driver_user --check     # what the driver user cannot reach
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
from pathlib import Path

from shared.errors import TaskError
from shared.import_root import IMPORT_ROOT
from shared.spark_runtime import SparkRuntime
from shared.untrusted_code import UntrustedUser

log = logging.getLogger("headrace.taskmanager.driver_user")

DEFAULT_NAME = "headrace-driver"
SETTING = "driver_user (HEADRACE_DRIVER_USER)"


class DriverUserError(TaskError, RuntimeError):
    """The TaskManager cannot run its drivers as the configured user; the message says why and what to do."""


class DriverUser(UntrustedUser):
    """The untrusted-code user (shared/untrusted_code.py: how its processes start) as the
    TaskManager prepares it: the directories its drivers write are handed over, the paths they
    read made traversable. Name None: the TaskManager's own user, no isolation."""

    def hand_over(self, path: Path, mode: int | None = None) -> None:
        """Make `path` (a directory the driver writes in) this user's."""
        if not self.isolated:
            return
        st = path.lstat()
        if stat.S_ISLNK(st.st_mode):
            raise DriverUserError(f"{path} is a symbolic link: not handed to the driver user")
        if (st.st_uid, st.st_gid) != (self.uid, self.gid):
            os.chown(path, self.uid, self.gid, follow_symlinks=False)
        if mode is not None and stat.S_IMODE(st.st_mode) != mode:
            os.chmod(path, mode)

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
        return {self.gid}  # started with no supplementary groups (popen_kwargs)


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


def resolve(name: str | None) -> DriverUser:
    """The driver user for the `driver_user` setting; raises DriverUserError when this process
    cannot run drivers as it."""
    if not name:
        log.warning("drivers run as this TaskManager's own user (%s is empty): a pipeline can read every "
                    "file this TaskManager can, its config and credentials included", SETTING)
        return DriverUser(None, os.geteuid(), os.getegid())
    try:
        pw = pwd.getpwnam(name)
    except KeyError:
        raise DriverUserError(
            f"the driver user {name!r} ({SETTING}) does not exist: run scripts/bootstrap as root, which creates it "
            f"(useradd --system --shell /usr/sbin/nologin {name}), or name an existing unprivileged user; "
            f"{SETTING}=\"\" runs drivers as the TaskManager's own user, without isolation") from None
    if pw.pw_uid == 0:
        raise DriverUserError(f"the driver user {name!r} ({SETTING}) is root: name an unprivileged user")
    euid = os.geteuid()
    if pw.pw_uid == euid:
        raise DriverUserError(
            f"the driver user {name!r} ({SETTING}) is the TaskManager's own user, so pipelines would reach its "
            f"config and credentials: run the TaskManager as root (it then starts drivers as {name!r}), or set "
            f"{SETTING}=\"\" to accept drivers without isolation")
    if euid != 0:
        raise DriverUserError(
            f"this TaskManager runs as uid {euid}, not root, so it cannot start drivers as {name!r} ({SETTING}): "
            f"run it as root, or set {SETTING}=\"\" to run drivers as its own user, without isolation")
    return DriverUser(name, pw.pw_uid, pw.pw_gid)


def give_to_driver_user(directory: Path, name: str | None) -> None:
    """Hand a directory a pipeline writes in (e.g. its SQLite database's) to the driver user, when
    this process is root and that user exists; otherwise leave it as it is."""
    if not name or os.geteuid() != 0:
        return
    try:
        pw = pwd.getpwnam(name)
    except KeyError:
        return
    os.chown(directory, pw.pw_uid, pw.pw_gid, follow_symlinks=False)
    DriverUser(name, pw.pw_uid, pw.pw_gid).make_traversable(directory)


def runtime_paths(runtime: SparkRuntime | None = None) -> list[Path]:
    """What every driver reads: the interpreter, its packages, the checkout, the jar cache and the
    class archive."""
    paths = [Path(os.path.realpath(sys.executable)), Path(sysconfig.get_paths()["purelib"]),
             Path(sysconfig.get_paths()["platlib"]), IMPORT_ROOT / "services"]
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


def _create(name: str) -> None:
    try:
        pwd.getpwnam(name)
        return
    except KeyError:
        pass
    try:
        grp.getgrnam(name)
        group = ["--gid", name]
    except KeyError:
        group = ["--user-group"]
    subprocess.run(["useradd", "--system", "--no-create-home", "--home-dir", "/nonexistent",
                    "--shell", "/usr/sbin/nologin", *group, name], check=True)
    print(f"driver user: created {name}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m services.taskmanager.driver_user", description=__doc__.split("\n")[0])
    p.add_argument("--prepare", action="store_true", help="as root: create the user, make the runtime traversable")
    p.add_argument("--check", action="store_true", help="list what the driver user cannot reach")
    args = p.parse_args(argv)
    from shared.settings import load_settings

    settings = load_settings()
    name = settings.driver_user
    if not name:
        print(f"driver user: none ({SETTING} is empty): drivers run as the TaskManager's own user")
        return 0
    if args.prepare:
        if os.geteuid() != 0:
            print(f"driver user: not root, so {name!r} is neither created nor given access; the TaskManagers "
                  f"need {SETTING}=\"\" or root", file=sys.stderr)
            return 1
        _create(name)
    try:
        user = resolve(name) if os.geteuid() == 0 else DriverUser(name, *pwd.getpwnam(name)[2:4])
    except (DriverUserError, KeyError) as exc:
        print(f"driver user: {exc}", file=sys.stderr)
        return 1
    paths = runtime_paths(SparkRuntime.from_settings(settings))
    if args.prepare:
        for path in paths:
            for d in user.make_traversable(path):
                print(f"driver user: made {d} traversable (o+x) for {name}")
    missing = unreachable(user, paths)
    for line in missing:
        print(f"driver user: {name} cannot reach {line}", file=sys.stderr)
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
