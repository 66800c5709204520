"""services/taskmanager/runtime/jit_in_reserve.py against real processes and threads: a stand-in
"JVM" (a process named `java` whose threads carry HotSpot's compiler thread names) below this one.
A real driver's JVM is covered by tests/integration/test_runner.py."""

from __future__ import annotations

import os
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


def test_release_after_a_grace_period_without_a_first_batch(fake_jvm):
    me = fake_jvm.pid
    optimizer = jit.OptimizerInReserve(me).start()
    wait_for("the C2 threads idle", lambda: c2_policies(me), 10, poll_s=0.05, until=lambda p: p == {os.SCHED_IDLE})
    optimizer.release_after(0.3)
    wait_for("the C2 threads released", lambda: c2_policies(me), 5, poll_s=0.05, until=lambda p: p == {os.SCHED_OTHER})


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


# Run as a drivers' user: starts a fake JVM below it and holds C2 in reserve (told or not that
# its parent gives C2 back), releases it as a first batch would, prints the fake JVM's pid and
# whether it idled, then waits for stdin to close.
AS_DRIVER = textwrap.dedent("""
    import json, os, subprocess, sys, time
    from services.taskmanager.runtime import jit_in_reserve as jit
    pipe = subprocess.PIPE
    fake = subprocess.Popen([sys.executable, "-c", sys.argv[2]], stdin=pipe, stdout=pipe, text=True)
    fake.stdout.readline()
    optimizer = jit.OptimizerInReserve(os.getpid(), given_back_by_parent=sys.argv[1] == "parent").start()
    deadline = time.monotonic() + 10
    while optimizer.supported and not optimizer.idled and time.monotonic() < deadline:
        time.sleep(0.05)
    optimizer.release()
    print(json.dumps({"fake": fake.pid, "supported": optimizer.supported}), flush=True)
    sys.stdin.read()
    fake.kill()
""")


@pytest.fixture
def as_driver():
    """Starts AS_DRIVER as a drivers' user; yields a function of the mode."""
    import json
    import pwd

    from services.taskmanager.drivers.user import DEFAULT_NAME

    if os.geteuid() != 0:
        pytest.skip("starting a process as a drivers' user needs root")
    try:
        user = pwd.getpwnam(f"{DEFAULT_NAME}-0")
    except KeyError:
        pytest.skip(f"no user {DEFAULT_NAME}-0: run scripts/bootstrap as root")
    started = []

    def start(mode: str) -> tuple[subprocess.Popen, dict]:
        proc = subprocess.Popen(
            [sys.executable, "-c", AS_DRIVER, mode, FAKE_JVM],
            user=user.pw_uid,
            group=user.pw_gid,
            extra_groups=[],
            cwd="/",
            env={"PYTHONPATH": str(Path(__file__).resolve().parents[2]), "PATH": os.environ.get("PATH", "")},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        started.append(proc)
        line = proc.stdout.readline()
        assert line, f"the driver stand-in ended (exit {proc.wait(10)})"
        return proc, json.loads(line)

    yield start
    for proc in started:
        proc.kill()
        proc.wait(10)


def test_a_drivers_user_cannot_give_c2_back_so_its_taskmanager_does(as_driver):
    """The kernel refuses an unprivileged process the way out of SCHED_IDLE (RLIMIT_NICE 0): a
    driver running as a drivers' user left C2 idle for its whole task. Now the TaskManager (root)
    gives it back (drivers/process.py give_c2_back)."""
    proc, seen = as_driver("parent")
    assert seen["supported"]
    assert c2_policies(seen["fake"]) == {os.SCHED_IDLE}  # its own release could not
    assert jit.give_back(proc.pid) == 1
    assert c2_policies(seen["fake"]) == {os.SCHED_OTHER}
    assert jit.give_back(proc.pid) == 0  # nothing idle is left


def test_a_driver_nobody_could_give_c2_back_to_never_idles_it(as_driver):
    _, seen = as_driver("alone")
    assert not seen["supported"]
    assert c2_policies(seen["fake"]) == {os.SCHED_OTHER}


@pytest.mark.skipif(os.geteuid() != 0, reason="dropping a capability of root")
def test_a_root_without_cap_sys_nice_is_not_taken_for_one_that_can_raise_priorities():
    """A container's root without CAP_SYS_NICE (Docker's default set) cannot give a warm driver
    its priority or its C2 back; it must neither lower nor idle what it cannot restore."""
    check = "from shared import cpu_priority as c; print(c.privileged(), c.may_raise_priority())"
    setpriv = ["setpriv", "--bounding-set=-sys_nice", "--inh-caps=-sys_nice", "--"]
    if subprocess.run(["which", "setpriv"], capture_output=True).returncode != 0:
        pytest.skip("no setpriv (util-linux)")
    repo = str(Path(__file__).resolve().parents[2])
    with_cap = subprocess.run([sys.executable, "-c", check], cwd=repo, capture_output=True, text=True, timeout=30)
    without = subprocess.run(
        [*setpriv, sys.executable, "-c", check], cwd=repo, capture_output=True, text=True, timeout=30
    )
    assert with_cap.stdout.split() == ["True", "True"], with_cap.stderr
    assert without.stdout.split() == ["False", "False"], without.stderr
