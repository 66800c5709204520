"""The memory watchdog of a task on real process trees, shaped like a Spark driver's Python side:
a parent that fills a large private mapping and forks children that share it (Spark's Python
workers, forked from their daemon). Children that only read it share its pages: summed RSS counts
them once per process, PSS once, and a limit between the two must not kill the tree (issue 42,
"False memory kills"). Children that write to it make their own copies: the tree really holds
more than the limit and is killed, the cause naming the measure.

The watch is a DriverProcess's own (`memory.watch`, as `run_task` starts it) over the tree as the
driver's processes, found by the driver's cgroup where this machine lets the TaskManager make one
(cgroup v2; without its memory controller here, so the watchdog applies) or by a /proc scan. The
tree runs as the drivers' user when the tests run as root, as a TaskManager's drivers do."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from services.taskmanager.drivers import env as driver_env
from services.taskmanager.drivers.process import DriverProcess
from services.taskmanager.drivers.sandbox import DriverSandbox
from services.taskmanager.drivers.task_processes import DriverCgroups, cluster_cgroups, rss_bytes, sweep
from services.taskmanager.drivers.user import DEFAULT_NAME, DriverUser
from tests.integration.support import wait_gone
from tests.waiting import wait_for

MB = 1024**2
SHARED = 256 * MB
CHILDREN = 5
LIMIT = 768 * MB  # above the PSS of a reading tree (~0.3 GB), below its RSS sum (~1.5 GB)

TREE = """
    import mmap, os, sys, time

    size, children, mode = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    shared = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    chunk = b"\\x01" * (1 << 20)

    def fill():
        for off in range(0, size, len(chunk)):
            shared[off:off + len(chunk)] = chunk

    fill()
    r, w = os.pipe()
    for _ in range(children):
        if os.fork() == 0:
            if mode == "write":
                fill()  # every page written: the child's own copy
            else:
                sum(shared[off] for off in range(0, size, 4096))  # read: the pages stay shared
            os.write(w, b"x")
            time.sleep(3600)
            os._exit(0)
    for _ in range(children):
        os.read(r, 1)
    print("ready", flush=True)
    time.sleep(3600)
"""


@pytest.fixture(scope="module")
def root():
    # Not pytest's tmp_path: its directories are 0700, out of the drivers' user's reach.
    path = Path(tempfile.mkdtemp(prefix="headrace-memory-", dir="/tmp"))
    os.chmod(path, 0o755)
    (path / "tree.py").write_text(textwrap.dedent(TREE))
    os.chmod(path / "tree.py", 0o644)
    yield path
    sweep(path, cluster_cgroups(path))
    shutil.rmtree(path, ignore_errors=True)


def drivers_user() -> DriverUser:
    if os.geteuid() == 0:
        try:
            pw = pwd.getpwnam(DEFAULT_NAME)
            return DriverUser(DEFAULT_NAME, pw.pw_uid, pw.pw_gid)
        except KeyError:
            pass
    return DriverUser(None, -1, -1)


class Tree:
    """The process tree as a started driver: `driver.proc` is its parent."""

    def __init__(self, root: Path, mode: str, tracking: str) -> None:
        user = drivers_user()
        cgroups = DriverCgroups.create(root, f"tm-{mode}") if tracking == "cgroup" else None
        if tracking == "cgroup" and cgroups is None:
            pytest.skip("no cgroup v2 this process may create children in")
        self.driver = DriverProcess(
            parallelism=1,
            workdir=root / "drivers",
            driver_memory="1g",
            shuffle_partitions=1,
            on_event=lambda *a: None,
            on_exit=lambda *a: None,
            sandbox=DriverSandbox(cgroups=cgroups),
        )
        self.driver.processes.uid = user.uid if user.isolated else os.geteuid()
        if cgroups is not None:
            self.driver.processes.cgroup = cgroups.for_driver(self.driver.id)
        self.driver.workdir.mkdir(parents=True)
        env = {"PATH": os.environ["PATH"], driver_env.MARK: str(self.driver.workdir)}
        proc = subprocess.Popen(
            [sys.executable, str(root / "tree.py"), str(SHARED), str(CHILDREN), mode],
            stdout=subprocess.PIPE,
            start_new_session=True,
            env=env,
            cwd=root,
            **user.popen_kwargs(),
        )
        self.driver.proc = proc
        self.driver.processes.attach(proc.pid)
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"

    def pids(self) -> set[int]:
        return self.driver.processes.pids()

    def alive(self) -> bool:
        return self.driver.proc is not None and self.driver.proc.poll() is None

    def stop(self) -> None:
        self.driver.memory.stop()
        self.driver.kill()
        if self.driver.proc is not None:
            self.driver.proc.wait(10)
        self.driver.processes.release()


def pss_by_psutil(pids) -> int:
    """The same figure read another way (psutil sums /proc/<pid>/smaps)."""
    return sum(psutil.Process(p).memory_full_info().pss for p in pids)


@pytest.mark.parametrize("tracking", ["cgroup", "proc-scan"])
def test_children_sharing_their_parents_pages_are_not_killed_below_the_limit(root, tracking):
    tree = Tree(root, "read", tracking)
    try:
        pids = tree.pids()
        assert len(pids) == CHILDREN + 1
        rss, pss = rss_bytes(pids), pss_by_psutil(pids)
        # The case of issue 42: the RSS sum (what the old watchdog compared) is above the limit,
        # what the kernel charges is far below it.
        assert pss < LIMIT < rss, (pss // MB, rss // MB)
        tree.driver.memory.watch(LIMIT)
        time.sleep(3)  # twelve samples, two PSS readings
        assert tree.driver.exit_reason is None, tree.driver.exit_reason
        assert tree.alive() and tree.pids() == pids
        figure = tree.driver.memory.figure()
        assert figure is not None
        sample, limit = figure
        assert limit == LIMIT and sample.label() == "PSS" and sample.processes == CHILDREN + 1
        assert abs(sample.used - pss) < 64 * MB, (sample.used // MB, pss // MB)
    finally:
        tree.stop()


@pytest.mark.parametrize("tracking", ["cgroup", "proc-scan"])
def test_children_that_made_the_pages_their_own_are_killed_with_the_measure_named(root, tracking):
    tree = Tree(root, "write", tracking)
    try:
        pids = tree.pids()
        assert pss_by_psutil(pids) > LIMIT
        tree.driver.memory.watch(LIMIT)
        wait_for(
            "the tree above its limit killed (an exit reason)",
            lambda: tree.driver.exit_reason,
            10,
            poll_s=0.05,
            until=lambda reason: reason is not None,
        )
        name, cause = tree.driver.exit_reason
        assert name == "MemoryLimitExceeded"
        assert (
            cause.startswith("the task's processes used 1.")
            and "GB (PSS summed over 6 processes), above its "
            "limit of 0.8 GB (headrace.task.memory-limit); they were killed."
            in cause
        ), cause
        wait_gone("every process of the killed tree to go", pids, timeout_s=10, poll_s=0.1)
    finally:
        tree.stop()


READER = """
    import json, sys
    from services.taskmanager.memory.measure import pss_sample

    pids = [int(p) for p in sys.argv[1:]]
    plain = []
    for pid in pids:
        try:
            open(f"/proc/{pid}/smaps_rollup", "rb").read()
            plain.append(pid)
        except PermissionError:
            pass
    s = pss_sample(pids)
    print(json.dumps({"plain": plain, "used": s.used, "processes": s.processes, "by_rss": s.by_rss,
                      "describe": s.describe()}))
