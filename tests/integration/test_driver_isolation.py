"""Drivers isolated from each other and root never led by a pipeline (issue 43), on a real local
cluster whose TaskManager runs as root and starts each driver as a user of its own: every test
plays the hostile pipeline of one finding and gets the refusal, the clear error or the harmless
outcome.

1, 4, 5: a pipeline probes its neighbours (another job's driver, a warm driver in reserve): their
   memory, environment, working directory, signals, their directories and its own artifact and
   marker. 2: it swaps its own checkpoint directories for links, and a restart finds what an older
   Headrace left (a driver-owned vertex directory, `live` a link to a root-only directory). 3: it
   attacks the savepoint and checkpoint roots after savepoints into both. 5: it attacks a files
   sink another job writes; a Delta table outlives the pool user of the attempt that made it.
   9: it writes a 64 MiB line and a traceback of 800 kB on its event pipe. 10: it fills a memfd,
   /dev/shm and System V segments past its limit, and asks for "1000g" and "off".

The clusters live under a directory of /tmp of their own (tests/integration/test_driver_sandbox.py
says why)."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import stat
import tempfile
import textwrap
import uuid
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from services.taskmanager.drivers.user import DEFAULT_NAME, give_to_drivers
from services.taskmanager.tasks.sink_claims import record_path
from tests.clusters import Rest, start_cluster
from tests.servers import IN_CI, missing
from tests.waiting import wait_for

# In CI (root, scripts/bootstrap run) nothing here may be skipped: a green run must have proved it.
pytestmark = pytest.mark.skipif(os.geteuid() != 0 and not IN_CI, reason="starting drivers as other users needs root")

DONE = ("FINISHED", "FAILED", "CANCELED")
PROBES = """
    import json, os, signal

    def attempt(fn):
        try:
            fn()
            return "done"
        except OSError as exc:
            return type(exc).__name__

    def report(path, seen):
        seen["uid"] = os.getuid()
        with open(path, "w") as f:
            json.dump(seen, f)
"""


def pool_uid(i: int = 0) -> int:
    try:
        return pwd.getpwnam(f"{DEFAULT_NAME}-{i}").pw_uid
    except KeyError:
        missing(f"the drivers' user {DEFAULT_NAME}-{i} (run scripts/bootstrap as root)")


@pytest.fixture(scope="module")
def root():
    pool_uid()
    path = Path(tempfile.mkdtemp(prefix="headrace-isolation-", dir="/tmp"))
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def cluster(root):
    home = root / "home"
    home.mkdir()
    c = start_cluster(
        home,
        catalog_url=f"sqlite:///{home / 'catalog.db'}",
        taskmanagers=1,
        slots=3,
        warm_drivers=2,
        driver_user=DEFAULT_NAME,
    )
    yield c
    c.stop()


@pytest.fixture(scope="module")
def rest(cluster):
    return Rest(cluster.dispatcher_url)


@pytest.fixture(scope="module")
def outbox(root):
    out = root / "outbox"
    out.mkdir()
    give_to_drivers(out, DEFAULT_NAME)
    return out


def submit(rest: Rest, root: Path, source: str, *args: str, **body) -> str:
    path = root / f"p{uuid.uuid4().hex[:8]}.py"
    path.write_text(textwrap.dedent(PROBES) + textwrap.dedent(source))
    body.setdefault("restartStrategy", {"type": "none"})
    return rest.run(rest.upload(path), parallelism=1, programArgsList=list(args), **body)


def finished(rest: Rest, job: str, state: str = "FINISHED", timeout_s: float = 300) -> dict:
    final = rest.wait_state(job, DONE, timeout_s=timeout_s)
    assert final["state"] == state, rest.get(f"/jobs/{job}/exceptions")
    return final


def read(path: Path, timeout_s: float = 240) -> dict:
    wait_for(
        f"the pipeline's report {path.name}",
        lambda: path.exists() and path.stat().st_size > 0,
        timeout_s=timeout_s,
        poll_s=0.3,
    )
    return json.loads(path.read_text())


VICTIM = """
    def build(ctx):
        report(ctx.args[0], {"pid": os.getpid(), "workdir": os.getcwd()})
        return ctx.sinks.console(ctx.sources.datagen(rows_per_second=1))
