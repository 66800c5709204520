"""The driver process as a TaskManager sees it: a subprocess speaking the task protocol.

Each test starts real runner processes (JVM included), so they are few and their inputs small;
independent drivers run side by side to share the start-up cost.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter
from pathlib import Path

import psutil
import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa

from services.taskmanager.runtime import class_archive, jit_in_reserve
from services.taskmanager.runtime.connectors.datagen import generate_events
from services.taskmanager.runtime.connectors.ownership import SinkOwner
from services.taskmanager.runtime.connectors.sql_engine import make_engine
from services.taskmanager.tasks.sink_claims import SinkClaims
from shared import safe_fs
from shared.driver_contract import remove_python_socket_dirs
from shared.settings import Settings
from shared.spark_runtime import SparkRuntime
from shared.task_protocol import TASK_WAITING_MARKER, CancelRun, Granted, RunTask, TaskSpec, decode_event, encode_line
from shared.untrusted_code import UntrustedUser
from tests.waiting import wait_for

REPO = Path(__file__).resolve().parents[2]
CLICKSTREAM = REPO / "examples" / "clickstream.py"
START_TIMEOUT = 240  # a cold JVM on a busy 2-core machine

# A stand-in TaskManager that only starts the runner and waits: killing it orphans the runner.
# Starts the runner as services/taskmanager/drivers/process.py does: in a session of its own.
FAKE_TASKMANAGER = textwrap.dedent("""
    import os, subprocess, sys
    fd = int(os.environ["EVENTS_FD"])
    sys.exit(subprocess.Popen(sys.argv[1:], pass_fds=(fd,), start_new_session=True).wait())
""")


def machine_runtime() -> tuple[str, ...]:
    """The drivers' jars and class archive, as a TaskManager passes them (scripts/bootstrap
    fetched and built them): the drivers here start as production's do."""
    return tuple(SparkRuntime.from_settings(Settings()).cli_args())


