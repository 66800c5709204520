"""Control-plane scale without Spark.

1. K simulated TaskManagers (one process, bench/simulated_taskmanagers.py) heartbeat at
   1 Hz: ResourceManager CPU (share of one core), heartbeat lag (send -> handled, from the
   ResourceManager's own stats) and false "lost" verdicts over a measuring window.
2. N no-op tasks submitted at once (written to the catalog and announced on the JobManager
   stream exactly as the dispatcher does): time until every execution is RUNNING.

usage: python bench/control_plane_scale.py [--taskmanagers 2000] [--tasks 2000] [--window 30]
       [--catalog postgresql://postgres@127.0.0.1:5432/postgres]
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psutil
import redis
from sqlalchemy import func, select

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._procs import Procs
from shared import streams
from shared.catalog import Catalog
from shared.catalog import repository as repo
from shared.catalog.models import Execution
from shared.ids import new_job_id
from shared.message_auth import control_plane_auth
from shared.messages import SubmitJob
from shared.settings import Settings
from shared.transport.redis_streams import RedisStreamsTransport


def fresh_pg(admin_url: str) -> str:
    import psycopg

    name = f"headrace_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin_url, autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{name}"')
    return admin_url.rsplit("/", 1)[0] + "/" + name


def drop_pg(admin_url: str, catalog_url: str) -> None:
    """The throwaway catalog goes when the run ends: repeated runs must not pile up databases."""
    import psycopg

    name = catalog_url.rsplit("/", 1)[1]
    with psycopg.connect(admin_url, autocommit=True) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def scale_env(work: Path, catalog_url: str) -> dict[str, str]:
    """The services' settings for a simulated fleet: 1 s heartbeats, 10 s timeout, quiet logs."""
    return {
        "HEADRACE_HOME": str(work),
        "HEADRACE_CATALOG_URL": catalog_url,
        "HEADRACE_HEARTBEAT_INTERVAL_S": "1",
        "HEADRACE_HEARTBEAT_TIMEOUT_S": "10",
        "HEADRACE_LOG_LEVEL": "WARNING",
    }


def wait_registered(client: redis.Redis, n: int, timeout_s: float = 120) -> float:
    """Seconds until the ResourceManager's stats count `n` TaskManagers; SystemExit after
    `timeout_s`."""
    t0 = time.monotonic()
    while True:
        raw = client.get(streams.RM_STATS_KEY)
        seen = json.loads(raw).get("taskmanagers", 0) if raw else 0
        if seen >= n:
            return time.monotonic() - t0
        if time.monotonic() - t0 > timeout_s:
            raise SystemExit(f"only {seen} of {n} TaskManagers registered after {timeout_s:.0f} s")
        time.sleep(0.2)


def stream_lag(client: redis.Redis, stream: str, group: str) -> int | None:
    """Entries of `stream` the consumer group has not read yet."""
    for g in client.xinfo_groups(stream):
        if g["name"].decode() == group:
            return g.get("lag")
    return None


def process_cpu(procs: Procs) -> dict[str, float]:
    """User + system CPU seconds of each benchmark process (with its children), and of the
    PostgreSQL server's processes together."""
    out = {}
    for name, p in procs.procs.items():
        try:
            ps = psutil.Process(p.pid)
            out[name] = sum(sum(x.cpu_times()[:2]) for x in [ps] + ps.children(recursive=True))
        except psutil.Error:
            pass
    pg = 0.0
    for ps in psutil.process_iter(["name"]):
        if (ps.info["name"] or "").startswith("postgres"):
            try:
                pg += sum(ps.cpu_times()[:2])
            except psutil.Error:
                pass
    out["postgresql"] = pg
    return out


