"""The OS users pipeline code runs as: one of its own for every running driver or planner.

Drivers that share a user can write into each other's directories, read each other's memory
through /proc/<pid>/mem, and signal each other (issue 43). So every process that runs a pipeline's
code (a TaskManager's Spark driver, the dispatcher's restore-check planner) runs as a user no other
running one has: `<group>-0` .. `<group>-<N-1>`, system users without a login that
`python -m services.taskmanager.drivers.user --prepare` (scripts/bootstrap) creates, each with a
group of its own and the shared group `<group>` as a supplementary one (what an operator gives a
directory every pipeline may use). A warm driver takes its user when it starts and keeps it for its
one task.

Which process holds which user is a flock on `<LOCK_DIR>/<user>.lock`, so every cluster and
service of the machine draws from the one pool, and a holder that dies (kill -9) gives its user
back with its descriptors. Users are taken in turn (a counter under `<LOCK_DIR>/next.lock`), so a
user comes back as late as the pool allows. Before a user is handed out, and when it is given
back, what a previous holder may have left is removed (`scrub`): every process running as it,
its entries in the machine's world-writable directories (/tmp, /var/tmp, /dev/shm, /dev/mqueue)
and its System V shared memory; and when it is handed out, the lineage databases' directories it
still owns (shared/pipeline_databases.py) are taken back, under every pipelines' databases
directory a TaskManager of the machine registered (`<LOCK_DIR>/reclaim/`, root's). Files a
pipeline wrote anywhere else (a directory its operator
gave the shared group) stay its user's, and the next holder of that user could change them:
docs/runbooks/auth.md, "Trust boundaries".
"""

from __future__ import annotations

import ctypes
import fcntl
import grp
import hashlib
import logging
import os
import pwd
import signal
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from shared import safe_fs
from shared.errors import TaskError
from shared.untrusted_code import UntrustedUser

log = logging.getLogger("headrace.sandbox_users")

LOCK_DIR = Path("/run/headrace-sandbox-users")
RECLAIM = "reclaim"  # under LOCK_DIR: one file per directory whose entries a user may still own
SHARED_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/dev/mqueue")
KILL_ROUNDS = 20
_IPC_RMID = 0


class SandboxUsersError(TaskError, OSError):
    """The pool cannot give out a user; the message says why and what to do."""


def user_name(group: str, index: int) -> str:
    return f"{group}-{index}"


@dataclass(frozen=True)
class PoolUser:
    name: str
    uid: int
    gid: int