"""

NEIGHBOUR = """
    def runners(drivers):
        found = {}
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                argv = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\\0")
            except OSError:
                continue
            if b"services.taskmanager.runtime.runner" in argv and b"--workdir" in argv and int(pid) != os.getpid():
                workdir = argv[argv.index(b"--workdir") + 1].decode()
                if os.path.dirname(os.path.dirname(workdir)) == drivers:  # this cluster's drivers only
                    found[int(pid)] = workdir
        return found

    def build(ctx):
        mine = os.path.dirname(os.getcwd())
        seen = {"others": {}}
        for pid, workdir in runners(os.path.dirname(mine)).items():
            home = os.path.dirname(workdir)
            seen["others"][str(pid)] = {
                "mem": attempt(lambda: open(f"/proc/{pid}/mem", "rb").read(1)),
                "environ": attempt(lambda: open(f"/proc/{pid}/environ", "rb").read()),
                "cwd": attempt(lambda: os.readlink(f"/proc/{pid}/cwd")),
                "signal": attempt(lambda: os.kill(pid, signal.SIGKILL)),
                "list": attempt(lambda: os.listdir(workdir)),
                "write": attempt(lambda: open(os.path.join(workdir, "planted"), "w").close()),
                "artifact": attempt(lambda: os.symlink("/root", os.path.join(home, "artifact", "x.py"))),
                "marker": attempt(lambda: open(os.path.join(home, ".task-waiting"), "w").close()),
            }
        seen["own artifact"] = attempt(lambda: os.symlink("/root", os.path.join(mine, "artifact", "y.py")))
        seen["own marker"] = attempt(lambda: open(os.path.join(mine, ".task-waiting"), "w").close())
        report(ctx.args[0], seen)
        return ctx.sinks.console(ctx.sources.datagen(total=1, streaming=False))
"""


def runners_under(drivers: str) -> list[int]:
    """The runner processes whose work directory is under `drivers` (read as root)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if (
            b"services.taskmanager.runtime.runner" in argv
            and b"--workdir" in argv
            and argv[argv.index(b"--workdir") + 1].decode().startswith(drivers + "/")
        ):
            found.append(int(pid))
    return found


def test_a_pipeline_can_neither_read_signal_nor_write_another_driver(cluster, rest, root, outbox):
    secret = f"s3cret-{uuid.uuid4().hex}"
    victim = submit(rest, root, VICTIM, str(outbox / "victim.json"), config={"victim.secret": secret})
    rest.wait_attempt_running(victim, 0, timeout_s=300)
    v = read(outbox / "victim.json")
    # Non-dumpable from its start: its /proc files are root's, whoever runs it.
    assert os.stat(f"/proc/{v['pid']}/environ").st_uid == 0 and v["uid"] != 0
    # Two drivers in reserve: the probe takes one, the other stays a neighbour (warm-up tokens are
    # the machine's: they may wait).
    drivers = str(Path(v["workdir"]).parent.parent)
    wait_for(
        "two warm drivers in reserve",
        lambda: len(set(runners_under(drivers)) - {v["pid"]}) >= 2,
        timeout_s=300,
        poll_s=1,
    )
    probe = submit(rest, root, NEIGHBOUR, str(outbox / "neighbour.json"))
    finished(rest, probe)
    seen = read(outbox / "neighbour.json")
    assert seen["uid"] not in (0, v["uid"])
    assert str(v["pid"]) in seen["others"] and len(seen["others"]) >= 2, "the victim and a warm driver"
    refused = {
        "mem": "PermissionError",
        "environ": "PermissionError",
        "cwd": "PermissionError",
        "signal": "PermissionError",
        "list": "PermissionError",
        "write": "PermissionError",
        "artifact": "PermissionError",
        "marker": "PermissionError",
    }
    assert all(r == refused for r in seen["others"].values()), seen["others"]
    assert seen["own artifact"] == seen["own marker"] == "PermissionError"
    assert rest.job(victim)["state"] == "RUNNING" and os.path.exists(f"/proc/{v['pid']}")
    rest.cancel(victim)
    rest.wait_state(victim, DONE, timeout_s=120)


