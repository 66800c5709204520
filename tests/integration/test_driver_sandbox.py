"""The driver sandbox on a real local cluster (redis-server with ACL users, SQLite catalog, one
TaskManager as root starting its drivers as the unprivileged driver user), probed as a hostile
pipeline author would: a pipeline that reads its environment and opens the services' files, a
build() that allocates past its memory limit, one whose forked children share its memory (counted
once against the limit, and shown on the dashboard's TaskManager page), a build() that forks and
setsid()s a sleeper, a pipeline that prints 100 MB.

The clusters live under a directory of /tmp of their own: pytest's temporary directories are 0700
to others, so the driver user could not reach a home inside them (tests/conftest.py)."""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import tempfile
import textwrap
import time
from pathlib import Path

import httpx
import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from services.taskmanager.drivers import env as driver_env
from services.taskmanager.drivers.user import DEFAULT_NAME, give_to_drivers
from tests.clusters import Rest, start_cluster
from tests.integration.support import alive, wait_gone
from tests.waiting import wait_for

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="starting drivers as another user needs root")

LOG_CAP = 4 * 1024**2
DONE = ("FINISHED", "FAILED", "CANCELED")


def driver_uids() -> set[int]:
    """The uids of the drivers' users (shared/sandbox_users.py)."""
    try:
        return {pwd.getpwnam(f"{DEFAULT_NAME}-{i}").pw_uid for i in range(32)}
    except KeyError:
        pytest.skip(f"no users {DEFAULT_NAME}-0..31: run scripts/bootstrap as root")


def sandbox_cluster(root: Path, name: str, **settings):
    home = root / name
    home.mkdir()
    return start_cluster(
        home,
        catalog_url=f"sqlite:///{home / 'catalog.db'}",
        taskmanagers=1,
        slots=2,
        warm_drivers=0,
        driver_user=DEFAULT_NAME,
        **settings,
    ), home


