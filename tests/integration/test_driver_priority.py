"""A warm driver warms up niced; the task that takes it gets every process of the driver back at
the TaskManager's priority, Spark's Python daemons included: they leave the driver's process
group (pyspark/daemon.py calls setpgid), and the task's Python workers are forked from them.
For the same reason a killed driver's kill reaches every group of its session."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from services.taskmanager.drivers.process import WARMUP_NICE, DriverProcess, may_raise_priority
from tests.waiting import wait_for

needs_nice = pytest.mark.skipif(not may_raise_priority(), reason="needs root or RLIMIT_NICE to raise a priority")

# A stand-in driver: a child that moves to its own process group, as PySpark's daemon does, and
# a grandchild of it, as the daemon's forked workers are; prints their pids, waits for stdin.
TREE = textwrap.dedent("""
    import os, sys
    r, w = os.pipe()
    if os.fork() == 0:
        os.setpgid(0, 0)
        if os.fork() == 0:
            sys.stdin.read(); os._exit(0)
        sys.stdin.read(); os._exit(0)
    print(os.getpid(), flush=True)
    sys.stdin.read()
""")


def nice_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[16])


# With autogroup scheduling, sessions share the CPU as equals whatever their processes' nice:
# a warm driver's session must be niced as a whole (drivers/process.py: set_autogroup_nice).
AUTOGROUPS = Path("/proc/self/autogroup").exists()


def autogroup_nice(pid: int) -> int:
    return int(Path(f"/proc/{pid}/autogroup").read_text().split()[-1])


def tree(root: int) -> list[int]:
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        for t in os.listdir(f"/proc/{pid}/task"):
            todo += [int(c) for c in Path(f"/proc/{pid}/task/{t}/children").read_text().split()]
    return out


@needs_nice
def test_raise_priority_reaches_processes_that_left_the_drivers_group(tmp_path):
    d = DriverProcess(
        parallelism=1,
        workdir=tmp_path / "work",
        driver_memory="1g",
        shuffle_partitions=1,
        on_event=lambda *_: None,
        on_exit=lambda *_: None,
    )
    own = os.getpriority(os.PRIO_PROCESS, 0)
    d.proc = subprocess.Popen(
        [sys.executable, "-c", TREE],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        start_new_session=True,
        preexec_fn=lambda: os.nice(WARMUP_NICE),
    )
    try:
        d.lower_priority()  # as DriverProcess.start does for a warm driver
        assert d.niced
        assert d.proc.stdout.readline()
        wait_for(
            "the stand-in driver forking its daemon and worker",
            lambda: tree(d.proc.pid),
            10,
            poll_s=0.05,
            until=lambda found: len(found) >= 3,
        )
        pids = tree(d.proc.pid)
        groups = {os.getpgid(p) for p in pids}
        assert len(groups) == 2  # the "daemon" and its "worker" left the driver's group
        assert {nice_of(p) for p in pids} == {min(own + WARMUP_NICE, 19)}
        if AUTOGROUPS:  # the whole session shares one autogroup, niced with the driver
            assert {autogroup_nice(p) for p in pids} == {WARMUP_NICE}
        d.raise_priority()
        assert {nice_of(p) for p in pids} == {own}
        if AUTOGROUPS:
            assert {autogroup_nice(p) for p in pids} == {own}
        assert not d.niced
    finally:
        d.proc.stdin.close()  # all three wait for it to close
        d.proc.wait(10)


# As TREE, but the "daemon" and its "worker" never end by themselves (a worker stuck in a
# pipeline's loop does not notice its JVM is gone).
STUCK_TREE = textwrap.dedent("""
    import os, sys, time
    if os.fork() == 0:
        os.setpgid(0, 0)
        os.fork()
        while True:
            time.sleep(1)
    print(os.getpid(), flush=True)
    sys.stdin.read()
""")


def gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_kill_ends_the_processes_that_left_the_drivers_group(tmp_path):
    d = DriverProcess(
        parallelism=1,
        workdir=tmp_path / "work",
        driver_memory="1g",
        shuffle_partitions=1,
        on_event=lambda *_: None,
        on_exit=lambda *_: None,
    )
    d.proc = subprocess.Popen(
        [sys.executable, "-c", STUCK_TREE], stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True
    )
    pids: list[int] = []
    try:
        assert d.proc.stdout.readline()

        def forked() -> list[int]:  # kept in pids, for the cleanup below even after a timeout
            pids[:] = tree(d.proc.pid)
            return pids

        wait_for(
            "the stand-in driver forking its daemon and worker",
            forked,
            10,
            poll_s=0.05,
            until=lambda found: len(found) >= 3,
        )
        assert len({os.getpgid(p) for p in pids}) == 2
        d.kill()
        d.proc.wait(10)
        wait_for(
            "no process of the killed driver left behind",
            lambda: [p for p in pids if not gone(p)],
            5,
            poll_s=0.05,
            until=lambda left: not left,
        )
    finally:
        for p in pids:  # a failed run must not leave the stand-ins looping
            try:
                os.kill(p, 9)
            except ProcessLookupError:
                pass
