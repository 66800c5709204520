"""TaskManager failover: kill -9 (or SIGSTOP) the TaskManager running a job and time until the
job's next attempt is RUNNING on the other TaskManager.

--case warm (the default): a streaming job on a warm cluster (default heartbeats, 2 s / 10 s);
    before each kill the survivor has a ready warm driver. Median of N runs.
--case just-started (issue 23): per run a fresh cluster, supervised as `headrace up` runs it (a
    killed TaskManager is started again). Right after it is up (--ready up: the moment `headrace
    up` prints "Headrace is up"; --ready warm: once it prints that the warm drivers are ready) a
    stateful counting job (examples/keyed_counts.py, fed by an outside producer at 100 events/s,
    checkpoints every second) is submitted; as soon as its first output is committed the
    TaskManager running it is killed (kill -9 of its process group and of its drivers' sessions),
    and 30 s after that kill the one running it then. Each kill is timed to the next attempt
    RUNNING; at the end the sink must hold exactly the count and sum of every key produced.

--kind kafka: the warm case with a Kafka -> Kafka exactly-once job (bench/pipelines/kafka_copy.py)
    on a broker of its own, fed at 50 records/s throughout.

usage: python bench/failover.py [--kind pyspark|kafka|noop] [--signal KILL|STOP] [--runs 5]
       python bench/failover.py --case just-started [--ready up|warm] [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.sink_db import sink_db_url
from bench.submit_latency import wait_warm
from tests.clusters import Rest, start_cluster

STREAM = Path(__file__).resolve().parent / "pipelines" / "endless_stream.py"
NOOP = "def build(ctx):\n    raise RuntimeError('no-op')\n"


def main() -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    ap = argparse.ArgumentParser()
    ap.add_argument("--kind", choices=["pyspark", "kafka", "noop"], default="pyspark")
    ap.add_argument("--signal", choices=["KILL", "STOP"], default="KILL")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--catalog", default=None, help="catalog URL (default SQLite in a temp home)")
    ap.add_argument("--case", choices=["warm", "just-started"], default="warm")
    ap.add_argument(
        "--ready",
        choices=["up", "warm"],
        default="up",
        help="just-started: submit when the cluster is up, or once its warm drivers are ready",
    )
    ap.add_argument("--second-kill-after", type=float, default=30.0, help="just-started: seconds after the first")
    a = ap.parse_args()
    if a.case == "just-started":
        from bench.failover_after_start import run_series

        run_series(runs=a.runs, ready=a.ready, second_kill_after_s=a.second_kill_after)
        return
    home = Path(tempfile.mkdtemp(prefix="headrace-failover-"))
    catalog = a.catalog or f"sqlite:///{home / 'catalog.db'}"
    spark = a.kind in ("pyspark", "kafka")
    cluster = start_cluster(
        home,
        catalog_url=catalog,
        taskmanagers=2,
        slots=2,
        warm_drivers=1 if spark else 0,
        pipeline_catalog_url=sink_db_url(home),
    )
    rest = Rest(cluster.dispatcher_url)
    times, detail = [], []
    broker = feeder = None
    try:
        if a.kind == "kafka":
            from bench.kafka_bench import COPY, create_topic, start_broker
            from tests.kafka_support import Feeder

            broker = start_broker(home)
            create_topic(broker.bootstrap, "in")
            create_topic(broker.bootstrap, "out")
            feeder = Feeder(broker.bootstrap, "in", rate=50).start()
            jar = rest.upload(COPY)
            body = {
                "parallelism": 1,
                "flinkConfiguration": {"execution.checkpointing.interval": "2 s"},
                "programArgsList": ["--input", "in", "--output", "out", "--bootstrap-servers", broker.bootstrap],
            }
        elif a.kind == "pyspark":
            jar = rest.upload(STREAM)
            body = {"parallelism": 1}
        else:
            p = home / "noop.py"
            p.write_text(NOOP)
            jar = rest.upload(p)
            body = {"kind": "noop", "config": {"noop.duration": -1}}
        restart = {"type": "fixed-delay", "attempts": 100, "delay": "1 s"}  # the cluster default delay
        job = rest.run(jar, restartStrategy=restart, **body)
        rest.wait_attempt_running(job, 0, timeout_s=180)
        for run in range(a.runs):
            if spark:
                wait_warm(cluster, 1)  # the survivor must have a ready warm driver, as on a warm cluster
            else:
                time.sleep(2)
            attempts = rest.attempts(job)
            victim = attempts[-1]["taskmanager-id"]
            child = cluster.child({"tm-1": "taskmanager-1", "tm-2": "taskmanager-2"}[victim])
            t0 = time.monotonic()
            if a.signal == "KILL":
                os.killpg(child.proc.pid, signal.SIGKILL)
            else:
                os.killpg(child.proc.pid, signal.SIGSTOP)
            attempts = rest.wait_attempt_running(job, attempts[-1]["attempt"] + 1, timeout_s=120)
            took = time.monotonic() - t0
            times.append(took)
            detail.append({"run": run, "seconds": round(took, 2), "from": victim, "to": attempts[-1]["taskmanager-id"]})
            print(f"run {run}: {took:.2f} s ({victim} -> {attempts[-1]['taskmanager-id']})", file=sys.stderr)
            # Bring the victim back as a fresh TaskManager with the same id for the next run.
            if a.signal == "STOP":
                os.killpg(child.proc.pid, signal.SIGKILL)
            child.proc.wait(10)
            cluster.respawn(child.name)
            deadline = time.monotonic() + 60
            while rest.get("/overview")["taskmanagers"] < 2 and time.monotonic() < deadline:
                time.sleep(0.2)
        rest.cancel(job)
    finally:
        cluster.stop()
        if feeder is not None:
            feeder.stop()
        if broker is not None:
            broker.stop()
    print(
        json.dumps(
            {
                "kind": a.kind,
                "signal": a.signal,
                "runs": detail,
                "median_s": round(statistics.median(times), 2),
                "min_s": round(min(times), 2),
                "max_s": round(max(times), 2),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
