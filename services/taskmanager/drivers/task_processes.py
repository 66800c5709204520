"""Every process of a Spark driver, whatever its session, and how they all end together.

A pipeline may fork and call setsid(): its child leaves the driver's session (which is what
`shared/driver_contract.kill_session` kills), and once its parent exits it is re-parented to init. Two
ways still find it:

- A cgroup v2 per driver, under this TaskManager's own cgroup (`driver_cgroups`, on where the
  TaskManager may create one: root, or a delegated subtree). Every process the driver starts stays
  in it; `cgroup.kill` ends them all at once; `memory.max` bounds them where the memory controller
  can be enabled for it (memory/limit.py, else its PSS watchdog).
- Otherwise, a scan of /proc: the driver's session, every descendant of it, and every process whose
  environment carries the driver's mark (MARK, drivers/env.py). A process that escapes its session and
  its ancestry and also replaces its whole environment is out of this scan's sight; the cgroup is not.

`sweep(prefix)` ends every marked process (and cgroup) under a work directory prefix: a
TaskManager's at its shutdown, a whole cluster's when `headrace up` stops.
"""

from __future__ import annotations

import hashlib
import logging
import os
import signal
import time
from pathlib import Path

from services.taskmanager.drivers.env import MARK

log = logging.getLogger("headrace.taskmanager.processes")

PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")
CGROUP_DIR = "headrace-drivers"
KILL_ROUNDS = 5
EMPTY_WAIT_S = 5.0


def cgroup2_base() -> Path | None:
    """This process's own cgroup in a mounted cgroup v2 hierarchy, if it may create children there."""
    try:
        with open("/proc/self/mounts") as f:
            mount = next((Path(line.split()[1]) for line in f if line.split()[2:3] == ["cgroup2"]), None)
        with open("/proc/self/cgroup") as f:
            own = next((line.strip()[3:] for line in f if line.startswith("0::")), None)
    except OSError:
        return None
    if mount is None or own is None:
        return None
    base = mount / own.lstrip("/")
    return base if os.access(base, os.W_OK) and (base / "cgroup.procs").exists() else None


def cluster_key(workdir: Path) -> str:
    """Names the cgroups of one cluster's work directory (no path separators in a cgroup name)."""
    return hashlib.sha1(str(Path(workdir).resolve()).encode()).hexdigest()[:12]


class DriverCgroups:
    """The cgroup v2 subtree of one TaskManager's drivers: <base>/headrace-drivers/<cluster>/<tm>/<driver>."""

    def __init__(self, root: Path):
        self.root = root

    @classmethod
    def create(cls, cluster_workdir: Path, taskmanager_id: str) -> "DriverCgroups | None":
        base = cgroup2_base()
        if base is None:
            return None  # no cgroup v2, or not ours to write
        root = base / CGROUP_DIR / cluster_key(cluster_workdir) / taskmanager_id
        try:
            root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            log.info("no cgroup for the drivers (%s): they are tracked through /proc", exc)
            return None
        if not (root / "cgroup.kill").exists():  # a kernel before 5.14 (the root cgroup has none either)
            remove_cgroup(root)
            return None
        _enable_memory(base, root)
        return cls(root)

    @property
    def memory(self) -> bool:
        """Whether the drivers' cgroups get the memory controller (memory.max, memory.events)."""
        return (self.root / "memory.max").exists()

    def for_driver(self, name: str) -> Path | None:
        path = self.root / name
        try:
            path.mkdir(exist_ok=True)
            return path
        except OSError as exc:
            log.warning("could not create the cgroup %s (%s): tracking the driver through /proc", path, exc)
            return None


def _enable_memory(base: Path, root: Path) -> None:
    """Turn the memory controller on down to `root`'s children, where the hierarchy allows it (a
    cgroup with processes of its own may not pass controllers down, except the root cgroup)."""
    level = base
    for part in root.relative_to(base).parts:
        try:
            if "memory" in (level / "cgroup.controllers").read_text().split():
                (level / "cgroup.subtree_control").write_text("+memory")
        except OSError:
            return
        level = level / part
    try:
        if "memory" in (level / "cgroup.controllers").read_text().split():
            (level / "cgroup.subtree_control").write_text("+memory")
    except OSError:
        pass


