"""How much memory a task's processes hold, measured as the kernel would charge it.

Spark's Python workers are forked from a daemon (and a query's Python source runner from the
driver's fork server) and share most of their pages with it. Resident memory (RSS) counts a shared
page in every process that maps it, so an RSS sum over a driver's 10-20 processes counted the
same pages several times: 2.5 GB summed against 1.18 GB charged, and tasks killed far below their
limit (issue 42). Two measures count each page once:

- PSS (proportional set size, /proc/<pid>/smaps_rollup): each page divided among the processes
  that map it; summed over the task's processes, a page all of them share counts once, and one
  shared with processes outside the task (a library, the class archive) counts for their share.
  Reading it walks the process's page tables: ~15 us of CPU per resident MB (11 ms for a driver's
  JVM, ~25 ms for a Spark task's 18 processes), where an RSS sum (statm) costs 0.3 ms for all of
  them; `ProcessMeter` reads it only when it can matter (below).
- A memory cgroup's own charge (memory.current): what the kernel counts against memory.max, page
  cache the task's files fill included (reclaimed before the kernel kills).

Reading another user's smaps_rollup needs ptrace's permission: the same user, or CAP_SYS_PTRACE,
which a TaskManager running as root in a container usually lacks (Docker drops it). Such a reader
retries as the process's own user where it may switch to it (root's CAP_SETUID and CAP_SETGID,
which Docker keeps): the reading thread's filesystem uid and gid alone, for the reads
(setfsuid/setfsgid are per thread; the rest of the TaskManager keeps its own). A process even that
cannot read (one that made itself non-dumpable, or changed its ids) counts by its RSS, and the
sample says how many did.

Shared memory a task holds without mapping it (a memfd, a file in /dev/shm, an unattached System V
segment) is in no process's PSS; the PSS figure adds it (memory/shmem_usage.py).

By hand: `grep Pss: /proc/<pid>/smaps_rollup` per process, or `cat memory.current` in the driver's
cgroup (docs/runbooks/slow-pipeline.md, "Task failed: memory limit").
"""

from __future__ import annotations

import ctypes
import logging
import os
import time
from collections.abc import Callable, Iterable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Protocol

from services.taskmanager.drivers.task_processes import rss_bytes
from services.taskmanager.memory.shmem_usage import system_shmem, unmapped_shmem

log = logging.getLogger("headrace.taskmanager.memory")

PSS = "PSS"
CGROUP = "cgroup"
# How old a PSS reading may get (bench/pss_cost.py: one reading costs ~25 ms of CPU for a Spark
# task's 18 processes holding 1.7 GB, ~15 us per resident MB; an RSS sum 0.3 ms). While the RSS sum
# is within the limit the PSS is too, and the reading is only the dashboard's figure. Above it, a
# worker writing to pages it shares with its daemon makes them its own: PSS grows, RSS does not.
PSS_REFRESH_S = 5.0
PSS_NEAR_S = 2.0
_PR_GET_DUMPABLE, _PR_SET_DUMPABLE = 3, 4


@dataclass(frozen=True)
class Sample:
    """One measurement of a task's memory: `used` bytes by `measure` (PSS or the cgroup's charge)."""

    used: int
    measure: str
    processes: int = 0  # PSS: how many processes were summed
    by_rss: int = 0  # PSS: of them, how many count by RSS (their PSS could not be read)
    source: str = ""  # cgroup: the file read
    shmem: int = 0  # PSS: bytes of shared memory held unmapped (memfds, /dev/shm files), in `used`
    shmem_files: int = 0

    def label(self) -> str:
        """Short, for the dashboard: "PSS", "PSS, RSS for 2", "cgroup charge"."""
        if self.measure == CGROUP:
            return "cgroup charge"
        return PSS if not self.by_rss else f"{PSS}, RSS for {self.by_rss}"

    def describe(self) -> str:
        """For a failure cause: which measure, over what."""
        if self.measure == CGROUP:
            return f"the cgroup's charge, {self.source}"
        text = f"PSS summed over {self.processes} process{'es' if self.processes != 1 else ''}"
        if self.by_rss:
            text += f", {self.by_rss} of them by RSS (their PSS could not be read)"
        if self.shmem:
            text += (
                f", and {self.shmem / 1024**3:.1f} GB of shared memory they hold unmapped "
                f"({self.shmem_files} memfd, /dev/shm or System V object{'s' if self.shmem_files != 1 else ''})"
            )
        return text