@pytest.fixture(scope="module")
def root():
    driver_uids()
    path = Path(tempfile.mkdtemp(prefix="headrace-sandbox-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def cluster(root):
    c, home = sandbox_cluster(root, "home", driver_log_max_bytes=LOG_CAP, driver_log_backups=2)
    yield c
    c.stop()


def outbox(cluster) -> Path:
    """A directory the pipelines may write their findings into."""
    out = cluster.settings.home / "probe"
    out.mkdir(exist_ok=True)
    give_to_drivers(out, DEFAULT_NAME)
    return out


def submit(rest: Rest, tmp_path: Path, name: str, source: str, *args: str, **body) -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(source))
    body.setdefault("restartStrategy", {"type": "none"})
    return rest.run(rest.upload(path), parallelism=1, programArgsList=list(args), **body)


PROBE = """
    import json, os

    def attempt(path, write):
        try:
            if write:
                open(path, "ab").close()
                return "written"
            if os.path.isdir(path):
                os.listdir(path)
                return "listed"
            with open(path, "rb") as f:
                f.read(1)
            return "read"
        except OSError as exc:
            return type(exc).__name__

    def build(ctx):
        out, *paths = ctx.args
        seen = {"uid": os.getuid(), "env": dict(os.environ), "catalog_url": ctx.catalog_url,
                "redis_url": ctx.redis_url,
                "paths": {p: attempt(p.split(":", 1)[-1], p.startswith("w:")) for p in paths}}
        with open(out, "w") as f:
            json.dump(seen, f)
        return ctx.sinks.console(ctx.sources.datagen(total=1, streaming=False))
"""


def test_a_pipeline_reaches_none_of_the_services_secrets(cluster, rest, tmp_path):
    home = cluster.settings.home
    report = outbox(cluster) / "probe.json"
    secrets = [
        *sorted(str(p) for p in cluster.run_dir.glob("*.yaml")),
        str(home / "redis" / "credentials.json"),
        str(home / "secrets" / "cluster-secret"),
        str(home / "catalog.db"),
        f"w:{home / 'catalog.db'}",
        str(home),
        str(home / "artifacts"),
        str(cluster.run_dir),
        str(home / "work" / "taskmanagers" / "tm-1" / "logs"),
    ]
    job = submit(rest, tmp_path, "probe.py", PROBE, str(report), *secrets)
    assert rest.wait_state(job, DONE, timeout_s=240)["state"] == "FINISHED", rest.get(f"/jobs/{job}/exceptions")
    seen = json.loads(report.read_text())
    assert seen["uid"] in driver_uids()
    assert seen["paths"] == dict.fromkeys(secrets, "PermissionError"), seen["paths"]
    # No control catalog (its lineage's own pipelines database instead: a fresh job's lineage is
    # itself), and nothing of the TaskManager's environment beyond the allow-list.
    assert seen["catalog_url"] == f"sqlite:///{home / 'pipelines' / job / 'pipelines.db'}"
    assert rest.get(f"/jobs/{job}")["pipeline-database"] == str(home / "pipelines" / job / "pipelines.db")
    env = seen["env"]
    assert "HEADRACE_CONFIG" not in env
    assert [
        k
        for k in env
        if k.startswith("HEADRACE_") and k != driver_env.MARK and not k.startswith("HEADRACE_FORKSERVER_")
    ] == []
    credentials = json.loads((home / "redis" / "credentials.json").read_text())
    passwords = [v for v in credentials.values() if isinstance(v, str)] or list(credentials)
    leaked = [k for k, v in env.items() for pw in passwords if pw and pw in v]
    assert leaked == []
    assert "catalog.db" not in json.dumps(env)
    # The pipeline's Redis URL is its lineage's own ACL user's (shared/pipeline_redis.py), nothing more.
    assert seen["redis_url"].startswith("redis://pipeline.")


MEMORY_HOG = """
    import time

    def build(ctx):
        hold = []
        for _ in range(200):
            hold.append(b"\\x01" * (32 * 1024 * 1024))
            time.sleep(0.02)
        raise RuntimeError("allocated 6.4 GB and was never stopped")
"""


def test_a_build_past_its_memory_limit_fails_the_task_through_the_restart_strategy(cluster, rest, tmp_path):
    job = submit(
        rest,
        tmp_path,
        "memory_hog.py",
        MEMORY_HOG,
        config={"headrace.task.memory-limit": "1500m"},
        restartStrategy={"type": "fixed-delay", "attempts": 1, "delay": "100 ms"},
    )
    final = rest.wait_state(job, DONE, timeout_s=300)
    assert final["state"] == "FAILED"
    attempts = rest.attempts(job)
    assert [a["status"] for a in attempts] == ["FAILED", "FAILED"]
    for a in attempts:
        cause = a["failure-cause"]
        assert "the task's processes used" in cause and "above its limit of 1.5 GB (headrace.task.memory-limit" in cause
        assert re.search(r"used \d+\.\d GB \(PSS summed over \d+ processes\)", cause), cause
        assert "never stopped" not in cause
    history = rest.get(f"/jobs/{job}/exceptions")["exceptionHistory"]["entries"]
    assert [e["exceptionName"] for e in history] == ["MemoryLimitExceeded"] * 2
    assert rest.wait_free_slots(2, timeout_s=20) == 2


SHARING = """
    import mmap, os, time

    def build(ctx):
        out, = ctx.args
        # 256 MB filled in the driver, then five children that only read it: Spark's Python workers
        # forked from their daemon share pages the same way.
        size = 256 * 1024 * 1024
        shared = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        chunk = b"\\x01" * (1 << 20)
        for off in range(0, size, len(chunk)):
            shared[off:off + len(chunk)] = chunk
        r, w = os.pipe()
        for _ in range(5):
            if os.fork() == 0:
                sum(shared[off] for off in range(0, size, 4096))
                os.write(w, b"x")
                time.sleep(3600)
                os._exit(0)
        for _ in range(5):
            os.read(r, 1)
        with open(out, "w") as f:
            f.write(str(os.getpid()))
        return ctx.sinks.console(ctx.sources.datagen(rows_per_second=1))
"""
SHARING_LIMIT = 2500 * 1024**2


def session_rss(driver: int) -> int:
    """The plain RSS sum over the driver's session, what the watchdog used to compare."""
    sid, total = os.getsid(driver), 0
    for p in psutil.process_iter():
        try:
            if os.getsid(p.pid) == sid:
                total += p.memory_info().rss
        except (OSError, psutil.Error):
            pass
    return total


def scrape_task_memory(cluster, job: str) -> dict:
    """The job's task's headrace_task_memory_bytes (measure PSS) and _limit_bytes from its TaskManager."""
    url = json.loads((cluster.run_dir / "cluster.json").read_text())["metrics"]["taskmanager-1"]
    found = {}
    for family in text_string_to_metric_families(httpx.get(url, timeout=10).text):
        for s in family.samples:
            if s.labels.get("job") == job and s.name == "headrace_task_memory_bytes" and s.labels["measure"] == "PSS":
                found["used"] = s.value
            elif s.labels.get("job") == job and s.name == "headrace_task_memory_limit_bytes":
                found["limit"] = s.value
    return found


def test_pages_shared_between_a_drivers_processes_count_once_against_its_limit(cluster, rest, tmp_path):
    out = outbox(cluster) / "sharing.txt"
    job = submit(
        rest,
        tmp_path,
        "sharing.py",
        SHARING,
        str(out),
        config={"headrace.task.memory-limit": f"{SHARING_LIMIT // 1024**2}m"},
    )
    try:

        def readers_forked() -> bool:
            if out.exists() and out.read_text().strip():
                return True
            assert rest.job(job)["state"] not in DONE, rest.get(f"/jobs/{job}/exceptions")
            return False

        wait_for("the pipeline forking its readers", readers_forked, 240, poll_s=0.2)
        rest.wait_attempt_running(job, 0, timeout_s=120)
        # Issue 42's case: summed RSS above the limit, the memory the kernel charges well below it.
        assert session_rss(int(out.read_text())) > SHARING_LIMIT
        time.sleep(4)  # sixteen samples, two or three PSS readings, two heartbeats
        assert rest.job(job)["state"] == "RUNNING", rest.get(f"/jobs/{job}/exceptions")
        slots = rest.get("/taskmanagers/tm-1")["allocatedSlots"]
        memory = next(s["memory"] for s in slots if s["job_id"] == job)
        assert memory["measure"] == "PSS" and memory["limit"] == SHARING_LIMIT, memory
        assert 256 * 1024**2 < memory["used"] < SHARING_LIMIT, memory
        scraped = scrape_task_memory(cluster, job)
        assert scraped["limit"] == SHARING_LIMIT and 256 * 1024**2 < scraped["used"] < SHARING_LIMIT, scraped
    finally:
        if rest.job(job)["state"] not in DONE:
            rest.cancel(job)
            rest.wait_state(job, DONE, timeout_s=60)


FORKER = """
    import os, time

    def build(ctx):
        out, mode = ctx.args
        r, w = os.pipe()
        if os.fork() == 0:
            os.setsid()  # out of the driver's session
            if os.fork() == 0:  # and, once its parent exits, re-parented to init
                os.write(w, f"{os.getpid()}\\n".encode())
                time.sleep(3600)
            os._exit(0)
        os.close(w)
        sleeper = int(os.read(r, 64).split()[0])
        with open(out, "w") as f:
            f.write(f"{sleeper} {os.getpid()}")
        if mode == "fail":
            raise RuntimeError("failing with a sleeper started")
        return ctx.sinks.console(ctx.sources.datagen(rows_per_second=1))
"""


def forked(cluster, rest, tmp_path, mode: str) -> tuple[str, int, int]:
    out = outbox(cluster) / f"forker-{mode}.txt"
    job = submit(rest, tmp_path, f"forker_{mode}.py", FORKER, str(out), mode)

    def sleeper_started() -> bool:
        if out.exists() and out.read_text().strip():
            return True
        assert rest.job(job)["state"] not in DONE or mode == "fail", rest.get(f"/jobs/{job}/exceptions")
        return False

    wait_for("the pipeline starting its sleeper", sleeper_started, 240, poll_s=0.2)
    sleeper, driver = map(int, out.read_text().split())
    return job, sleeper, driver


def test_a_sleeper_that_left_the_drivers_session_ends_with_its_task(cluster, rest, tmp_path):
    job, sleeper, driver = forked(cluster, rest, tmp_path, "fail")
    assert rest.wait_state(job, DONE, timeout_s=120)["state"] == "FAILED"
    wait_gone("every process of the failed task to go", [sleeper, driver], timeout_s=20, poll_s=0.2)


def test_without_cgroups_the_tasks_processes_end_with_the_task_and_with_the_cluster(root, tmp_path):
    c, _ = sandbox_cluster(root, "no-cgroups", driver_cgroups=False)
    try:
        rest = Rest(c.dispatcher_url)
        job, sleeper, driver = forked(c, rest, tmp_path, "fail")
        assert rest.wait_state(job, DONE, timeout_s=120)["state"] == "FAILED"
        wait_gone(
            "the failed task's processes to go (found neither by session nor by ancestry: by its mark)",
            [sleeper, driver],
            timeout_s=20,
            poll_s=0.2,
        )
        job, sleeper, driver = forked(c, rest, tmp_path, "run")
        rest.wait_attempt_running(job, 0, timeout_s=120)
        assert os.getsid(sleeper) != os.getsid(driver), "the sleeper must have left the driver's session"
        tree = [driver, sleeper, *(p.pid for p in psutil.Process(driver).children(recursive=True))]
        assert any("java" in psutil.Process(p).name() for p in tree if alive(p)), "no JVM under the driver"
    finally:
        c.stop()
    wait_gone("no process of the running task to outlive the cluster", tree, timeout_s=10, poll_s=0.2)


LOUD = """
    import sys

    def build(ctx):
        block = ("x" * 1023 + "\\n") * 1024
        for _ in range(100):
            sys.stdout.write(block)
        print("headrace probe: printed 100 MB", flush=True)
        return ctx.sinks.console(ctx.sources.datagen(total=1, streaming=False))
"""


def test_a_pipeline_printing_100_mb_leaves_bounded_rotated_logs(cluster, rest, tmp_path):
    job = submit(rest, tmp_path, "loud.py", LOUD)
    assert rest.wait_state(job, DONE, timeout_s=240)["state"] == "FINISHED", rest.get(f"/jobs/{job}/exceptions")
    logs = cluster.settings.home / "work" / "taskmanagers" / "tm-1" / "logs"
    loud = next(p for p in logs.glob("driver-*.log") if b"printed 100 MB" in p.read_bytes()[-4096:])
    files = sorted(logs.glob(loud.name + "*"))
    assert [f.name for f in files] == [loud.name, f"{loud.name}.1", f"{loud.name}.2"]
    assert all(f.stat().st_size <= LOG_CAP for f in files), [(f.name, f.stat().st_size) for f in files]
    listed = {entry["name"] for entry in rest.get("/taskmanagers/tm-1/logs")["logs"]}
    assert {f.name for f in files} <= listed