"""


def read_without_ptrace(root: Path, pids) -> dict:
    """pss_sample run by a process that may switch users but not ptrace them, as a container's
    root (CAP_SETUID and CAP_SETGID kept, CAP_SYS_PTRACE dropped, as Docker starts it): here the
    user nobody with those two capabilities, since this machine's kernel let root read another
    user's smaps_rollup even with CAP_SYS_PTRACE dropped (capsh --drop=cap_sys_ptrace)."""
    if os.geteuid() != 0 or not shutil.which("setpriv") or drivers_user().name is None:
        pytest.skip("needs root, setpriv and the drivers' user")
    script = root / "reader.py"
    script.write_text(textwrap.dedent(READER))
    os.chmod(script, 0o644)
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    nobody = pwd.getpwnam("nobody")
    out = subprocess.run(
        [
            "setpriv",
            f"--reuid={nobody.pw_uid}",
            f"--regid={nobody.pw_gid}",
            "--clear-groups",
            "--inh-caps=+setuid,+setgid",
            "--ambient-caps=+setuid,+setgid",
            sys.executable,
            str(script),
            *map(str, pids),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_a_taskmanager_without_ptrace_reads_the_drivers_pss_as_the_drivers_user(root):
    tree = Tree(root, "read", "proc-scan")
    try:
        pids = sorted(tree.pids())
        seen = read_without_ptrace(root, pids)
        assert seen["plain"] == [], "the reader could read them plainly: the case is not tested"
        assert (seen["processes"], seen["by_rss"]) == (CHILDREN + 1, 0), seen
        assert seen["used"] < LIMIT < rss_bytes(pids)
    finally:
        tree.stop()


NOT_DUMPABLE = """
    import ctypes, time
    ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: not even its own user reads its smaps
    print("ready", flush=True)
    time.sleep(3600)
"""


def test_a_process_whose_pss_cannot_be_read_counts_by_its_rss_and_the_sample_says_so(root):
    user = drivers_user()
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(NOT_DUMPABLE)],
        stdout=subprocess.PIPE,
        start_new_session=True,
        **user.popen_kwargs(),
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
        seen = read_without_ptrace(root, [proc.pid])
        assert (seen["processes"], seen["by_rss"]) == (1, 1), seen
        assert seen["used"] == rss_bytes([proc.pid]) or abs(seen["used"] - rss_bytes([proc.pid])) < MB
        assert seen["describe"] == "PSS summed over 1 process, 1 of them by RSS (their PSS could not be read)"
    finally:
        proc.kill()
        proc.wait(10)