def parse_rollup(data: bytes) -> tuple[int, int]:
    """(PSS, RSS) in bytes from the text of /proc/<pid>/smaps_rollup; ValueError without a Pss line."""
    pss = rss = None
    for line in data.splitlines():
        if line.startswith(b"Pss:"):
            pss = int(line.split()[1]) * 1024
        elif line.startswith(b"Rss:"):
            rss = int(line.split()[1]) * 1024
        if pss is not None and rss is not None:
            break
    if pss is None:
        raise ValueError("no Pss line in smaps_rollup")
    return pss, rss if rss is not None else pss


def _rollup(pid: int) -> bytes:
    with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
        return f.read()


def pss_sample(pids: Iterable[int], uid: int | None = None) -> Sample:
    """PSS summed over `pids`, plus the shared memory they hold unmapped (and `uid`'s, the task's
    own user: memory/shmem_usage.py); a process gone meanwhile counts nothing, one whose PSS cannot be
    read counts its RSS."""
    pids = list(pids)
    total = counted = 0
    refused: list[int] = []
    for pid in pids:
        try:
            total += parse_rollup(_rollup(pid))[0]
            counted += 1
        except PermissionError:
            refused.append(pid)
        except (OSError, ValueError):
            continue  # gone meanwhile (ESRCH, ENOENT), or a kernel thread without an mm
    by_rss = 0
    for pid, figure in _read_as_owners(refused).items():
        if figure is None:
            figure, by_rss = rss_bytes([pid]), by_rss + 1
        total += figure
        counted += 1
    shmem, files = unmapped_shmem(pids, uid)
    return Sample(total + shmem, PSS, processes=counted, by_rss=by_rss, shmem=shmem, shmem_files=files)


def _read_as_owners(pids: list[int]) -> dict[int, int | None]:
    """PSS of processes this one may not read, read as each one's own user where this process may
    switch to it (root, or CAP_SETUID and CAP_SETGID); None for the ones still refused."""
    out: dict[int, int | None] = dict.fromkeys(pids)
    if not pids:
        return out
    by_owner: dict[tuple[int, int], list[int]] = {}
    for pid in pids:
        owner = _owner(pid)
        if owner is not None:
            by_owner.setdefault(owner, []).append(pid)
    for (uid, gid), group in by_owner.items():
        try:
            with as_fs_user(uid, gid):
                for pid in group:
                    try:
                        out[pid] = parse_rollup(_rollup(pid))[0]
                    except (OSError, ValueError):
                        pass
        except OSError as exc:  # no CAP_SETUID, or a seccomp filter refusing setfsuid
            log.debug("cannot read PSS as uid %d: %s", uid, exc)
    return out


def _owner(pid: int) -> tuple[int, int] | None:
    """(uid, gid) of a process whose real, effective and saved ids agree (ptrace's same-user
    rule needs all of them to match); None otherwise or when it is gone."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            lines = {line.split(b":", 1)[0]: line.split()[1:4] for line in f if line[:4] in (b"Uid:", b"Gid:")}
        uids, gids = {int(x) for x in lines[b"Uid"]}, {int(x) for x in lines[b"Gid"]}
    except (OSError, KeyError, ValueError):
        return None
    return (uids.pop(), gids.pop()) if len(uids) == len(gids) == 1 else None


_libc: ctypes.CDLL | None = None


def _c() -> ctypes.CDLL:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    return _libc


@contextmanager
def as_fs_user(uid: int, gid: int) -> Iterator[None]:
    """The calling thread opens files as `uid`/`gid` (Linux's filesystem ids, per thread; no
    other thread of the process changes), and as itself again afterwards. Raises OSError if the
    switch did not take (it needs CAP_SETUID and CAP_SETGID)."""
    libc = _c()
    dumpable = libc.prctl(_PR_GET_DUMPABLE, 0, 0, 0, 0)
    libc.setfsgid(gid)
    libc.setfsuid(uid)
    try:
        # Both calls return the previous id whether or not they succeeded: -1 (invalid) reads it.
        if libc.setfsuid(-1) != uid or libc.setfsgid(-1) != gid:
            raise OSError(f"setfsuid/setfsgid to {uid}/{gid} did not take")
        yield
    finally:
        libc.setfsuid(os.geteuid())
        libc.setfsgid(os.getegid())
        # A change of the filesystem uid makes the process non-dumpable (the kernel's rule for
        # credential changes): it would then refuse py-spy and core dumps. Put it back, even while
        # another watch thread is in its own window: the process's real, effective and saved ids
        # stay its own throughout, and those are what decide who may ptrace it.
        if dumpable == 1:
            libc.prctl(_PR_SET_DUMPABLE, 1, 0, 0, 0)


class Meter(Protocol):
    def sample(self, limit: int | None) -> Sample:
        """The task's memory now (a meter may return its last reading when a new one cannot matter)."""

    def oom_kills(self) -> int:
        """How many times the kernel's OOM killer ended one of the task's processes (0: it does not enforce)."""

    def peak(self) -> Sample | None:
        """The highest figure the kernel recorded, where it keeps one."""


