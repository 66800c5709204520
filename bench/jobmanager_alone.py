"""The JobManager's own cost of starting N no-op tasks, alone: no ResourceManager process, no
TaskManagers, no other process on the cores. A real JobMaster (PostgreSQL catalog, real
CommandGateway sending Celery messages to a throwaway redis-server) is fed, in stream batches of
500 as the service polls them:
  submit   N SubmitJob                           -> N RequestSlots
  deploy   N SlotsAllocated (answered as the RM would) -> N DeployTask commands
  running  N TaskStateChanged INITIALIZING, then N RUNNING
and each phase is timed (wall and this process's CPU). What control_plane_scale.py measures
end to end is this plus the hops between processes; this isolates the JobManager's share so
its changes can be compared side by side (two checkouts, alternating).

usage: python bench/jobmanager_alone.py [--tasks 2000] [--runs 3] [--smoke]
       [--catalog postgresql://postgres@127.0.0.1:5432/postgres]
"""

from __future__ import annotations

import argparse
import inspect
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._procs import Procs
from bench.control_plane_scale import drop_pg, fresh_pg

# Older checkouts, compared side by side, have no collector settings (and an editable install
# would find this checkout's module instead: only the one beside this script counts).
if (Path(__file__).resolve().parent.parent / "shared" / "gc_tuning.py").exists():
    from shared import gc_tuning
else:
    gc_tuning = None
from services.jobmanager.job_master import JobMaster
from shared import streams
from shared.catalog import Catalog
from shared.catalog import repository as repo
from shared.clock import SystemClock
from shared.commands import CommandGateway, make_celery
from shared.ids import new_allocation_id, new_job_id
from shared.messages import RequestSlots, SlotsAllocated, SubmitJob, TaskStateChanged
from shared.settings import Settings
from shared.states import ExecutionState as ES
from shared.transport import InMemoryTransport

BATCH = 500  # what the service asks its stream for per poll


def one_run(catalog_url: str, redis_url: str, tasks: int, home: Path) -> dict:
    settings = Settings(home=home, catalog=catalog_url, redis_url=redis_url)
    catalog = Catalog(catalog_url)
    catalog.migrate()
    t = InMemoryTransport(sender="bench", epoch=1)
    gateway = CommandGateway(make_celery(redis_url, "headrace-jobmanager"), sender="jobmanager", epoch=1, auth=t.auth)
    jm = JobMaster(settings, catalog, t, gateway, SystemClock(), epoch=1)
    if gc_tuning is not None:
        gc_tuning.tune()  # as the service does once it has started
    with jm.unit_of_work():
        jm.recover()
    ids = [new_job_id() for _ in range(tasks)]
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

    # Task reports go out signed as the TaskManager they name (checkouts before signed messages
    # take no sender).
    as_taskmanager = "sender" in inspect.signature(t.publish).parameters

    def feed(bodies) -> dict:
        for b in bodies:
            tm = getattr(b, "taskmanager_id", None) if isinstance(b, TaskStateChanged) else None
            t.publish(streams.JM_STREAM, b, **({"sender": f"taskmanager:{tm}"} if tm and as_taskmanager else {}))
        w0, c0 = time.perf_counter(), time.process_time()
        while t.poll(
            streams.JM_STREAM, streams.JM_GROUP, "jobmanager", jm.handle, count=BATCH, around_batch=jm.unit_of_work
        ):
            pass
        return {"wall_s": round(time.perf_counter() - w0, 3), "cpu_s": round(time.process_time() - c0, 3)}

    out = {"submit": feed(SubmitJob(job_id=j) for j in ids)}
    # Read as the ResourceManager would: its consumer group on its stream.
    requests: list[RequestSlots] = []
    t.drain(
        streams.RM_STREAM,
        streams.RM_GROUP,
        lambda env: requests.append(env.body) if isinstance(env.body, RequestSlots) else None,
    )
    assert len(requests) == tasks, f"{len(requests)} slot requests for {tasks} jobs"
    queue = streams.tm_queue("bench-sim")
    out["deploy"] = feed(
        SlotsAllocated(
            request_id=r.request_id,
            execution_id=r.execution_id,
            job_id=r.job_id,
            allocation_id=new_allocation_id(),
            taskmanager_id=f"bench-sim{i:05d}",
            queue=queue,
            slot_indices=(0,),
        )
        for i, r in enumerate(requests)
    )
    placed = {r.execution_id: (r.job_id, f"bench-sim{i:05d}") for i, r in enumerate(requests)}
    out["running"] = feed(
        TaskStateChanged(execution_id=e, job_id=j, taskmanager_id=tm, state=st)
        for st in (ES.INITIALIZING, ES.RUNNING)
        for e, (j, tm) in placed.items()
    )
    with catalog.session() as s:
        running = repo.execution_states(s, list(placed)).values()
    assert sum(1 for st in running if st == ES.RUNNING.value) == tasks, "not every execution is RUNNING"
    catalog.engine.dispose()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", type=int, default=2000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--catalog", default="postgresql://postgres@127.0.0.1:5432/postgres")
    ap.add_argument("--smoke", action="store_true", help="20 tasks, one run: checks the benchmark still works")
    a = ap.parse_args()
    if a.smoke:
        a.tasks, a.runs = 20, 1
    work = Path(tempfile.mkdtemp(prefix="headrace-bench-"))
    procs = Procs(work, {})
    runs = []
    try:
        redis_url = procs.redis()
        for i in range(a.runs):
            url = fresh_pg(a.catalog)
            try:
                runs.append(one_run(url, redis_url, a.tasks, work / f"run{i}"))
            finally:
                drop_pg(a.catalog, url)
    finally:
        procs.stop()
    result = {"tasks": a.tasks, "runs": runs}
    for phase in ("submit", "deploy", "running"):
        result[f"{phase}_cpu_ms_per_task_median"] = round(
            statistics.median(r[phase]["cpu_s"] for r in runs) * 1000 / a.tasks, 3
        )
    result["total_wall_s_median"] = round(statistics.median(sum(r[p]["wall_s"] for p in r) for r in runs), 2)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
