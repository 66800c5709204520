"""CPU of one running counting job, by trigger interval and checkpoint interval: what a drill of
the test suite pays per second while its job runs.

One local cluster (one TaskManager, no warm driver, a SQLite catalog); for each setting in turn,
in the same run: an outside producer at --rate events per second, examples/keyed_counts.py into
PostgreSQL with that trigger and checkpoint interval, RUNNING, --settle seconds, then the whole
machine's busy CPU over --seconds (every process: the job's JVM and Python workers, the cluster's
services, Redis, PostgreSQL), then the job cancelled. --rounds repeats the settings interleaved,
so the machine's noise falls on all of them alike.

usage: python bench/job_cpu.py [--setting "500 milliseconds,1 s"] [--setting "1 second,2 s,2"]
                               [--rate 150] [--seconds 60] [--rounds 1] [--suite-jvm]
(a setting's optional third field: the job's state partitions, spark.sql.shuffle.partitions;
without it the cluster's default, Settings.spark_shuffle_partitions)
(--suite-jvm: the JVMs as the test suite runs them, JDK_JAVA_OPTIONS=tests/clusters.py's
SUITE_JVM_OPTIONS; otherwise the environment's JDK_JAVA_OPTIONS, or the JVM's defaults)
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.checkpoint_overhead import machine  # noqa: E402
from bench.cluster_start import busy_cpu_s  # noqa: E402
from tests.clusters import SUITE_JVM_OPTIONS, Rest, start_cluster  # noqa: E402
from tests.e2e.counting import Producer, completed_checkpoints  # noqa: E402

DEFAULT_SETTINGS = ["500 milliseconds,1 s", "1 second,2 s"]


def measure(
    rest: Rest,
    jar: str,
    redis_url: str,
    sink_url: str,
    trigger: str,
    interval: str,
    *,
    rate: float,
    settle_s: float,
    seconds: float,
    tag: str,
    partitions: int | None = None,
) -> dict:
    stream = f"cpu-{tag}"
    producer = Producer(redis_url, stream, rate=rate).start()
    args = [
        "--stream",
        stream,
        "--sink",
        "sql",
        "--table",
        f"bench_cpu_{tag}",
        "--sink-url",
        sink_url,
        "--trigger",
        trigger,
    ]
    config = {"execution.checkpointing.interval": interval}
    if partitions is not None:
        config["spark.sql.shuffle.partitions"] = str(partitions)
    job = rest.run(jar, parallelism=1, jobName=stream, programArgsList=args, flinkConfiguration=config)
    try:
        rest.wait_attempt_running(job, 0, timeout_s=300)
        time.sleep(settle_s)
        t0, cpu0, chk0 = time.monotonic(), busy_cpu_s(), completed_checkpoints(rest, job)
        time.sleep(seconds)
        elapsed = time.monotonic() - t0
        return {
            "trigger": trigger,
            "checkpoint_interval": interval,
            "state_partitions": partitions or "default",
            "busy_cores": round((busy_cpu_s() - cpu0) / elapsed, 3),
            "checkpoints_per_s": round((completed_checkpoints(rest, job) - chk0) / elapsed, 2),
        }
    finally:
        producer.stop()
        rest.cancel(job)
        rest.wait_state(job, ("CANCELED", "FAILED", "FINISHED"), timeout_s=120)
        with psycopg.connect(sink_url, autocommit=True) as conn:
            conn.execute(f"DROP TABLE IF EXISTS bench_cpu_{tag}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--setting", action="append", help='"<trigger>,<checkpoint interval>" (repeatable)')
    ap.add_argument("--rate", type=float, default=150.0)
    ap.add_argument("--settle", type=float, default=20.0)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--sink-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    ap.add_argument("--suite-jvm", action="store_true")
    opts = ap.parse_args()
    if opts.suite_jvm:
        os.environ["JDK_JAVA_OPTIONS"] = SUITE_JVM_OPTIONS
    settings = [s.split(",", 2) for s in (opts.setting or DEFAULT_SETTINGS)]
    for setting in settings:
        if len(setting) < 2 or (len(setting) == 3 and not setting[2].strip().isdigit()):
            ap.error(
                f'--setting {",".join(setting)!r}: expected "<trigger>,<checkpoint interval>[,<state partitions>]"'
            )
    print({**machine(), "JDK_JAVA_OPTIONS": os.environ.get("JDK_JAVA_OPTIONS", "")}, flush=True)
    home = Path(tempfile.mkdtemp(prefix="job-cpu-"))
    cluster = start_cluster(home, catalog_url=f"sqlite:///{home}/catalog.db", taskmanagers=1, slots=2, warm_drivers=0)
    try:
        rest = Rest(cluster.dispatcher_url)
        jar = rest.upload(ROOT / "examples" / "keyed_counts.py")
        for r in range(opts.rounds):
            for i, (trigger, interval, *partitions) in enumerate(settings):
                print(
                    measure(
                        rest,
                        jar,
                        cluster.redis_url,
                        opts.sink_url,
                        trigger.strip(),
                        interval.strip(),
                        rate=opts.rate,
                        settle_s=opts.settle,
                        seconds=opts.seconds,
                        tag=f"{r}_{i}",
                        partitions=int(partitions[0]) if partitions else None,
                    ),
                    flush=True,
                )
    finally:
        cluster.stop()


if __name__ == "__main__":
    main()