def test_an_upload_named_in_capitals_runs_on_a_driver(cluster, rest, root, outbox):
    # Finding 15: `ok.PY` passed upload and run, then the driver refused it.
    path = root / f"ok{uuid.uuid4().hex[:6]}.PY"
    path.write_text(textwrap.dedent(PROBES) + textwrap.dedent(VICTIM))
    job = rest.run(
        rest.upload(path),
        parallelism=1,
        programArgsList=[str(outbox / "capitals.json")],
        restartStrategy={"type": "none"},
    )
    rest.wait_attempt_running(job, 0, timeout_s=300)
    seen = read(outbox / "capitals.json")
    assert seen["uid"] != 0 and rest.job(job)["state"] == "RUNNING", rest.get(f"/jobs/{job}/exceptions")
    rest.cancel(job)
    rest.wait_state(job, DONE, timeout_s=120)


LINKS = """
    def build(ctx):
        out, secret = ctx.args
        live = os.path.dirname(ctx.checkpoint_dir)
        vertex = os.path.dirname(live)
        report(out, {
            "swap live": attempt(lambda: os.rename(live, live + ".moved")),
            "plant beside live": attempt(lambda: os.symlink(secret, live + "2")),
            "swap vertex": attempt(lambda: os.rename(vertex, vertex + ".moved")),
            "own attempt directory": attempt(lambda: open(os.path.join(ctx.checkpoint_dir, "mine"), "w").close()),
        })
        raise RuntimeError("failing on purpose")
"""


def test_root_follows_no_link_in_a_jobs_checkpoint_directories(cluster, rest, root, outbox):
    secret = root / "root-only"
    secret.mkdir(mode=0o700)
    job = submit(
        rest,
        root,
        LINKS,
        str(outbox / "links.json"),
        str(secret),
        restartStrategy={"type": "fixed-delay", "attempts": 1, "delay": "20 s"},
    )
    seen = read(outbox / "links.json")
    assert seen == {
        "swap live": "PermissionError",
        "plant beside live": "PermissionError",
        "swap vertex": "PermissionError",
        "own attempt directory": "done",
        "uid": seen["uid"],
    }
    wait_for("the first attempt's failure", lambda: rest.attempts(job)[0]["status"] == "FAILED", timeout_s=120)
    # What an older Headrace left: the vertex directory the drivers' user's, `live` a link.
    vertex = next((cluster.settings.checkpoints / job).iterdir())
    os.chown(vertex, pool_uid(3), pool_uid(3))
    os.chmod(vertex, 0o777)
    shutil.rmtree(vertex / "live")
    (vertex / "live").symlink_to(secret)
    finished(rest, job, "FAILED", timeout_s=180)
    cause = rest.attempts(job)[-1]["failure-cause"]
    assert "is a symbolic link or not a directory: not followed" in cause, cause
    assert stat.S_IMODE(secret.stat().st_mode) == 0o700 and secret.stat().st_uid == 0
    assert list(secret.iterdir()) == []
    taken_back = vertex.stat()
    assert taken_back.st_uid == 0 and stat.S_IMODE(taken_back.st_mode) & 0o022 == 0


def savepoint(rest: Rest, job: str, target: str | None = None) -> str:
    body = {"target-directory": target} if target else {}
    r = rest.http.post(f"/jobs/{job}/savepoints", json=body)
    assert r.status_code == 202, r.text
    rid = r.json()["request-id"]
    status = wait_for(
        "the savepoint",
        lambda: (s := rest.get(f"/jobs/{job}/savepoints/{rid}"))["status"]["id"] == "COMPLETED" and s,
        timeout_s=180,
    )
    assert "failure-cause" not in (status.get("operation") or {}), status
    return status["operation"]["location"]


ROOTS = """
    def build(ctx):
        out, sp_root, sp1, ck_root, sp2 = ctx.args
        report(out, {
            "savepoint root": attempt(lambda: open(os.path.join(sp_root, "planted"), "w").close()),
            "rename a savepoint": attempt(lambda: os.rename(sp1, sp1 + ".x")),
            "write a savepoint": attempt(lambda: open(os.path.join(sp1, "_metadata"), "w").close()),
            "checkpoint root": attempt(lambda: open(os.path.join(ck_root, "planted"), "w").close()),
            "rename one there": attempt(lambda: os.rename(sp2, sp2 + ".x")),
            "probe files": attempt(lambda: open(os.path.join(ck_root, ".headrace-probe", "tm-1"), "w").close()),
        })
        return ctx.sinks.console(ctx.sources.datagen(total=1, streaming=False))
"""