class TaskProcesses:
    """The processes of one driver: its cgroup's, else what a /proc scan finds for its mark."""

    def __init__(self, mark: str, cgroup: Path | None = None, uid: int | None = None):
        self.mark, self.cgroup, self.uid = mark, cgroup, uid
        self.leader: int | None = None

    def attach(self, pid: int) -> None:
        """Right after the driver's start, before it has started anything (the runner imports for
        a second before its first child)."""
        self.leader = pid
        if self.cgroup is None:
            return
        try:
            (self.cgroup / "cgroup.procs").write_text(str(pid))
        except OSError as exc:
            log.warning("could not move driver %d into %s (%s): tracking it through /proc", pid, self.cgroup, exc)
            self._drop_cgroup()

    def pids(self) -> set[int]:
        if self.cgroup is not None:
            try:
                return {int(p) for p in (self.cgroup / "cgroup.procs").read_text().split()}
            except OSError:
                pass
        return scan(session=self.leader, mark=self.mark, uid=self.uid)

    def kill(self) -> None:
        """SIGKILL every process of the driver."""
        if self.cgroup is not None:
            try:
                (self.cgroup / "cgroup.kill").write_text("1")
            except OSError as exc:
                log.warning("cgroup.kill of %s failed: %s", self.cgroup, exc)
        kill_rounds(lambda: scan(session=self.leader, mark=self.mark, uid=self.uid))

    def release(self) -> None:
        """Remove the driver's cgroup once its processes are gone."""
        self._drop_cgroup()

    def memory_file(self, name: str) -> Path | None:
        path = self.cgroup / name if self.cgroup is not None else None
        return path if path is not None and path.exists() else None

    def _drop_cgroup(self) -> None:
        path, self.cgroup = self.cgroup, None
        if path is not None:
            remove_cgroup(path)


def remove_cgroup(path: Path) -> None:
    deadline = time.monotonic() + EMPTY_WAIT_S
    while True:
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:  # EBUSY: its last processes are still exiting
            if time.monotonic() > deadline:
                log.warning("cgroup %s still holds processes; left in place", path)
                return
            time.sleep(0.05)


def scan(*, session: int | None = None, mark: str | None = None, uid: int | None = None) -> set[int]:
    """Processes of `session`, or marked with `mark` (or a path below it), and their descendants.
    `uid`: only that user's processes are checked for the mark."""
    me = os.getpid()
    parents: dict[int, int] = {}
    found: set[int] = set()
    wanted = f"{MARK}={mark}".encode() if mark else None
    for entry in _pids():
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone meanwhile
        ppid, sid = int(fields[1]), int(fields[3])
        parents[entry] = ppid
        if entry == me or fields[0] == b"Z":
            continue  # a zombie is dead already: only its parent's wait() removes it
        if session is not None and sid == session:
            found.add(entry)
        elif wanted is not None and _marked(entry, wanted, uid):
            found.add(entry)
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    todo = list(found)
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found and child != me:
                found.add(child)
                todo.append(child)
    return found


def _pids() -> list[int]:
    try:
        return [int(e) for e in os.listdir("/proc") if e.isdigit()]
    except OSError:
        return []


def _marked(pid: int, wanted: bytes, uid: int | None) -> bool:
    try:
        if uid is not None and os.stat(f"/proc/{pid}").st_uid != uid:
            return False
        with open(f"/proc/{pid}/environ", "rb") as f:
            entries = f.read().split(b"\0")
    except OSError:
        return False
    return any(e == wanted or e.startswith(wanted.rstrip(b"/") + b"/") for e in entries)


def kill_rounds(find) -> int:
    """SIGKILL what `find()` returns until it returns nothing (a process may fork meanwhile)."""
    killed = 0
    for _ in range(KILL_ROUNDS):
        pids = find()
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.05)
    return killed


def rss_bytes(pids) -> int:
    """Resident memory summed over `pids` (pages shared after a fork count in each process): an
    upper bound of their PSS that costs ~0.01 ms per process (memory/measure.py's ProcessMeter)."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/statm", "rb") as f:
                total += int(f.read().split()[1]) * PAGE_BYTES
        except (OSError, IndexError, ValueError):
            continue
    return total


def cluster_cgroups(cluster_workdir: Path) -> Path | None:
    """Where DriverCgroups.create puts the cgroups of every TaskManager of this work directory."""
    base = cgroup2_base()
    return base / CGROUP_DIR / cluster_key(cluster_workdir) if base is not None else None


def sweep(mark_prefix: Path, cgroup_root: Path | None = None, uid: int | None = None) -> int:
    """Kill every process marked with a driver directory under `mark_prefix` and every process of
    the cgroups under `cgroup_root` (which are removed, the root included). Returns how many
    processes were found."""
    found = 0
    if cgroup_root is not None and cgroup_root.is_dir():
        groups = [d for d in cgroup_root.rglob("*") if d.is_dir() and (d / "cgroup.procs").exists()]
        for cg in sorted(groups, key=lambda d: len(d.parts), reverse=True) + [cgroup_root]:
            try:
                found += len((cg / "cgroup.procs").read_text().split())
                (cg / "cgroup.kill").write_text("1")
            except OSError:
                pass
            remove_cgroup(cg)
    return found + kill_rounds(lambda: scan(mark=str(mark_prefix), uid=uid))
