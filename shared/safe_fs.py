"""Root's file operations in directories an untrusted process may have written.

A pipeline's driver writes in its own directories, and owned, or still owns, some of the ones
below a storage root. A process running as root that opens a path there by name follows whatever
the pipeline put in its way: a symbolic link to /etc made root copy, chmod and chown through it
(issue 43). So every operation here starts from a directory the caller trusts (a storage root as
the operator configured it, a directory root created) and goes down one component at a time
through directory file descriptors, with O_NOFOLLOW and O_EXCL: a symbolic link, a FIFO or a file
where a directory is expected is refused (`UnsafePath`), never followed; a directory a driver's
user owns where root's own is expected is taken back (fchown on the descriptor opened, not on a
name that could be swapped meanwhile).

`Ownership` says which users and groups are the drivers' (shared/sandbox_users.py): what "a
driver could have written this" means.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import shutil
import stat
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path, PurePath
from typing import Callable, Iterator

from shared.errors import TaskError

log = logging.getLogger("headrace.safe_fs")

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# Opens a file to read or fchmod it: never blocks on a FIFO, never makes a terminal ours.
FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


class UnsafePath(TaskError, OSError):
    """A path root refused to follow (a symbolic link, or not a directory where one belongs)."""


@dataclass(frozen=True)
class Ownership:
    """Who root's directories belong to, and which users and groups are the drivers'."""

    uid: int = field(default_factory=os.geteuid)
    gid: int = field(default_factory=os.getegid)
    driver_uid: Callable[[int], bool] = lambda uid: False
    driver_gid: Callable[[int], bool] = lambda gid: False

    def driver_may_write(self, st: os.stat_result) -> bool:
        """Whether a driver could create, rename or remove entries of this directory."""
        mode = st.st_mode
        return (
            self.driver_uid(st.st_uid)
            or bool(mode & stat.S_IWOTH)
            or (bool(mode & stat.S_IWGRP) and self.driver_gid(st.st_gid))
        )


def open_dir_at(dir_fd: int, name: str) -> int:
    """The directory `name` below `dir_fd`, by fd; UnsafePath for a symbolic link or a non-directory."""
    return _open_dir(name, dir_fd)


def _open_dir(name: str | os.PathLike, dir_fd: int | None) -> int:
    try:
        return os.open(name, DIR_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise UnsafePath(exc.errno, f"{name} is a symbolic link or not a directory: not followed") from None
        raise


def open_trusted(path: str | os.PathLike) -> int:
    """A directory the operator configured (symbolic links in it are the operator's), by fd."""
    return os.open(os.path.realpath(path), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)


def secure_dir(fd: int, owners: Ownership, *, where: str, mode_or: int = 0o711) -> None:
    """Make the directory open at `fd` root's and closed to drivers' writes: a driver's user's
    becomes root's (it was handed over by an older Headrace, or squatted), and the group's write
    bit goes where the group is the drivers'; `mode_or` is added (traversal for others)."""
    st = os.fstat(fd)
    if owners.driver_uid(st.st_uid) or (st.st_uid != owners.uid and owners.driver_may_write(st)):
        log.warning(
            "%s belonged to uid %d (mode %o), which a pipeline may use; taking it back",
            where,
            st.st_uid,
            stat.S_IMODE(st.st_mode),
        )
        os.fchown(fd, owners.uid, owners.gid)
    mode = stat.S_IMODE(st.st_mode)
    new = (mode & ~stat.S_IWOTH) | mode_or
    if owners.driver_gid(st.st_gid) or owners.driver_uid(st.st_uid):
        new &= ~stat.S_IWGRP
    if new != mode:
        os.fchmod(fd, new)


def ensure_dirs(
    root_fd: int, rel: PurePath | str, owners: Ownership, *, mode: int = 0o711, where: str = "", create: bool = True
) -> int:
    """Open (creating, unless not `create`) `rel` below the trusted directory `root_fd`, each
    component root's and closed to drivers (`secure_dir`); returns the last one's fd (the caller
    closes it)."""
    fd = os.dup(root_fd)
    at = where
    try:
        for part in PurePath(rel).parts:
            if part in ("", ".", "..", "/"):
                raise UnsafePath(errno.EINVAL, f"{rel}: only plain names below a storage root")
            at = f"{at}/{part}"
            if create:
                try:
                    os.mkdir(part, mode, dir_fd=fd)
                except FileExistsError:
                    pass
            nxt = _open_dir(part, fd)
            os.close(fd)
            fd = nxt
            secure_dir(fd, owners, where=at, mode_or=mode & 0o111)
        return fd
    except BaseException:
        os.close(fd)
        raise


def make_dir(parent_fd: int, name: str, *, mode: int, uid: int, gid: int, exist_ok: bool = False) -> int:
    """Create `name` (not there before, unless `exist_ok`: then it must be a real directory) and
    give it to uid:gid with `mode`; returns its fd."""
    try:
        os.mkdir(name, 0o700, dir_fd=parent_fd)
    except FileExistsError:
        if not exist_ok:
            raise
    fd = _open_dir(name, parent_fd)
    try:
        os.fchown(fd, uid, gid)
        os.fchmod(fd, mode)
    except BaseException:
        os.close(fd)
        raise
    return fd


def write_file(
    parent_fd: int, name: str, data: bytes, *, mode: int = 0o644, uid: int | None = None, gid: int | None = None
) -> None:
    """Write `name` whole and atomically (a new temporary file renamed over it)."""
    tmp = f".{name}.{os.urandom(4).hex()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=parent_fd)
    try:
        with os.fdopen(fd, "wb", closefd=False) as f:
            f.write(data)
            f.flush()
            os.fsync(fd)
        if uid is not None:
            os.fchown(fd, uid, gid if gid is not None else -1)
        os.fchmod(fd, mode)
    except BaseException:
        os.close(fd)
        os.unlink(tmp, dir_fd=parent_fd)
        raise
    os.close(fd)
    os.replace(tmp, name, src_dir_fd=parent_fd, dst_dir_fd=parent_fd)


def copy_file(
    source: str | os.PathLike,
    parent_fd: int,
    name: str,
    *,
    mode: int = 0o644,
    uid: int | None = None,
    gid: int | None = None,
) -> None:
    """Copy the file `source` (a path root trusts) into the new file `name` below `parent_fd`."""
    with open(source, "rb") as src:
        dst_fd = os.open(
            name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=parent_fd
        )
        with os.fdopen(dst_fd, "wb") as dst:
            shutil.copyfileobj(src, dst, 1024 * 1024)
            dst.flush()
            if uid is not None:
                os.fchown(dst.fileno(), uid, gid if gid is not None else -1)
            os.fchmod(dst.fileno(), mode)


def read_file(parent_fd: int, name: str, *, max_bytes: int) -> tuple[bytes, os.stat_result]:
    """A regular file's bytes (at most `max_bytes`, else ValueError) and its stat, not following
    a symbolic link and never blocking on a FIFO."""
    fd = os.open(name, FILE_FLAGS, dir_fd=parent_fd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafePath(errno.EINVAL, f"{name} is not a regular file")
        if st.st_size > max_bytes:
            raise ValueError(f"{name} holds {st.st_size} bytes, more than the {max_bytes} expected")
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read(max_bytes + 1)
        if len(data) > max_bytes:
            raise ValueError(f"{name} grew past the {max_bytes} bytes expected")
        return data, st
    finally:
        os.close(fd)


# How long root waits for another process of this host to end its change under a flock.
LOCK_TIMEOUT_S = 30.0


def lock_exclusive(fd: int, what: str, timeout_s: float = LOCK_TIMEOUT_S) -> None:
    """An exclusive flock on `fd`, waited for at most `timeout_s`: TimeoutError naming `what`
    (a holder that hangs, say on a stalled file system, fails the one change, not the process)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{what} stayed locked by another process for {timeout_s:.0f} s (who holds it: "
                    f"`fuser -v` on it, or `grep FLOCK /proc/locks`)"
                ) from None
            time.sleep(0.01)


@contextmanager
def opened(fd: int) -> Iterator[int]:
    try:
        yield fd
    finally:
        os.close(fd)


def walk(top_fd: int) -> Iterator[tuple[int, list[str], list[str]]]:
    """(directory fd, subdirectory names, other names) of every directory below `top_fd`, top
    first; symbolic links are never followed (os.fwalk checks each directory it enters is the
    one it listed)."""
    for _path, dirnames, filenames, dirfd in os.fwalk(".", dir_fd=top_fd, follow_symlinks=False):
        yield dirfd, dirnames, filenames


def chown_tree(
    top_fd: int,
    uid: int,
    gid: int,
    *,
    only: Callable[[int], bool] = lambda uid: True,
    files_readable: bool = False,
    adopt: bool = False,
    single_links: bool = False,
) -> int:
    """Give every entry below `top_fd` (and the directory itself) whose owner `only` accepts to
    uid:gid; `files_readable` adds read for all to regular files (the directories above them
    decide who reaches them). `adopt` (a tree another user may have laid out): symbolic links are
    removed, not followed, and nothing stays writable by group or others. `single_links`: a file
    with other hard links keeps its owner (the other name may be anywhere on the filesystem).
    Returns how many entries changed owner."""
    changed = 0
    st = os.fstat(top_fd)
    if only(st.st_uid):
        os.fchown(top_fd, uid, gid)
        changed += 1
    if adopt and st.st_mode & 0o022:
        os.fchmod(top_fd, stat.S_IMODE(st.st_mode) & ~0o022)
    for dirfd, dirnames, filenames in walk(top_fd):
        for name in dirnames + filenames:
            try:
                st = os.lstat(name, dir_fd=dirfd)
                if adopt and stat.S_ISLNK(st.st_mode):
                    os.unlink(name, dir_fd=dirfd)
                    continue
                if adopt and st.st_mode & 0o022:
                    _chmod_at(dirfd, name, st, stat.S_IMODE(st.st_mode) & ~0o022)
                if single_links and not stat.S_ISDIR(st.st_mode) and st.st_nlink > 1:
                    log.warning("%s has %d hard links: its owner is left as it is", name, st.st_nlink)
                elif only(st.st_uid):
                    os.chown(name, uid, gid, dir_fd=dirfd, follow_symlinks=False)
                    changed += 1
                if files_readable and stat.S_ISREG(st.st_mode) and st.st_mode & 0o444 != 0o444:
                    _chmod_file(dirfd, name, 0o444)
            except FileNotFoundError:
                continue  # removed meanwhile
    return changed


def add_read(top_fd: int) -> None:
    """Read for all on every regular file below `top_fd`, owners unchanged."""
    for dirfd, _dirnames, filenames in walk(top_fd):
        for name in filenames:
            try:
                if stat.S_ISREG(os.lstat(name, dir_fd=dirfd).st_mode):
                    _chmod_file(dirfd, name, 0o444)
            except FileNotFoundError:
                continue


def _chmod_at(dirfd: int, name: str, st: os.stat_result, mode: int) -> None:
    """Set the mode of the directory or regular file `name` (as lstat saw it), through an fd."""
    if stat.S_ISDIR(st.st_mode):
        with opened(_open_dir(name, dirfd)) as fd:
            os.fchmod(fd, mode)
    elif stat.S_ISREG(st.st_mode):
        fd = os.open(name, FILE_FLAGS, dir_fd=dirfd)
        try:
            if stat.S_ISREG(os.fstat(fd).st_mode):
                os.fchmod(fd, mode)
        finally:
            os.close(fd)


def _chmod_file(dirfd: int, name: str, add: int) -> None:
    fd = os.open(name, FILE_FLAGS, dir_fd=dirfd)
    try:
        st = os.fstat(fd)
        if stat.S_ISREG(st.st_mode):
            os.fchmod(fd, stat.S_IMODE(st.st_mode) | add)
    finally:
        os.close(fd)


def remove(parent_fd: int, name: str) -> None:
    """Remove `name` below `parent_fd`, a tree or a single entry, never following a link."""
    try:
        st = os.lstat(name, dir_fd=parent_fd)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(name, dir_fd=parent_fd)
    else:
        os.unlink(name, dir_fd=parent_fd)


def link_tree(src_fd: int, dst_fd: int, *, dir_mode: int = 0o755) -> tuple[int, int]:
    """Mirror the tree below `src_fd` into the empty directory `dst_fd`: directories made anew
    (this process's, `dir_mode`), regular files hard-linked (copied where the filesystems
    differ), anything else left out. Returns (files, bytes)."""
    files = size = 0
    made: dict[str, int] = {".": os.dup(dst_fd)}
    try:
        for path, dirnames, filenames, dirfd in os.fwalk(".", dir_fd=src_fd, follow_symlinks=False):
            into = made.pop(path)
            try:
                for name in dirnames:
                    made[os.path.join(path, name)] = make_dir(
                        into, name, mode=dir_mode, uid=os.geteuid(), gid=os.getegid()
                    )
                for name in filenames:
                    st = os.lstat(name, dir_fd=dirfd)
                    if not stat.S_ISREG(st.st_mode):
                        continue
                    try:
                        os.link(name, name, src_dir_fd=dirfd, dst_dir_fd=into, follow_symlinks=False)
                    except OSError as exc:
                        if exc.errno != errno.EXDEV:
                            raise
                        _copy_at(dirfd, name, into)
                    files += 1
                    size += st.st_size
            finally:
                os.close(into)
    finally:
        for fd in made.values():
            os.close(fd)
    return files, size


def _copy_at(src_dirfd: int, name: str, dst_dirfd: int) -> None:
    src = os.open(name, FILE_FLAGS, dir_fd=src_dirfd)
    try:
        if not stat.S_ISREG(os.fstat(src).st_mode):
            return
        dst = os.open(
            name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=dst_dirfd
        )
        with os.fdopen(os.dup(src), "rb") as r, os.fdopen(dst, "wb") as w:
            shutil.copyfileobj(r, w, 1024 * 1024)
    finally:
        os.close(src)


def path_of(fd: int) -> Path:
    """Where the directory open at `fd` is now (for messages and for handing a path on)."""
    return Path(os.readlink(f"/proc/self/fd/{fd}"))