def test_savepoints_leave_the_storage_roots_root_and_other_pipelines_out(cluster, rest, root, outbox):
    job = submit(rest, root, VICTIM, str(outbox / "saved.json"))
    rest.wait_attempt_running(job, 0, timeout_s=300)
    ck, sp = cluster.settings.checkpoints, cluster.settings.savepoints
    into_default = savepoint(rest, job)
    into_checkpoints = savepoint(rest, job, str(ck))
    for r in (ck, sp):
        st = r.stat()
        assert st.st_uid == 0 and stat.S_IMODE(st.st_mode) & 0o022 == 0, (r, oct(st.st_mode))
    for location in (into_default, into_checkpoints):
        path = Path(location.removeprefix("file:"))
        assert (path.stat().st_uid, stat.S_IMODE(path.stat().st_mode)) == (0, 0o700)
        meta = json.loads((path / "_metadata").read_text())
        assert (path / "_metadata").stat().st_uid == 0 and meta["lineage"]["id"] == job == meta["job_id"]
    probe = submit(
        rest,
        root,
        ROOTS,
        str(outbox / "roots.json"),
        str(sp),
        into_default.removeprefix("file:"),
        str(ck),
        into_checkpoints.removeprefix("file:"),
    )
    finished(rest, probe)
    seen = read(outbox / "roots.json")
    assert {k: v for k, v in seen.items() if k != "uid"} == dict.fromkeys(
        [
            "savepoint root",
            "rename a savepoint",
            "write a savepoint",
            "checkpoint root",
            "rename one there",
            "probe files",
        ],
        "PermissionError",
    ), seen
    rest.cancel(job)
    rest.wait_state(job, DONE, timeout_s=120)


WRITER = """
    def build(ctx):
        report(ctx.args[1] + f".{ctx.attempt}", {"pid": os.getpid()})
        events = ctx.sources.datagen(seed=5, rows_per_second=20, max_rows_per_batch=20)
        return ctx.sinks.files(events.select("i", "url"), ctx.args[0], format="parquet", trigger="1 second")
"""
SINK_ATTACK = """
    def build(ctx):
        out_file, target, record = ctx.args
        meta = os.path.join(target, "_headrace")
        data = sorted(n for n in os.listdir(os.path.dirname(target)) if n) if os.path.isdir(target) else []
        report(out_file, {
            "owner record": attempt(lambda: open(os.path.join(meta, "owner.json"), "w").close()),
            "fence record": attempt(lambda: open(record, "w").close()),
            "list the output": attempt(lambda: os.listdir(target)),
            "delete the output": attempt(lambda: os.unlink(os.path.join(target, "b0-a0-x.parquet"))),
            "move the output": attempt(lambda: os.rename(target, target + ".gone")),
            "seen": data,
        })
        df = ctx.sources.datagen(total=3, streaming=False)
        return ctx.sinks.files(df.select("i"), target, format="parquet", mode="overwrite")
"""