class Driver:
    """A runner process, its event stream and its process tree."""

    @staticmethod
    def _environment(events_fd: int, jvm_options: str | None) -> dict[str, str]:
        """`jvm_options`: the driver's JDK_JAVA_OPTIONS instead of the suite's (tests/conftest.py)."""
        env = {**os.environ, "EVENTS_FD": str(events_fd)}
        if jvm_options is not None:
            env["JDK_JAVA_OPTIONS"] = jvm_options
        return env

    def __init__(
        self,
        workdir: Path,
        *,
        warm: bool = False,
        via_parent: bool = False,
        extra: tuple[str, ...] = (),
        jvm_options: str | None = None,
    ):
        workdir.mkdir(parents=True, exist_ok=True)
        self.workdir = workdir
        r, w = os.pipe()
        cmd = [
            sys.executable,
            "-m",
            "services.taskmanager.runtime.runner",
            "--parallelism",
            "2",
            "--workdir",
            str(workdir),
            "--events-fd",
            str(w),
            "--shuffle-partitions",
            "2",
            *machine_runtime(),
            *extra,
        ]  # a test's own --class-archive-dir comes last and wins
        if not warm:
            cmd.append("--no-warmup")
        elif "--warm-up-batches" not in extra:
            cmd += ["--warm-up-batches", os.environ["HEADRACE_WARM_UP_BATCHES"]]  # the suite's (conftest)
        if via_parent:
            cmd = [sys.executable, "-c", FAKE_TASKMANAGER, *cmd]
        self.log_path = workdir / "driver.log"
        log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            cmd,
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=log,
            stderr=subprocess.STDOUT,
            pass_fds=(w,),
            env=self._environment(w, jvm_options),
        )
        os.close(w)
        log.close()
        self.events: queue.Queue = queue.Queue()
        self.seen: list = []
        reader = os.fdopen(r, "rb")

        def pump() -> None:
            for line in reader:
                self.events.put(decode_event(line))
            self.events.put(None)  # EOF: every holder of the write end is gone

        threading.Thread(target=pump, daemon=True).start()
        self.tree: list[psutil.Process] = []
        self.spec: TaskSpec | None = None

    def next_event(self, timeout: float):
        try:
            ev = self.events.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no driver event within {timeout}s; log:\n{self.log_tail()}") from None
        if ev is None:
            raise AssertionError(f"driver events ended after {[e.event for e in self.seen]}; log:\n{self.log_tail()}")
        self.seen.append(ev)
        if ev.event == "claim_directory":  # a files sink asks for its directory: answered as a TaskManager does
            self.send(encode_line(self.answer_claim(ev)))
            return self.next_event(timeout)
        return ev

    def answer_claim(self, ev) -> Granted:
        assert self.spec is not None, "a claim before any task"
        checkpoints = Path(self.spec.checkpoint_dir).parent
        checkpoints.mkdir(parents=True, exist_ok=True)
        claims = SinkClaims(checkpoints, safe_fs.Ownership(), UntrustedUser(None, os.geteuid(), os.getegid()))
        owner = SinkOwner(lineage=self.spec.job_id, job_id=self.spec.job_id, generation=0)
        record = claims.claim(
            ev.path, kind=ev.kind, attempt=ev.attempt, restored_batch_id=ev.restored_batch_id, owner=owner
        )
        return Granted(request_id=ev.request_id, path=record)

    def expect(self, name: str, timeout: float = 60):
        ev = self.next_event(timeout)
        assert ev.event == name, f"expected {name}, got {ev}; log:\n{self.log_tail()}"
        return ev

    def read_until(self, pred, timeout: float, skip: tuple[str, ...] = ("progress",)):
        """The next event `pred` accepts, read from the driver's stream (not a poll: every event in
        between is consumed, and must be of a kind in `skip`)."""
        deadline = time.monotonic() + timeout
        while True:
            ev = self.next_event(max(0.1, deadline - time.monotonic()))
            if pred(ev):
                return ev
            assert ev.event in skip, f"unexpected {ev}; log:\n{self.log_tail()}"

    def ready(self):
        warming = self.expect("warming", START_TIMEOUT)  # its session is up, the warm-up runs
        ev = self.expect("ready", START_TIMEOUT)
        assert warming.startup_s <= ev.startup_s
        root = psutil.Process(ev.pid)
        self.tree = [root, *root.children(recursive=True)]
        assert any("java" in p.name() for p in self.tree), "no JVM under the driver"
        return ev

    def run(self, spec: TaskSpec) -> None:
        self.spec = spec
        self.send(encode_line(RunTask(spec=spec)))

    def send(self, line: bytes) -> None:
        self.proc.stdin.write(line)
        self.proc.stdin.flush()

    def assert_tree_gone(self, timeout: float = 30) -> None:
        def alive(p: psutil.Process) -> bool:
            try:
                return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
            except psutil.NoSuchProcess:
                return False

        wait_for(
            "no process of the driver's tree left behind",
            lambda: [p for p in self.tree if alive(p)],
            timeout,
            poll_s=0.2,
            until=lambda left: left == [],
        )

    def log_tail(self, n: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def kill(self) -> None:
        for p in self.tree:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
        remove_python_socket_dirs(self.workdir)  # a TaskManager's cleanup


@pytest.fixture
def drivers():
    started: list[Driver] = []

    def start(workdir: Path, **kw) -> Driver:
        d = Driver(workdir, **kw)
        started.append(d)
        return d

    yield start
    for d in started:  # never leave a JVM behind, whatever failed
        d.kill()


def spec(
    tmp_path: Path, artifact: Path, *args: str, job_id: str = "job-1", attempt: int = 1, catalog_url: str | None = None
) -> TaskSpec:
    return TaskSpec(
        job_id=job_id,
        vertex_id="v-1",
        execution_id=f"x-{attempt}",
        attempt=attempt,
        parallelism=2,
        artifact_path=str(artifact),
        program_args=args,
        checkpoint_dir=str(tmp_path / "checkpoints" / job_id),
        catalog_url=catalog_url or f"sqlite:///{tmp_path / 'catalog.db'}",
        redis_url="redis://127.0.0.1:1/0",
    )


def window_counts(url: str, table: str) -> dict:
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(sa.text(f"select window_start, url, count from {table}")).all()
    finally:
        engine.dispose()
    return {(ws, u): c for ws, u, c in rows}


def expected_counts(seed: int, total: int) -> dict:
    return dict(
        Counter(
            (e["event_time"].replace(second=0, microsecond=0, tzinfo=None), e["url"])
            for e in generate_events(seed, 0, total)
        )
    )


def test_clickstream_exact_counts_survive_kill9_mid_stream(drivers, pg_url, tmp_path):
    seed, total = 11, 3000
    args = ("--total", str(total), "--rate", "250", "--seed", str(seed), "--sink-url", pg_url)
    task = spec(tmp_path, CLICKSTREAM, *args)

    first = drivers(tmp_path / "attempt1", warm=True)
    first.ready()
    t_run = time.monotonic()
    first.run(task)
    first.expect("initializing")
    assert first.expect("running", 60).streaming is True
    first.read_until(lambda e: e.event == "progress" and e.num_input_rows > 0 and e.batch_id >= 2, 120)
    print(f"warm driver: RunTask -> third batch {time.monotonic() - t_run:.1f}s")
    os.kill(first.proc.pid, signal.SIGKILL)
    first.proc.wait(10)
    first.assert_tree_gone()  # the JVM exits when its driver's pipe closes
    partial = window_counts(pg_url, "clicks_per_minute")
    assert 0 < sum(partial.values()) < total, "the kill must land mid-stream"

    second = drivers(tmp_path / "attempt2")
    second.ready()
    second.run(task.model_copy(update={"attempt": 2, "execution_id": "x-2"}))
    second.expect("initializing")
    second.expect("running", 60)
    progress = []
    done = second.read_until(lambda e: (e.event == "progress" and progress.append(e)) or e.event == "finished", 180)
    assert done.event == "finished"
    assert progress and progress[0].batch_id > 0, "the second attempt must resume, not restart"
    assert second.proc.wait(30) == 0
    assert window_counts(pg_url, "clicks_per_minute") == expected_counts(seed, total)


def test_batch_job_finishes_on_a_hurried_warm_driver_and_failures_are_reported_with_their_traceback(drivers, tmp_path):
    bad_build = tmp_path / "bad_build.py"
    bad_build.write_text("def build(ctx):\n    raise ValueError('no pipeline for you')\n")
    bad_stream = tmp_path / "bad_stream.py"
    bad_stream.write_text(
        textwrap.dedent("""
        from pyspark.sql import functions as F

        def explode(i):
            raise RuntimeError(f"poisoned event {i}")

        def build(ctx):
            clicks = ctx.sources.datagen(seed=1, total=50)
            bad = clicks.select(F.udf(explode, "long")("i").alias("x"))
            return ctx.sinks.console(bad)
    """)
    )
    a = drivers(tmp_path / "a")
    b = drivers(tmp_path / "b")
    # c is a warm driver that a task already waits for (the TaskManager's marker, DriverProcess.hurry,
    # is there when it starts, as when a task takes a driver still starting): it skips its warm-up.
    hurried = tmp_path / "c"
    hurried.mkdir()
    (hurried / TASK_WAITING_MARKER).touch()
    c = drivers(hurried, warm=True)
    a.ready()
    b.ready()
    c.ready()
    assert "warm-up cut short" in c.log_tail() and "warm-up took" not in c.log_tail()
    assert "in the SQL drivers' imports: a task is waiting" in c.log_tail()  # where the cut came
    a.run(spec(tmp_path, bad_build))
    b.run(spec(tmp_path, bad_stream, job_id="job-2"))
    out = tmp_path / "daily"
    c.run(
        spec(
            tmp_path,
            REPO / "examples" / "batch_sql_to_parquet.py",
            "--seed-events",
            "500",
            "--output",
            str(out),
            job_id="job-3",
        )
    )

    c.expect("initializing")
    assert c.expect("running", 60).streaming is False
    c.expect("finished", 120)
    assert c.proc.wait(30) == 0
    daily = pq.read_table(out).to_pylist()
    assert sum(r["clicks"] for r in daily) == 500

    a.expect("initializing")
    failed = a.expect("failed", 60)
    assert failed.error_name == "ValueError"
    assert "no pipeline for you" in failed.traceback and "bad_build.py" in failed.traceback
    assert a.proc.wait(30) == 1

    b.expect("initializing")
    b.expect("running", 60)
    failed = b.read_until(lambda e: e.event == "failed", 120)
    assert failed.error_name == "StreamingQueryException"
    # Spark's message carries the worker's Python traceback.
    assert "RuntimeError: poisoned event" in failed.traceback and "in explode" in failed.traceback
    assert b.proc.wait(30) == 1
    for d in (a, b, c):
        d.assert_tree_gone()


def test_cancel_by_command_or_sigterm_stops_driver_and_jvm(drivers, tmp_path):
    endless = ("--total", "10000000", "--rate", "100", "--sink-url", f"sqlite:///{tmp_path / 'sink.db'}")
    by_cmd = drivers(tmp_path / "cmd")
    by_term = drivers(tmp_path / "term")
    by_cmd.ready()
    by_term.ready()
    by_cmd.run(spec(tmp_path, CLICKSTREAM, *endless, job_id="job-cmd"))
    by_term.run(spec(tmp_path, CLICKSTREAM, *endless, job_id="job-term"))
    for d in (by_cmd, by_term):
        d.expect("initializing")
        d.expect("running", 60)
    by_cmd.read_until(lambda e: e.event == "progress", 120)
    by_cmd.send(encode_line(CancelRun()))
    by_term.read_until(lambda e: e.event == "progress", 120)
    os.kill(by_term.proc.pid, signal.SIGTERM)
    for d in (by_cmd, by_term):
        d.read_until(lambda e: e.event == "canceled", 60)
        assert d.proc.wait(30) == 0
        d.assert_tree_gone()


def test_a_warm_driver_forks_its_python_daemons_and_compiles_with_c2_on_idle_cpu_only(drivers, pg_url, tmp_path):
    """With the fork server, Spark's worker daemons are forked from it (the server's children,
    PySpark already imported); while the driver waits in reserve its JVM's C2 compiler thread
    runs under SCHED_IDLE, and keeps it when the task comes (jit_in_reserve.py). Both must leave
    the task's results exact and no process behind."""
    # With every tier of the JIT, as users run it: the suite's JVMs stop at C1, which has no C2 thread.
    d = drivers(tmp_path / "warm", warm=True, extra=("--python-forkserver",), jvm_options="")
    d.ready()

    def cmdline(p: psutil.Process) -> list[str]:
        try:
            return p.cmdline()
        except psutil.Error:  # ended (a zombie) since the tree was taken
            return []

    # Forked children keep the server's command line: the server is the one the driver started.
    server = [p for p in d.tree if "--serve" in cmdline(p) and p.ppid() == d.proc.pid]
    assert len(server) == 1, [cmdline(p) for p in d.tree]
    daemons = [p for p in d.tree if cmdline(p) and p.ppid() == server[0].pid]
    assert len(daemons) >= 3, "the warm-up's data source query needs pyspark.worker and the planner's daemons"
    cold = [cmdline(p) for p in d.tree if cmdline(p)[1:3] == ["-m", "pyspark.daemon"]]  # the launchers exec this
    assert cold == [], f"daemons started by a fresh interpreter instead of the fork server: {cold}"
    c2 = jit_in_reserve.c2_threads(d.proc.pid)
    assert c2, "no C2 compiler thread found in the driver's JVM"
    assert {os.sched_getscheduler(t) for t in c2} == {os.SCHED_IDLE}

    d.run(spec(tmp_path, CLICKSTREAM, "--total", "600", "--rate", "300", "--seed", "5", "--sink-url", pg_url))
    d.expect("initializing")
    d.expect("running", 60)
    d.read_until(lambda e: e.event == "progress", 120)
    # The JVM retires idle compiler threads (UseDynamicNumberOfCompilerThreads), so by now there may
    # be none left; every one that is left still compiles on idle CPU only.
    assert {os.sched_getscheduler(t) for t in jit_in_reserve.c2_threads(d.proc.pid)} <= {os.SCHED_IDLE}
    assert d.read_until(lambda e: e.event == "finished", 120).event == "finished"
    assert d.proc.wait(30) == 0
    assert window_counts(pg_url, "clicks_per_minute") == expected_counts(5, 600)
    d.assert_tree_gone()
    # Preloaded modules are run on purpose: runpy's warning about them would be noise in the log.
    assert "found in sys.modules" not in d.log_path.read_text(errors="replace")


def test_a_driver_with_a_broken_class_archive_starts_and_exits_when_its_taskmanager_is_killed(drivers, tmp_path):
    """A half-written or foreign class-data-sharing archive must not keep a driver from starting:
    the JVM ignores an archive it cannot map (class_archive.py). Orphaned, the driver goes."""
    archive_dir = tmp_path / "cds"
    archive = class_archive.archive_path(archive_dir)
    assert archive is not None
    archive_dir.mkdir()
    archive.write_bytes(b"not an archive" * 1000)
    d = drivers(tmp_path / "orphan", via_parent=True, extra=("--class-archive-dir", str(archive_dir)))
    ev = d.ready()
    assert ev.parallelism == 2
    fake_tm = psutil.Process(d.proc.pid)
    assert psutil.Process(ev.pid).ppid() == fake_tm.pid
    fake_tm.kill()  # kill -9 of the TaskManager
    d.proc.wait(10)
    d.assert_tree_gone(timeout=30)


def test_a_driver_whose_taskmanager_died_before_it_started_watching_exits(drivers, tmp_path):
    """A TaskManager killed right after it spawned the driver: the driver's parent is init by the
    time its watchdog starts. It is told the TaskManager's pid, so it still knows it is orphaned."""
    d = drivers(tmp_path / "born-orphan", extra=("--parent-pid", str(2**22 + 1)))  # no such process
    assert d.proc.wait(60) != 0
    assert "parent process died" in d.log_tail()
    d.tree = []


def _java_under(proc):
    """The JVM among a process's descendants, if one is up yet. The launcher's short-lived
    helpers (bash, the class-path probe) can exit between listing and naming them."""
    for child in proc.children(recursive=True):
        try:
            if child.name() == "java":
                return child
        except psutil.NoSuchProcess:
            continue
    return None


def test_a_driver_orphaned_while_starting_takes_its_jvm_along(drivers, tmp_path):
    """The TaskManager dies while the driver's JVM starts, before that JVM reads its stdin (as
    when it cannot write its connection file because a restarted TaskManager removed the old
    work dir): the JVM would never see the runner go. Stood in for by a stopped JVM."""
    d = drivers(tmp_path / "orphan-starting", via_parent=True)
    fake_tm = psutil.Process(d.proc.pid)
    jvm = wait_for(
        "a JVM started under the driver",
        lambda: _java_under(fake_tm),
        START_TIMEOUT,
        poll_s=0.02,
        until=lambda found: found is not None,
    )
    d.tree = [fake_tm, *fake_tm.children(recursive=True)]
    jvm.suspend()
    fake_tm.kill()
    d.proc.wait(10)
    try:
        d.assert_tree_gone(timeout=30)
    finally:
        if jvm.is_running():
            jvm.kill()
