"""A TaskManager process's own cost of taking N deploy commands, alone: no JobManager.

A ResourceManager and K simulated TaskManagers (one process, bench/simulated_taskmanagers.py,
heartbeating at 1 Hz) run as services; this script publishes a leader epoch, pushes N no-op
DeployTask commands onto the fleet's Celery queue exactly as the JobManager's gateway sends them,
and reads the JobManager stream until every task has reported RUNNING. It times that (wall) and
the TaskManager process's CPU over it. In control_plane_scale.py this queue was what the last
thousand tasks waited on; here it can be compared side by side (two checkouts, alternating).

usage: python bench/taskmanager_intake.py [--tasks 2000] [--taskmanagers 2000] [--runs 3] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psutil
import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._procs import Procs, stop_group
from bench.control_plane_scale import drop_pg, fresh_pg, scale_env, wait_registered
from shared import leader_epoch, streams
from shared.catalog import Catalog
from shared.commands import CommandGateway, make_celery
from shared.ids import new_allocation_id, new_execution_id, new_job_id, new_vertex_id
from shared.message_auth import control_plane_auth
from shared.messages import DeployTask, TaskStateChanged, UndecodableMessage, decode
from shared.settings import Settings
from shared.states import ExecutionState as ES
from shared.task_protocol import TaskSpec
from shared.transport.redis_streams import FIELD

IDLE_WINDOW_S = 2.0
FLEET = "sim"  # the simulated TaskManagers are sim-sim00000, sim-sim00001, ... on queue tm.sim
# Where the simulating process reports (a checkout before per-TaskManager streams: the JobManager's).
REPORTS = streams.tm_jm_stream(FLEET) if hasattr(streams, "tm_jm_stream") else streams.JM_STREAM


def deploys(n: int, taskmanagers: int, redis_url: str, catalog_url: str) -> list[DeployTask]:
    out = []
    for i in range(n):
        spec = TaskSpec(
            job_id=new_job_id(),
            job_name=f"noop-{i}",
            vertex_id=new_vertex_id(),
            execution_id=new_execution_id(),
            attempt=0,
            parallelism=1,
            kind="noop",
            checkpoint_dir=f"/tmp/headrace-bench-unused/{i}",
            fence_token=i + 1,
            catalog_url=catalog_url,
            redis_url=redis_url,
            config={"noop.duration": -1},
        )
        out.append(
            DeployTask(
                taskmanager_id=f"{FLEET}-sim{i % taskmanagers:05d}",
                allocation_id=new_allocation_id(),
                slot_indices=(i // taskmanagers,),
                spec=spec,
            )
        )
    return out


def one_run(
    client: redis.Redis, gateway: CommandGateway, cmds: list[DeployTask], tm: psutil.Process, timeout_s: float
) -> dict:
    wanted = {c.spec.execution_id for c in cmds}
    last_id = client.xinfo_stream(REPORTS)["last-generated-id"] if client.exists(REPORTS) else "0"
    cpu0 = sum(tm.cpu_times()[:2])
    t0 = time.perf_counter()
    with gateway.batch():
        for c in cmds:
            gateway.deploy(streams.tm_queue(FLEET), c)
    sent_s = time.perf_counter() - t0
    running: set[str] = set()
    while running != wanted:
        if time.perf_counter() - t0 > timeout_s:
            raise SystemExit(f"only {len(running)} of {len(wanted)} tasks RUNNING after {timeout_s:.0f} s")
        for _stream, entries in client.xread({REPORTS: last_id}, count=1000, block=500) or ():
            for entry_id, fields in entries:
                last_id = entry_id
                try:
                    body = decode(fields[FIELD]).body
                except (UndecodableMessage, KeyError):
                    continue
                if isinstance(body, TaskStateChanged) and body.state == ES.RUNNING and body.execution_id in wanted:
                    running.add(body.execution_id)
    wall = time.perf_counter() - t0
    return {
        "sent_s": round(sent_s, 3),
        "all_running_s": round(wall, 3),
        "taskmanager_cpu_s": round(sum(tm.cpu_times()[:2]) - cpu0, 3),
    }


def main() -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the `finally`: no orphaned services
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", type=int, default=2000)
    ap.add_argument("--taskmanagers", type=int, default=2000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--catalog", default="postgresql://postgres@127.0.0.1:5432/postgres")
    ap.add_argument("--smoke", action="store_true", help="20 tasks on 20 TaskManagers, one run")
    a = ap.parse_args()
    if a.smoke:
        a.tasks, a.taskmanagers, a.runs = 20, 20, 1
    slots = -(-a.tasks // a.taskmanagers)
    work = Path(tempfile.mkdtemp(prefix="headrace-bench-"))
    catalog_url = fresh_pg(a.catalog) if a.catalog.startswith("postgres") else a.catalog
    procs = Procs(work, scale_env(work, catalog_url))
    result: dict = {"tasks": a.tasks, "taskmanagers": a.taskmanagers}
    runs = []
    try:
        url = procs.redis()
        Catalog(catalog_url).migrate()
        client = redis.Redis.from_url(url)
        leader_epoch.publish(client, 1)
        # Commands signed with the fleet's keys: the simulated TaskManagers derive theirs from the
        # secret the services keep in `work`.
        gateway = CommandGateway(
            make_celery(url, "headrace-jobmanager"),
            sender="jobmanager",
            epoch=1,
            auth=control_plane_auth(Settings(home=work)),
        )
        for i in range(a.runs):
            # A fresh ResourceManager and fleet per run: free slots, an empty queue, fresh counts.
            client.delete(streams.RM_STATS_KEY)
            procs.service(f"resourcemanager{i}", "resourcemanager")
            fleet = procs.simulated_fleet(f"taskmanagers{i}", a.taskmanagers, slots=slots, fleet_id=FLEET)
            wait_registered(client, a.taskmanagers)
            time.sleep(2)  # registration bursts settle; then only heartbeats run
            tm = psutil.Process(fleet.pid)
            idle0 = sum(tm.cpu_times()[:2])
            time.sleep(IDLE_WINDOW_S)
            idle = (sum(tm.cpu_times()[:2]) - idle0) / IDLE_WINDOW_S
            run = one_run(client, gateway, deploys(a.tasks, a.taskmanagers, url, catalog_url), tm, timeout_s=120)
            # What the heartbeats alone would have cost over the same time, for comparison.
            run["heartbeats_only_cpu_s"] = round(idle * run["all_running_s"], 3)
            runs.append(run)
            for name in (f"taskmanagers{i}", f"resourcemanager{i}"):
                stop_group(procs.procs.pop(name))
    finally:
        procs.stop()
        if catalog_url != a.catalog:
            drop_pg(a.catalog, catalog_url)
    result["runs"] = runs
    result["all_running_s_median"] = statistics.median(r["all_running_s"] for r in runs)
    result["taskmanager_cpu_ms_per_task_median"] = round(
        statistics.median(r["taskmanager_cpu_s"] for r in runs) * 1000 / a.tasks, 3
    )
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