def main() -> None:
    # SIGTERM must run the `finally` below, or the benchmark's services outlive it.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    ap = argparse.ArgumentParser()
    ap.add_argument("--taskmanagers", type=int, default=2000)
    ap.add_argument("--tasks", type=int, default=2000)
    ap.add_argument("--window", type=float, default=30.0)
    ap.add_argument("--catalog", default="postgresql://postgres@127.0.0.1:5432/postgres")
    ap.add_argument("--verbose", action="store_true", help="print execution states while waiting")
    a = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="headrace-bench-"))
    catalog_url = fresh_pg(a.catalog) if a.catalog.startswith("postgres") else a.catalog
    procs = Procs(work, scale_env(work, catalog_url))
    # The cluster secret exists before any service starts: the simulated fleet derives its keys
    # from it and would exit without them (a ResourceManager creates it too, but maybe later).
    auth = control_plane_auth(Settings(home=work))
    result: dict = {"taskmanagers": a.taskmanagers, "tasks": a.tasks, "catalog": catalog_url.split("://")[0]}
    try:
        url = procs.redis()
        catalog = Catalog(catalog_url)
        catalog.migrate()
        rm = procs.service("resourcemanager", "resourcemanager")
        procs.service("jobmanager", "jobmanager")
        procs.simulated_fleet("taskmanagers", a.taskmanagers, slots=1, fleet_id="sim")
        client = redis.Redis.from_url(url)

        def stats() -> dict:
            raw = client.get(streams.RM_STATS_KEY)
            return json.loads(raw) if raw else {}

        result["registration_s"] = round(wait_registered(client, a.taskmanagers), 2)
        time.sleep(3)  # let registration bursts settle

        rm_ps = psutil.Process(rm.pid)
        children = [rm_ps] + rm_ps.children(recursive=True)
        cpu0 = sum(p.cpu_times().user + p.cpu_times().system for p in children)
        w0 = time.monotonic()
        lags, rates = [], []
        lost0 = stats().get("taskmanagers_lost_total", 0)
        while time.monotonic() - w0 < a.window:
            time.sleep(1)
            s = stats()
            lags.append(s.get("heartbeat_lag_max_ms", 0))
            rates.append(s.get("heartbeats_per_s", 0))
        cpu1 = sum(p.cpu_times().user + p.cpu_times().system for p in children)
        result["rm_cpu_share_of_one_core"] = round((cpu1 - cpu0) / (time.monotonic() - w0), 3)
        result["heartbeats_per_s_median"] = sorted(rates)[len(rates) // 2]
        result["heartbeat_lag_max_ms"] = max(lags)
        result["heartbeat_lag_median_of_max_ms"] = sorted(lags)[len(lags) // 2]
        result["false_lost_verdicts"] = stats().get("taskmanagers_lost_total", 0) - lost0

        transport = RedisStreamsTransport.from_url(url, sender="bench", auth=auth)  # signed as the control plane
        ids = [new_job_id() for _ in range(a.tasks)]
        with catalog.session() as s:
            for i, jid in enumerate(ids):
                repo.create_job(
                    s,
                    id=jid,
                    name=f"noop-{i}",
                    artifact_id=None,
                    entry="build",
                    parallelism=1,
                    program_args=[],
                    config={"noop.duration": -1},
                    restart_strategy={"type": "none"},
                    kind="noop",
                )
        cpu_before = process_cpu(procs)
        t_submit = time.monotonic()
        transport.publish_many([(streams.JM_STREAM, SubmitJob(job_id=j)) for j in ids])
        running = 0
        while running < a.tasks and time.monotonic() - t_submit < 300:
            time.sleep(0.25)
            with catalog.session() as s:
                hist = dict(s.execute(select(Execution.state, func.count()).group_by(Execution.state)).all())
                running = hist.get("RUNNING", 0)
            if a.verbose:
                # Where the work waits: messages not yet read by the JobManager and the
                # ResourceManager, commands not yet taken by the simulated TaskManagers.
                backlog = {
                    g: stream_lag(client, st, g)
                    for st, g in ((streams.JM_STREAM, streams.JM_GROUP), (streams.RM_STREAM, streams.RM_GROUP))
                }
                backlog["tm_queue"] = client.llen(streams.tm_queue("sim"))
                print(f"{time.monotonic() - t_submit:6.2f}s {hist} waiting {backlog}", file=sys.stderr)
        result["all_tasks_running_s"] = round(time.monotonic() - t_submit, 2) if running >= a.tasks else None
        result["tasks_running"] = running
        # Where the task phase's CPU went (seconds of CPU, from submission to the last RUNNING):
        # the machine's two cores are shared by all of these, simulated fleet included.
        cpu_after = process_cpu(procs)
        result["task_phase_cpu_s"] = {k: round(cpu_after[k] - cpu_before.get(k, 0.0), 2) for k in cpu_after}
    finally:
        procs.stop()
        if catalog_url != a.catalog:
            drop_pg(a.catalog, catalog_url)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
