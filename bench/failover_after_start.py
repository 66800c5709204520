"""`python bench/failover.py --case just-started`: failover on a cluster that has just started
(issue 23). See bench/failover.py for what it measures; this module is its implementation.

Each run gets its own cluster, source redis-server, PostgreSQL catalog and sink database. The
cluster's TaskManagers get a private TMPDIR, so their warm-up tokens (a directory under it,
services/taskmanager/drivers/warm_pool.py) are not shared with other clusters that may run on the machine
meanwhile (test suites): the figures are this cluster's, though the CPU stays shared.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

import redis

from bench._procs import Procs
from bench.checkpoint_overhead import DEFAULT_PG, drop_pg, fresh_pg, machine
from services.cluster import readiness
from shared import streams
from shared.driver_contract import kill_session
from tests.clusters import Rest, start_cluster
from tests.e2e.counting import Producer, expected_totals, sql_totals
from tests.waiting import wait_for

ROOT = Path(__file__).resolve().parent.parent
KEYED_COUNTS = ROOT / "examples" / "keyed_counts.py"
TABLE = "failover_counts"
RESTART = {"type": "fixed-delay", "attempts": 100, "delay": "1 s"}  # the cluster default's delay
WARM_WAIT_S = 180.0
KILL_WAIT_S = 180.0


def drivers_of(taskmanager_pid: int) -> list[int]:
    """The driver processes (runner.py) a TaskManager started: each leads a session of its own."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            args = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"services.taskmanager.runtime.runner" in args and b"--parent-pid" in args:
            if args[args.index(b"--parent-pid") + 1] == str(taskmanager_pid).encode():
                found.append(int(proc.name))
    return found


def kill_taskmanager(cluster, taskmanager_id: str) -> None:
    """kill -9 of the TaskManager's process group and of every driver it runs, as a machine's
    loss of it would (its drivers would otherwise notice their parent gone within a second)."""
    child = cluster.child(f"taskmanager-{taskmanager_id.split('-')[1]}")
    drivers = drivers_of(child.proc.pid)
    os.killpg(child.proc.pid, signal.SIGKILL)
    for pid in drivers:
        kill_session(pid)


def warm_status(client: redis.Redis, taskmanager_id: str) -> str:
    raw = client.get(streams.tm_warm_key(taskmanager_id))
    if not raw:
        return "none published"
    s = json.loads(raw)
    return f"{s['ready']} ready, {s['starting']} starting, {s['waiting']} waiting"


def kill_and_time(cluster, rest: Rest, client: redis.Redis, job: str) -> dict:
    attempts = rest.attempts(job)
    victim = attempts[-1]["taskmanager-id"]
    survivor = "tm-2" if victim == "tm-1" else "tm-1"
    survivor_warm = warm_status(client, survivor)
    t0 = time.monotonic()
    kill_taskmanager(cluster, victim)
    try:
        attempts = rest.wait_attempt_running(job, attempts[-1]["attempt"] + 1, timeout_s=KILL_WAIT_S)
    except AssertionError:
        return {
            "seconds": None,
            "from": victim,
            "to": f"nothing RUNNING within {KILL_WAIT_S:.0f} s",
            "survivor_warm": survivor_warm,
        }
    took = time.monotonic() - t0
    return {
        "seconds": round(took, 2),
        "from": victim,
        "to": attempts[-1]["taskmanager-id"],
        "survivor_warm": survivor_warm,
    }


def shown(kill: dict) -> str:
    took = "-" if kill["seconds"] is None else f"{kill['seconds']:.2f} s"
    return f"{took} ({kill['from']} -> {kill['to']}; survivor's pool: {kill['survivor_warm']})"


