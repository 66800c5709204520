"""Helpers for tests that start a multi-process local cluster and drive it over REST."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
from kazoo.client import KazooClient

from services.cluster.local_cluster import LocalCluster, free_port
from shared.settings import Settings

TERMINAL = ("FINISHED", "FAILED", "CANCELED")
# The JVM options of every JVM the suite starts (tests/conftest.py sets JDK_JAVA_OPTIONS to them):
# code that runs for seconds on 2 shared cores. C1 only: C2 compiling took a third of a core per
# running job. The serial collector: no concurrent GC threads beside the work, 0.07-0.1 cores less
# per running job (bench/job_cpu.py; docs/benchmarks.md, "The drills' trigger and the suite's JVMs").
SUITE_JIT_AND_GC_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
# No bytecode verification of classes outside the class archive (Spark's classes it lacks, the code
# Spark generates per query, lambda forms): 11 % less CPU for two drill modules side by side
# (docs/benchmarks.md, "The suite's JVMs without bytecode verification"). Not semantics-free: Flink
# 2.3's CLI loses `savepoint -d`'s path without it, so the Flink CLI's JVMs keep verifying, and so
# do the demo's (tests/e2e/test_demo_e2e.py runs the README's command with the JVMs' defaults).
SUITE_JVM_OPTIONS = f"{SUITE_JIT_AND_GC_OPTIONS} -XX:+UnlockDiagnosticVMOptions -XX:-BytecodeVerificationRemote"
# The artifact no-op jobs are submitted with: their tasks never import it.
NOOP_PIPELINE = "def build(ctx):\n    raise RuntimeError('no-op jobs never call build')\n"


def start_cluster(
    home: Path,
    *,
    catalog_url: str | None,
    redis_url: str | None = None,
    taskmanagers: int = 2,
    slots: int = 4,
    warm_drivers: int = 0,
    jobmanagers: int = 1,
    ha: bool = False,
    spark_workers: int = 0,
    redis_bind: tuple[str, ...] = ("127.0.0.1",),
    zookeeper_bind: str = "127.0.0.1",
    kafka: bool = False,
    **settings,
) -> LocalCluster:
    """`catalog_url` None: none configured, as a user's `headrace up` (SQLite in `home`; with `ha`, a
    PostgreSQL server of the cluster's own)."""
    kwargs = dict(
        home=home, dispatcher_port=free_port(), warm_drivers=warm_drivers, taskmanager_slots=slots, **settings
    )
    if catalog_url is not None:
        kwargs["catalog_url"] = catalog_url
    if redis_url:
        kwargs["redis_url"] = redis_url
    cluster = LocalCluster(
        Settings(**kwargs),
        taskmanagers=taskmanagers,
        slots=slots,
        jobmanagers=jobmanagers,
        ha=ha,
        spark_workers=spark_workers,
        redis_bind=redis_bind,
        zookeeper_bind=zookeeper_bind,
        kafka=kafka,
    )
    try:
        cluster.start(wait_s=90)
    except Exception:
        cluster.stop()
        raise
    return cluster


class Rest:
    def __init__(self, url: str):
        self.http = httpx.Client(base_url=url, timeout=30)

    def upload(self, path: Path) -> str:
        with open(path, "rb") as f:
            r = self.http.post("/jars/upload", files={"jarfile": (path.name, f)})
        r.raise_for_status()
        body = r.json()
        return body.get("id") or Path(body["filename"]).name

    def upload_noop_pipeline(self, directory: Path) -> str:
        path = directory / "noop_pipeline.py"
        path.write_text(NOOP_PIPELINE)
        return self.upload(path)

    def run(self, jar_id: str, **body) -> str:
        r = self.http.post(f"/jars/{jar_id}/run", json=body)
        assert r.status_code == 200, r.text
        return r.json()["jobid"]

    def job(self, job_id: str) -> dict:
        r = self.http.get(f"/jobs/{job_id}")
        r.raise_for_status()
        return r.json()

    def get(self, path: str) -> dict:
        r = self.http.get(path)
        r.raise_for_status()
        return r.json()

    def cancel(self, job_id: str) -> None:
        r = self.http.patch(f"/jobs/{job_id}", params={"mode": "cancel"})
        assert r.status_code == 202, r.text

    def wait_state(self, job_id: str, states, timeout_s: float = 60) -> dict:
        states = (states,) if isinstance(states, str) else tuple(states)
        deadline = time.monotonic() + timeout_s
        job = {}
        while time.monotonic() < deadline:
            job = self.job(job_id)
            if job["state"] in states:
                return job
            time.sleep(0.2)
        raise AssertionError(f"job {job_id} is {job.get('state')}, expected {states} within {timeout_s} s")

    def wait_running_task(self, job_id: str, timeout_s: float = 60) -> dict:
        """The job's current attempt is RUNNING (not merely the job)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            job = self.job(job_id)
            if job["vertices"] and all(v["status"] == "RUNNING" for v in job["vertices"]):
                return job
            time.sleep(0.1)
        raise AssertionError(f"job {job_id} has no RUNNING task after {timeout_s} s: {self.job(job_id)}")

    def wait_attempt_running(self, job_id: str, attempt: int, timeout_s: float = 60) -> list[dict]:
        """Attempt number `attempt` (or a later one) of the job's task is RUNNING."""
        deadline = time.monotonic() + timeout_s
        attempts: list[dict] = []
        while time.monotonic() < deadline:
            attempts = self.attempts(job_id)
            if attempts and attempts[-1]["attempt"] >= attempt and attempts[-1]["status"] == "RUNNING":
                return attempts
            time.sleep(0.05)
        raise AssertionError(f"attempt {attempt} of job {job_id} not RUNNING after {timeout_s} s: {attempts}")

    def attempts(self, job_id: str) -> list[dict]:
        job = self.job(job_id)
        if not job["vertices"]:
            return []  # the JobManager has not built the plan yet
        vid = job["vertices"][0]["id"]
        return self.get(f"/jobs/{job_id}/vertices/{vid}")["attempts"]

    def free_slots(self) -> int:
        return self.get("/overview")["slots-available"]

    def wait_free_slots(self, expected: int, timeout_s: float = 5) -> int:
        """The ResourceManager writes slot views to the catalog every 0.5 s: poll, then judge."""
        deadline = time.monotonic() + timeout_s
        free = self.free_slots()
        while free != expected and time.monotonic() < deadline:
            time.sleep(0.1)
            free = self.free_slots()
        return free


class ServedApp:
    """An ASGI app (a dispatcher built in the test) served by uvicorn on a free port in a thread,
    for clients that need real HTTP (the CLI, streamed uploads)."""

    def __init__(self, app, *, start_timeout_s: float = 30):
        import threading

        import uvicorn

        from shared.ports import free_port

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + start_timeout_s
        while not self.server.started:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the app did not start serving on {self.url} within {start_timeout_s:.0f} s")
            time.sleep(0.05)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


def leader(cluster) -> dict:
    zk = KazooClient(hosts=cluster.zookeeper_quorum)
    zk.start(timeout=10)
    try:
        data, _ = zk.get("/headrace/jobmanager/leader")
        return json.loads(data)
    finally:
        zk.stop()
        zk.close()


def leader_child(cluster) -> str:
    pid = int(leader(cluster)["id"].rsplit(":", 1)[1])
    return next(c.name for c in cluster.children if c.name.startswith("jobmanager") and c.proc.pid == pid)