class ProcessMeter:
    """PSS of a task's processes, read when it can matter. RSS (cheap) is read at every sample:
    a process's PSS never exceeds its RSS, and the shared memory the task holds unmapped never
    exceeds what it held at the last reading plus the machine's shmem growth since
    (/proc/meminfo), so while that bound is within the limit the figure is too, and PSS is read
    every `refresh_s`, for the figure shown. Above it, PSS is read every `near_s`, and at once when
    the bound grew by more than the headroom the last reading left (a new allocation shows in RSS
    or in the machine's shmem at once). A task is only ever killed on a fresh PSS reading."""

    def __init__(
        self,
        pids: Callable[[], Iterable[int]],
        *,
        refresh_s: float = PSS_REFRESH_S,
        near_s: float = PSS_NEAR_S,
        clock: Callable[[], float] = time.monotonic,
        read_rss: Callable[[list[int]], int] = rss_bytes,
        read_pss: Callable[[list[int]], Sample] = pss_sample,
        read_shmem: Callable[[], int] = system_shmem,
    ) -> None:
        self.pids, self.refresh_s, self.near_s, self.clock = pids, refresh_s, near_s, clock
        self.read_rss, self.read_pss, self.read_shmem = read_rss, read_pss, read_shmem
        self.last: Sample | None = None
        self._rss_then = 0
        self._shmem_then = 0
        self._at = float("-inf")

    def sample(self, limit: int | None) -> Sample:
        pids = list(self.pids())
        machine_shmem = self.read_shmem()
        held = self.last.shmem if self.last is not None else 0
        rss_only = self.read_rss(pids)
        rss = rss_only + held + max(0, machine_shmem - self._shmem_then)
        now = self.clock()
        last = self.last
        if last is not None:
            age = now - self._at
            if limit is None or rss <= limit:
                if age < self.refresh_s:
                    return last
            elif age < self.near_s and rss - self._rss_then < limit - last.used:
                return last
        self.last, self._at, self._shmem_then = self.read_pss(pids), now, machine_shmem
        self._rss_then = rss_only + self.last.shmem
        return self.last

    def oom_kills(self) -> int:
        return 0

    def peak(self) -> Sample | None:
        return None


class CgroupMeter:
    """The charge of a driver's cgroup v2 with the memory controller, whose memory.max the kernel
    enforces: memory.current as the figure, memory.peak when the kernel killed."""

    def __init__(self, cgroup: Path) -> None:
        self.cgroup = cgroup

    def sample(self, limit: int | None) -> Sample:
        return Sample(int((self.cgroup / "memory.current").read_text().split()[0]), CGROUP, source="memory.current")

    def peak(self) -> Sample | None:
        """The highest charge (memory.peak, kernels from 5.19), None without it."""
        try:
            return Sample(int((self.cgroup / "memory.peak").read_text().split()[0]), CGROUP, source="memory.peak")
        except (OSError, ValueError, IndexError):
            return None

    def oom_kills(self) -> int:
        for line in (self.cgroup / "memory.events").read_text().splitlines():
            if line.startswith("oom_kill "):
                return int(line.split()[1])
        return 0