def test_a_pipeline_cannot_forge_or_destroy_another_jobs_files_sink(cluster, rest, root, outbox):
    data = root / "data"
    data.mkdir()
    give_to_drivers(data, DEFAULT_NAME)  # the operator's grant: the parent, group-writable and sticky
    out = data / "out"
    writer = submit(
        rest,
        root,
        WRITER,
        str(out),
        str(outbox / "writer"),
        restartStrategy={"type": "fixed-delay", "attempts": 2, "delay": "1 s"},
        config={"execution.checkpointing.interval": "2 s"},
    )
    rest.wait_attempt_running(writer, 0, timeout_s=300)
    commits = out / "_headrace" / "commits"
    wait_for("three committed batches", lambda: len(list(commits.glob("*.json"))) >= 3, timeout_s=180)
    record = record_path(cluster.settings.checkpoints, out)
    assert json.loads(record.read_text())["owner"]["lineage"] == writer
    attacker = submit(rest, root, SINK_ATTACK, str(outbox / "sink.json"), str(out), str(record))
    finished(rest, attacker, "FAILED")
    seen = read(outbox / "sink.json")
    assert {k: v for k, v in seen.items() if k not in ("uid", "seen")} == dict.fromkeys(
        ["owner record", "fence record", "list the output", "delete the output", "move the output"], "PermissionError"
    ), seen
    root_cause = rest.get(f"/jobs/{attacker}/exceptions")["root-exception"]
    assert "SinkOwnedError" in root_cause and f"is the sink of lineage {writer}" in root_cause, root_cause
    seen_before = len(list(commits.glob("*.json")))
    wait_for("the writer's next batches", lambda: len(list(commits.glob("*.json"))) >= seen_before + 2, timeout_s=120)
    assert rest.job(writer)["state"] == "RUNNING" and len(rest.attempts(writer)) == 1
    # Its driver killed: the next attempt, another user, restores its checkpoint through a view
    # and claims the directory back; every event once.
    os.kill(read(outbox / "writer.0")["pid"], 9)
    rest.wait_attempt_running(writer, 1, timeout_s=300)
    assert read(outbox / "writer.1")["uid"] != read(outbox / "writer.0")["uid"]
    seen_before = len(list(commits.glob("*.json")))
    wait_for("the next attempt's batches", lambda: len(list(commits.glob("*.json"))) >= seen_before + 2, timeout_s=180)
    rest.cancel(writer)
    rest.wait_state(writer, DONE, timeout_s=120)
    wait_for("the directory taken back from the writer's user", lambda: out.stat().st_uid == 0, timeout_s=30)
    assert {p.stat().st_uid for p in out.rglob("*") if not p.is_symlink()} == {0}
    ids = sorted(i for f in out.glob("b*-a*-*.parquet") for i in pq.read_table(f, columns=["i"])["i"].to_pylist())
    assert ids == list(range(len(ids))), "every event once across the restart"


DELTA_WRITER = """
    def build(ctx):
        report(ctx.args[1] + f".{ctx.attempt}", {"pid": os.getpid()})
        events = ctx.sources.datagen(seed=5, rows_per_second=20, max_rows_per_batch=20)
        return ctx.sinks.delta(events.select("i", "url"), ctx.args[0], trigger="1 second")
"""


def test_a_delta_table_outlives_the_pool_user_of_the_attempt_that_made_it(cluster, rest, root, outbox):
    # The table is made by one pool user; after its driver is killed the next attempt runs as
    # another and must go on committing to it (the lake is the drivers' group's, setgid, and
    # Hadoop writes its files group-writable there), every event once.
    from deltalake import DeltaTable

    name = f"isolated_{uuid.uuid4().hex[:6]}"
    table = cluster.settings.lake / name
    writer = submit(
        rest,
        root,
        DELTA_WRITER,
        name,
        str(outbox / "delta"),
        restartStrategy={"type": "fixed-delay", "attempts": 2, "delay": "1 s"},
        config={"execution.checkpointing.interval": "2 s"},
    )
    rest.wait_attempt_running(writer, 0, timeout_s=300)

    def version() -> int:
        return DeltaTable(str(table)).version() if (table / "_delta_log").is_dir() else -1

    wait_for("three Delta commits", lambda: version() >= 3, timeout_s=240)
    os.kill(read(outbox / "delta.0")["pid"], 9)
    rest.wait_attempt_running(writer, 1, timeout_s=300)
    assert read(outbox / "delta.1")["uid"] != read(outbox / "delta.0")["uid"]
    before = version()
    wait_for("the next attempt's commits", lambda: version() >= before + 2, timeout_s=180)
    rest.cancel(writer)
    rest.wait_state(writer, DONE, timeout_s=120)
    assert rest.attempts(writer)[-1]["attempt"] == 1, "no failure after the new user took over"
    ids = sorted(DeltaTable(str(table)).to_pyarrow_table(columns=["i"])["i"].to_pylist())
    assert ids == list(range(len(ids))) and len(ids) > 0, "every event once across the change of user"


LOUD_EVENTS = """
    import gc

    def build(ctx):
        writer = next(o for o in gc.get_objects() if type(o).__name__ == "EventWriter")
        writer._out.write(b"{" + b"x" * (64 << 20) + b"}\\n")
        tb = "HEAD" + "A" * 200_000 + "Z" * 600_000 + "TAIL"
        writer._out.write(json.dumps({"event": "failed", "error_name": "E" * 10_000, "traceback": tb}).encode()
                          + b"\\n")
        os._exit(1)
"""