def one_run(ready: str, second_kill_after_s: float) -> dict:
    home = Path(tempfile.mkdtemp(prefix="hr-failover-start-"))
    private_tmp = home / "tmp"
    private_tmp.mkdir()
    procs = Procs(home, {})
    sink, catalog = fresh_pg(DEFAULT_PG), fresh_pg(DEFAULT_PG)
    cluster = producer = None
    saved_tmp = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = str(private_tmp)  # the cluster's children inherit it (see the docstring)
    try:
        source = procs.redis()
        t_start = time.monotonic()
        cluster = start_cluster(
            home / "cluster", catalog_url=catalog, taskmanagers=2, slots=2, warm_drivers=1, restart_strategy=RESTART
        )
        cluster.supervise()  # as `headrace up` does
        up_s = time.monotonic() - t_start
        client = redis.Redis.from_url(cluster.redis_url)
        if ready == "warm":
            left = readiness.wait_for_warm_drivers(cluster.redis_url, ["tm-1", "tm-2"], WARM_WAIT_S)
            if left:
                raise SystemExit(f"no warm driver on {left} after {WARM_WAIT_S:.0f} s")
        ready_s = time.monotonic() - t_start
        load = round(os.getloadavg()[0], 2)
        rest = Rest(cluster.dispatcher_url)
        jar = rest.upload(KEYED_COUNTS)
        producer = Producer(source, "events", rate=100.0).start()
        args = [
            "--stream",
            "events",
            "--source-url",
            source,
            "--sink",
            "sql",
            "--table",
            TABLE,
            "--sink-url",
            sink,
            "--trigger",
            "500 milliseconds",
        ]
        t_submit = time.monotonic()
        job = rest.run(
            jar,
            parallelism=1,
            jobName=TABLE,
            programArgsList=args,
            restartStrategy=RESTART,
            flinkConfiguration={"execution.checkpointing.interval": "1 s"},
        )
        wait_for("the job's first committed output", lambda: sql_totals(sink, TABLE), 300)
        output_s = time.monotonic() - t_submit
        first = kill_and_time(cluster, rest, client, job)
        print(f"  kill 1: {first}", file=sys.stderr, flush=True)
        time.sleep(max(0.0, second_kill_after_s - (first["seconds"] or KILL_WAIT_S)))
        second = kill_and_time(cluster, rest, client, job)
        print(f"  kill 2: {second}", file=sys.stderr, flush=True)
        produced = producer.stop()
        producer = None
        expected = expected_totals(produced)
        try:
            wait_for(f"the sink to hold exactly {produced} events", lambda: sql_totals(sink, TABLE) == expected, 180)
            exact = True
        except AssertionError:
            exact = False
        rest.cancel(job)
        client.close()
        return {
            "up_s": round(up_s, 2),
            "ready_s": round(ready_s, 2),
            "output_s": round(output_s, 2),
            "first": first,
            "second": second,
            "events": produced,
            "exact": exact,
            "load": load,
        }
    finally:
        if saved_tmp is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = saved_tmp
        if producer is not None:
            producer.stop()
        if cluster is not None:
            cluster.stop()
        procs.stop()
        for url in (sink, catalog):
            drop_pg(DEFAULT_PG, url)


def run_series(*, runs: int, ready: str, second_kill_after_s: float) -> None:
    print(
        f"machine: {machine()}; submitted when {'up' if ready == 'up' else 'the warm drivers are ready'}; "
        f"second kill {second_kill_after_s:.0f} s after the first",
        flush=True,
    )
    rows = []
    for _ in range(runs):
        r = one_run(ready, second_kill_after_s)
        rows.append(r)
        print(json.dumps(r), file=sys.stderr, flush=True)
    print("| run | up | submitted at | first output after | kill 1 -> RUNNING | kill 2 -> RUNNING | exact | load |")
    print("|---|---|---|---|---|---|---|---|")
    for i, r in enumerate(rows, 1):
        print(
            f"| {i} | {r['up_s']:.1f} s | {r['ready_s']:.1f} s | {r['output_s']:.1f} s "
            f"| {shown(r['first'])} | {shown(r['second'])} "
            f"| {'yes' if r['exact'] else 'NO'} ({r['events']} events) | {r['load']} |"
        )
    for which in ("first", "second"):
        times = [r[which]["seconds"] for r in rows if r[which]["seconds"] is not None]
        failed = sum(1 for r in rows if r[which]["seconds"] is None)
        if times:
            print(
                f"kill {1 if which == 'first' else 2}: median {statistics.median(times):.2f} s, "
                f"max {max(times):.2f} s" + (f"; {failed} without a RUNNING attempt" if failed else "")
            )