class SandboxUsers:
    """The machine's pool of `size` users named after `group` (see the module docstring)."""

    def __init__(self, group: str, size: int, *, lock_dir: Path = LOCK_DIR):
        self.group, self.size, self.lock_dir = group, size, lock_dir
        try:
            self.shared_gid = grp.getgrnam(group).gr_gid
        except KeyError:
            raise SandboxUsersError(
                f"there is no group {group!r} for the drivers' users: run scripts/bootstrap as "
                f"root (python -m services.taskmanager.drivers.user --prepare)"
            ) from None
        users, missing = [], []
        for i in range(size):
            try:
                pw = pwd.getpwnam(user_name(group, i))
            except KeyError:
                missing.append(user_name(group, i))
                continue
            if pw.pw_uid == 0 or pw.pw_uid == os.geteuid():
                raise SandboxUsersError(
                    f"the drivers' user {pw.pw_name} is uid {pw.pw_uid}: it must be an unprivileged user of its own"
                )
            users.append(PoolUser(pw.pw_name, pw.pw_uid, pw.pw_gid))
        if missing:
            raise SandboxUsersError(
                f"{len(missing)} of the {size} drivers' users are missing ({', '.join(missing[:3])}"
                f"{', ...' if len(missing) > 3 else ''}): run scripts/bootstrap as root (python -m "
                f"services.taskmanager.drivers.user --prepare), or lower driver_users (HEADRACE_DRIVER_USERS)"
            )
        self.users = users
        self._uids = frozenset(u.uid for u in users)
        self._gids = frozenset(u.gid for u in users) | {self.shared_gid}
        legacy = _uid_of(group)  # the one user all drivers shared before: what it owns is a driver's
        if legacy is not None:
            self._uids |= {legacy}

    def is_driver_uid(self, uid: int) -> bool:
        return uid in self._uids

    def is_driver_gid(self, gid: int) -> bool:
        return gid in self._gids

    def ownership(self) -> safe_fs.Ownership:
        return safe_fs.Ownership(driver_uid=self.is_driver_uid, driver_gid=self.is_driver_gid)

    def sample(self) -> UntrustedUser:
        """A user of the pool as a template (what any of them may reach is what all may)."""
        u = self.users[0]
        return UntrustedUser(u.name, u.uid, u.gid, groups=(self.shared_gid,))

    def acquire(self, purpose: str) -> Lease:
        """A user no other process of this machine holds, scrubbed; SandboxUsersError if none is free."""
        self._ensure_lock_dir()
        start = self._next_index()
        for k in range(self.size):
            user = self.users[(start + k) % self.size]
            fd = os.open(
                self.lock_dir / f"{user.name}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
            )
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()} {purpose}\n".encode())
            scrub(user.uid)
            self.take_back_directories(user.uid)
            return Lease(UntrustedUser(user.name, user.uid, user.gid, groups=(self.shared_gid,)), fd)
        raise SandboxUsersError(
            f"all {self.size} drivers' users of this machine are in use (every running driver and restore-check "
            f"planner of every cluster here holds one; see {self.lock_dir}): raise driver_users "
            f"(HEADRACE_DRIVER_USERS) and run scripts/bootstrap as root to create the new ones"
        )

    def reclaim_below(self, directory: Path) -> None:
        """Register the pipelines' databases directory `directory`: whenever a user of the pool is
        handed out, the lineage directories it owns there are taken back first."""
        self._ensure_lock_dir()
        with safe_fs.opened(safe_fs.open_trusted(self.lock_dir)) as lock_fd:
            with safe_fs.opened(
                safe_fs.make_dir(lock_fd, RECLAIM, mode=0o700, uid=os.geteuid(), gid=os.getegid(), exist_ok=True)
            ) as fd:
                path = os.path.abspath(directory)
                safe_fs.write_file(fd, registered_name(directory), path.encode(), mode=0o600)

    def take_back_directories(self, uid: int) -> None:
        """Before `uid` is handed out: the lineage directories it owns under every registered
        pipelines' databases directory become root's."""
        from shared.pipeline_databases import reclaim

        try:
            with safe_fs.opened(safe_fs.open_trusted(self.lock_dir)) as lock_fd:
                fd = safe_fs.open_dir_at(lock_fd, RECLAIM)
        except FileNotFoundError:
            return
        with safe_fs.opened(fd):
            for name in os.listdir(fd):
                if name.startswith("."):
                    continue
                try:
                    reclaim(Path(safe_fs.read_file(fd, name, max_bytes=4096)[0].decode()), uid)
                except FileNotFoundError:
                    os.unlink(name, dir_fd=fd)  # that cluster's home is gone
                except (OSError, ValueError) as exc:
                    log.warning("could not take back what uid %d kept under %s: %s", uid, name, exc)

    def _ensure_lock_dir(self) -> None:
        try:
            os.mkdir(self.lock_dir, 0o700)
        except FileExistsError:
            pass
        st = os.lstat(self.lock_dir)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
            raise SandboxUsersError(
                f"{self.lock_dir} must be a directory of uid {os.geteuid()} that no one else "
                f"may write (found uid {st.st_uid}, mode {stat.filemode(st.st_mode)})"
            )

    def _next_index(self) -> int:
        fd = os.open(self.lock_dir / "next.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            raw = os.read(fd, 32).strip()
            index = int(raw) % self.size if raw.isdigit() else 0
            os.lseek(fd, 0, os.SEEK_SET)
            os.ftruncate(fd, 0)
            os.write(fd, str((index + 1) % self.size).encode())
            return index
        finally:
            os.close(fd)


class Lease:
    """A user held by this process until `release` (or until it dies)."""

    def __init__(self, user: UntrustedUser, fd: int):
        self.user = user
        self._fd: int | None = fd

    def release(self) -> None:
        """Scrub what the holder left, then give the user back. Call once its processes are gone."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            scrub(self.user.uid)
        finally:
            os.close(fd)


def registered_name(directory: Path) -> str:
    """The file under `<lock dir>/reclaim/` that registers `directory`."""
    return hashlib.sha256(os.path.abspath(directory).encode()).hexdigest()[:32]


def _uid_of(name: str) -> int | None:
    try:
        uid = pwd.getpwnam(name).pw_uid
    except KeyError:
        return None
    return uid if uid not in (0, os.geteuid()) else None


def scrub(uid: int) -> None:
    """End every process running as `uid` and remove what it left in the machine's shared places."""
    for _ in range(KILL_ROUNDS):
        pids = processes_of(uid)
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.05)
    for directory in SHARED_DIRS:
        remove_owned(directory, uid)
    remove_shared_memory(uid)


def processes_of(uid: int) -> list[int]:
    """Processes whose real, effective, saved or filesystem uid is `uid` (zombies excepted)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status", "rb") as f:
                lines = {line.split(b":", 1)[0]: line.split()[1:] for line in f if line[:4] in (b"Uid:", b"Stat")}
        except OSError:
            continue
        if uid in {int(x) for x in lines.get(b"Uid", [])} and lines.get(b"State", [b""])[0] != b"Z":
            found.append(int(entry))
    return found


def remove_owned(directory: str, uid: int) -> int:
    """Remove the entries of `directory` (a shared, sticky one) that `uid` owns, trees and all."""
    try:
        fd = safe_fs.open_trusted(directory)
    except OSError:
        return 0  # not on this machine
    removed = 0
    try:
        for name in os.listdir(fd):
            try:
                if os.lstat(name, dir_fd=fd).st_uid == uid:
                    safe_fs.remove(fd, name)
                    removed += 1
            except OSError as exc:
                log.warning("could not remove %s/%s of uid %d: %s", directory, name, uid, exc)
    finally:
        os.close(fd)
    return removed


def shared_memory_of(uid: int) -> list[tuple[int, int]]:
    """(id, resident bytes) of the System V shared memory segments `uid` owns or created."""
    out = []
    try:
        with open("/proc/sysvipc/shm") as f:
            header = f.readline().split()
            for line in f:
                row = dict(zip(header, line.split(), strict=False))
                if int(row.get("uid", -1)) == uid or int(row.get("cuid", -1)) == uid:
                    out.append((int(row["shmid"]), int(row.get("rss", row.get("size", 0)))))
    except (OSError, ValueError, KeyError):
        return []
    return out


def remove_shared_memory(uid: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    for shmid, _ in shared_memory_of(uid):
        if libc.shmctl(shmid, _IPC_RMID, None) != 0:
            log.warning(
                "could not remove shared memory segment %d of uid %d (errno %d)", shmid, uid, ctypes.get_errno()
            )