def test_driver_events_are_bounded_before_they_are_published(cluster, rest, root):
    job = submit(rest, root, LOUD_EVENTS)
    finished(rest, job, "FAILED")
    r = rest.http.get(f"/jobs/{job}/exceptions")
    assert len(r.content) < 300_000, len(r.content)
    text = r.json()["root-exception"]
    assert "characters cut: the driver sent 800008" in text and "HEAD" in text and "TAIL" in text, text[:300]
    logs = [p for p in cluster.settings.home.rglob("*.log") if "taskmanager" in p.name]
    assert any(b"dropped unread" in p.read_bytes() for p in logs), logs


SHMEM_HOG = """
    import ctypes, time

    CHUNK = 32 << 20

    def sysv_segment():
        # A System V segment of its own: attached, filled, detached, and left for nobody to map.
        libc = ctypes.CDLL(None, use_errno=True)
        libc.shmat.restype = ctypes.c_void_p
        libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
        libc.shmdt.argtypes = [ctypes.c_void_p]
        shmid = libc.shmget(0, ctypes.c_size_t(CHUNK), 0o1000 | 0o600)  # IPC_PRIVATE, IPC_CREAT
        addr = libc.shmat(shmid, None, 0) if shmid >= 0 else None
        if addr in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), "shmget/shmat")
        ctypes.memset(addr, 1, CHUNK)
        libc.shmdt(ctypes.c_void_p(addr))

    def build(ctx):
        kind, name = ctx.args
        fd = None
        if kind == "memfd":
            fd = os.memfd_create("hog")
        elif kind == "shm":
            fd = os.open(f"/dev/shm/{name}", os.O_WRONLY | os.O_CREAT, 0o600)
        chunk = b"\\x01" * CHUNK
        for _ in range(200):
            if fd is None:
                sysv_segment()
            else:
                os.write(fd, chunk)
            time.sleep(0.02)
        raise RuntimeError("wrote 6.4 GB of shared memory and was never stopped")
"""


def sysv_segments_of(uids: set[int]) -> list[str]:
    with open("/proc/sysvipc/shm") as f:
        header = f.readline().split()
        rows = [dict(zip(header, line.split(), strict=False)) for line in f]
    return [r["shmid"] for r in rows if int(r["uid"]) in uids or int(r["cuid"]) in uids]


@pytest.mark.parametrize("kind", ["memfd", "shm", "sysv"])
def test_shared_memory_held_unmapped_counts_against_the_limit(cluster, rest, root, kind):
    name = f"hog-{uuid.uuid4().hex[:8]}"
    pool = {pool_uid(i) for i in range(32)}
    before = set(sysv_segments_of(pool))
    job = submit(rest, root, SHMEM_HOG, kind, name, config={"headrace.task.memory-limit": "1500m"})
    finished(rest, job, "FAILED")
    entry = rest.get(f"/jobs/{job}/exceptions")["exceptionHistory"]["entries"][0]
    assert entry["exceptionName"] == "MemoryLimitExceeded", entry
    # Either the kernel stopped it at its cgroup's memory.max (which charges shmem by itself), or
    # the watch did, on PSS plus the shared memory held unmapped: never PSS alone.
    trace = entry["stacktrace"]
    assert "the cgroup's charge" in trace or (
        "PSS summed" in trace and "of shared memory they hold unmapped" in trace
    ), trace
    wait_for(
        "the task's /dev/shm file removed with its user", lambda: not Path(f"/dev/shm/{name}").exists(), timeout_s=30
    )
    wait_for(
        "the task's System V segments removed with its user",
        lambda: not set(sysv_segments_of(pool)) - before,
        timeout_s=30,
    )


@pytest.mark.parametrize(
    "limit, says",
    [("1000g", "is above this cluster's maximum"), ("off", "turns the task's memory limit off, which this cluster")],
)
def test_a_memory_limit_beyond_the_clusters_maximum_is_refused(cluster, rest, root, limit, says):
    job = submit(rest, root, VICTIM, str(root / "never.json"), config={"headrace.task.memory-limit": limit})
    finished(rest, job, "FAILED", timeout_s=180)
    entry = rest.get(f"/jobs/{job}/exceptions")["exceptionHistory"]["entries"][0]
    assert entry["exceptionName"] == "MemoryLimitRefused" and says in entry["stacktrace"], entry
