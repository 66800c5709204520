"""Shared memory a task holds that PSS does not count.

PSS counts the resident pages a process maps, shared memory (shmem, tmpfs) included. A pipeline
stepped around its memory limit with memory it never maps (issue 43): a memfd_create file held only
by its descriptor, a file in /dev/shm written and closed (which outlives the task), a System V
segment no process is attached to. So the PSS figure of a task (measure.py's pss_sample) adds:

- every memfd or /dev/shm file one of its processes holds open, and every file in /dev/shm its
  user owns (a driver's user is its own, shared/sandbox_users.py), by allocated size, unless one
  of its processes maps it (then PSS counted it already);
- the System V segments its user owns or created and nobody is attached to.

When the task ends its user is scrubbed: its /dev/shm files and segments are removed.
The kernel's memory cgroup, where it enforces the limit, charges shmem by itself.
"""

from __future__ import annotations

import os
import stat
from typing import Iterable

from shared.sandbox_users import shared_memory_of

SHM_DIR = "/dev/shm"
_SHM_PREFIXES = ("/memfd:", "/dev/shm/")


def system_shmem() -> int:
    """The machine's shmem in bytes (/proc/meminfo Shmem): cheap, and only ever grows by what
    someone allocated, so its growth bounds what a task can have added since a reading."""
    try:
        with open("/proc/meminfo", "rb") as f:
            for line in f:
                if line.startswith(b"Shmem:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def unmapped_shmem(pids: Iterable[int], uid: int | None) -> tuple[int, int]:
    """(bytes, files) of the shared memory `pids` hold or `uid` owns that none of them maps."""
    pids = list(pids)
    held: dict[tuple[int, int], int] = {}
    for pid in pids:
        _held_by(pid, held)
    if uid is not None:
        _owned_in_shm(uid, held)
    total, files = 0, 0
    if held:
        mapped = _mapped(pids)
        for key, size in held.items():
            if key not in mapped:
                total += size
                files += 1
    if uid is not None:
        for _shmid, rss, attached in _segments(uid):
            if not attached:
                total += rss
                files += 1
    return total, files


def _held_by(pid: int, held: dict[tuple[int, int], int]) -> None:
    fd_dir = f"/proc/{pid}/fd"
    try:
        fds = os.listdir(fd_dir)
    except OSError:
        return  # gone, or not ours to read
    for fd in fds:
        try:
            if not os.readlink(f"{fd_dir}/{fd}").startswith(_SHM_PREFIXES):
                continue
            st = os.stat(f"{fd_dir}/{fd}")
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode):
            held[(st.st_dev, st.st_ino)] = st.st_blocks * 512


def _owned_in_shm(uid: int, held: dict[tuple[int, int], int]) -> None:
    try:
        walk = os.walk(SHM_DIR)
        for root, _dirs, files in walk:
            for name in files:
                try:
                    st = os.lstat(os.path.join(root, name))
                except OSError:
                    continue
                if st.st_uid == uid and stat.S_ISREG(st.st_mode):
                    held[(st.st_dev, st.st_ino)] = st.st_blocks * 512
    except OSError:
        return


def _mapped(pids: list[int]) -> set[tuple[int, int]]:
    """(device, inode) of every shmem file the processes map (/proc/<pid>/maps)."""
    out: set[tuple[int, int]] = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/maps", "rb") as f:
                for line in f:
                    fields = line.split(maxsplit=5)
                    if len(fields) < 6 or not fields[5].startswith((b"/memfd:", b"/dev/shm/", b"/SYSV")):
                        continue
                    major, minor = (int(x, 16) for x in fields[3].split(b":"))
                    out.add((os.makedev(major, minor), int(fields[4])))
        except (OSError, ValueError):
            continue
    return out


def _segments(uid: int) -> list[tuple[int, int, bool]]:
    """(id, resident bytes, attached) of the System V segments of `uid`."""
    attached = set()
    try:
        with open("/proc/sysvipc/shm") as f:
            header = f.readline().split()
            for line in f:
                row = dict(zip(header, line.split(), strict=False))
                if int(row.get("nattch", 0)) > 0:
                    attached.add(int(row["shmid"]))
    except (OSError, ValueError, KeyError):
        pass
    return [(shmid, rss, shmid in attached) for shmid, rss in shared_memory_of(uid)]
