"""services/taskmanager/runtime/jit_in_reserve.py against real processes and threads: a stand-in
"JVM" (a process named `java` whose threads carry HotSpot's compiler thread names) below this one.
A real driver's JVM is covered by tests/integration/test_runner.py."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from services.taskmanager.runtime import jit_in_reserve as jit
from tests.waiting import wait_for

pytestmark = pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="Linux scheduling policies")

# Names itself `java`, starts a C1 and a C2 thread at once and a second C2 thread when told (as
# HotSpot adds compiler threads as its queue grows), then waits for stdin to close.
FAKE_JVM = textwrap.dedent("""
    import ctypes, sys, threading
    ctypes.CDLL(None).prctl(15, b"java", 0, 0, 0)  # PR_SET_NAME: the process's comm

    def thread(name):
        def run():
            with open(f"/proc/self/task/{threading.get_native_id()}/comm", "w") as f:
                f.write(name)
            threading.Event().wait()
        threading.Thread(target=run, daemon=True).start()

    thread("C1 CompilerThre")
    thread("C2 CompilerThre")
    print("up", flush=True)
    for line in sys.stdin:
        thread("C2 CompilerThre")
        print("more", flush=True)
""")


def policies(pid: int, name: str) -> dict[int, int]:
    """Scheduling policy of each thread of process `pid` named `name`. (Not of every process
    under this one: the suite's own JVMs, ZooKeeper's for one, have C2 threads too.)"""
    out = {}
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            if open(f"/proc/{pid}/task/{t}/comm").read().strip() == name:
                out[int(t)] = os.sched_getscheduler(int(t))
        except OSError:
            pass
    return out


def c2_policies(pid: int) -> set[int]:
    return set(policies(pid, "C2 CompilerThre").values())


@pytest.fixture
def fake_jvm():
    proc = subprocess.Popen([sys.executable, "-c", FAKE_JVM], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "up"
    yield proc
    proc.kill()
    proc.wait(10)


def test_c2_threads_idle_in_reserve_and_come_back_on_release(fake_jvm):
    me = fake_jvm.pid
    optimizer = jit.OptimizerInReserve(me).start()
    try:
        wait_for("the C2 threads idle", lambda: c2_policies(me), 10, poll_s=0.05, until=lambda p: p == {os.SCHED_IDLE})
        assert set(policies(me, "C1 CompilerThre").values()) == {os.SCHED_OTHER}  # C1 carries the warm-up
        fake_jvm.stdin.write("grow\n")
        fake_jvm.stdin.flush()
        assert fake_jvm.stdout.readline().strip() == "more"
        # A C2 thread the JVM adds later is found too.
        wait_for(
            "the new C2 thread idle too",
            lambda: list(policies(me, "C2 CompilerThre").values()),
            jit.POLL_S + 10,
            poll_s=0.05,
            until=lambda found: found == [os.SCHED_IDLE] * 2,
        )
    finally:
        optimizer.release()
    assert list(policies(me, "C2 CompilerThre").values()) == [os.SCHED_OTHER] * 2
    optimizer.idle_new_threads()  # released for good: nothing goes idle again
    assert list(policies(me, "C2 CompilerThre").values()) == [os.SCHED_OTHER] * 2


def test_threads_of_other_processes_are_left_alone(fake_jvm):
    """Only JVMs below the given process: a `java` elsewhere keeps its policy."""
    unrelated = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        optimizer = jit.OptimizerInReserve(unrelated.pid).start()
        time.sleep(0.5)
        assert set(policies(fake_jvm.pid, "C2 CompilerThre").values()) == {os.SCHED_OTHER}
        assert optimizer.idled == set()
        optimizer.release()
    finally:
        unrelated.kill()
        unrelated.wait(10)


@pytest.mark.skipif(os.geteuid() != 0, reason="dropping a capability of root")
def test_a_root_without_cap_sys_nice_is_not_taken_for_one_that_can_raise_priorities():
    """A container's root without CAP_SYS_NICE (Docker's default set) cannot give a warm driver
    its priority back (drivers/process.py): it must not lower what it cannot restore."""
    if shutil.which("setpriv") is None:
        pytest.skip("no setpriv (util-linux)")
    check = "from shared import cpu_priority as c; print(c.privileged(), c.may_raise_priority())"
    setpriv = ["setpriv", "--bounding-set=-sys_nice", "--inh-caps=-sys_nice", "--"]
    repo = str(Path(__file__).resolve().parents[2])
    with_cap = subprocess.run([sys.executable, "-c", check], cwd=repo, capture_output=True, text=True, timeout=30)
    without = subprocess.run(
        [*setpriv, sys.executable, "-c", check], cwd=repo, capture_output=True, text=True, timeout=30
    )
    assert with_cap.stdout.split() == ["True", "True"], with_cap.stderr
    assert without.stdout.split() == ["False", "False"], without.stderr
