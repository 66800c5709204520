"""Kafka pipelines through Headrace, side by side in one run on one machine, against a real broker
(services/cluster/kafka_broker.py) this script starts on free ports.

  throughput  N records preloaded into a topic of 2 partitions, copied to a topic of their own
              by bench/pipelines/kafka_copy.py at parallelism 2, rounds alternating:
                headrace-eo   Headrace, delivery exactly-once (a transaction per checkpoint, every 2 s)
                bare-eo       the same file on bare PySpark (bench/bare_spark.py, which commits the
                              same sink every 2 s)
                headrace-alo  Headrace, Spark's own at-least-once sink
              A read_committed consumer counts the output: records/s from submission (or process
              start) to the last record visible, and from the first visible record to the last.
  latency     Kafka -> PostgreSQL, the trickle of bench/latency.py: --rate events/s of single JSON
              events counted per key per 10 s window (bench/pipelines/kafka_windows.py) by Headrace;
              an event's latency = the first poll of the table that shows it committed - when it
              was produced. p50/p90/p99/max after a warm-up.
  realtime    Kafka -> Kafka at --rate records/s, stateless, at-least-once (as Spark's real-time
              mode allows), rounds alternating micro-batches (the default trigger) and the
              real-time mode (job option headrace.real-time-mode); latency = when a consumer got the
              record - when it was produced.

usage: python bench/kafka_bench.py throughput [--records 1000000] [--rounds 3]
       python bench/kafka_bench.py latency [--rate 100] [--duration-s 60]
       python bench/kafka_bench.py realtime [--rate 1000] [--duration-s 30] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._procs import stop_group
from bench.checkpoint_overhead import DEFAULT_PG, drop_pg, fresh_pg, machine, percentile, pg_engine
from bench.latency import committed_n
from bench.submit_latency import wait_warm
from services.cluster import kafka_broker
from shared.jars import DEFAULT_CACHE_DIR, JarCache
from shared.ports import free_port
from tests.clusters import Rest, start_cluster

ROOT = Path(__file__).resolve().parent.parent
COPY = ROOT / "bench" / "pipelines" / "kafka_copy.py"
WINDOWS = ROOT / "bench" / "pipelines" / "kafka_windows.py"
BARE = ROOT / "bench" / "bare_spark.py"
CHECKPOINTS = {"execution.checkpointing.interval": "2 s"}


def start_broker(home: Path) -> kafka_broker.Broker:
    spec = kafka_broker.BrokerSpec(data_dir=home / "kafka", port=free_port(), controller_port=free_port())
    return kafka_broker.Broker(spec, JarCache(DEFAULT_CACHE_DIR), home / "kafka.log").start()


def create_topic(bootstrap: str, name: str, partitions: int = 2) -> str:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(name, partitions, 1)], operation_timeout=30).values():
        future.result(60)
    return name


def preload(bootstrap: str, topic: str, count: int) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 1 << 20})
    pad = "x" * 40
    for n in range(count):
        while True:
            try:
                producer.produce(topic, value=json.dumps({"n": n, "pad": pad}).encode(), key=str(n % 100).encode())
                break
            except BufferError:
                producer.poll(0.05)
    assert producer.flush(120) == 0


class Counter(threading.Thread):
    """Counts the records a read_committed consumer sees in a topic; notes the first and the
    time `target` were seen."""

    def __init__(self, bootstrap: str, topic: str, target: int):
        super().__init__(daemon=True)
        from confluent_kafka import Consumer

        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"bench-{uuid.uuid4().hex[:8]}",
                "auto.offset.reset": "earliest",
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
                "fetch.wait.max.ms": 50,
            }
        )
        self.consumer.subscribe([topic])
        self.target, self.count = target, 0
        self.first_at: float | None = None
        self.done_at: float | None = None
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set() and self.count < self.target:
            got = sum(1 for m in self.consumer.consume(50_000, 0.2) if m.error() is None)
            if got and self.first_at is None:
                self.first_at = time.monotonic()
            self.count += got
        self.done_at = time.monotonic()
        self.consumer.close()


def bare_process(home: Path, name: str, args: list[str]) -> subprocess.Popen:
    (home / "logs").mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        str(BARE),
        "--parallelism",
        "2",
        "--checkpoint",
        str(home / "bare" / name),
        "--commit-interval",
        "2",
        str(COPY),
        "--",
        *args,
    ]
    with open(home / "logs" / f"{name}.log", "ab") as log:
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def copy_once(
    kind: str, rnd: int, *, home: Path, rest: Rest, cluster, jar: str, bootstrap: str, records: int, timeout_s: float
) -> dict:
    out = create_topic(bootstrap, f"out-{kind}-{rnd}")
    delivery = "at-least-once" if kind.endswith("alo") else "exactly-once"
    args = ["--input", "in", "--output", out, "--bootstrap-servers", bootstrap, "--delivery", delivery]
    counter = Counter(bootstrap, out, records)
    counter.start()
    t0 = time.monotonic()
    job = proc = None
    try:
        if kind.startswith("headrace"):
            wait_warm(cluster, 1)
            t0 = time.monotonic()
            job = rest.run(jar, parallelism=2, jobName=out, programArgsList=args, flinkConfiguration=CHECKPOINTS)
        else:
            proc = bare_process(home, out, args)
        counter.join(timeout_s)
        if counter.done_at is None or counter.count < records:
            raise SystemExit(f"{kind}: {counter.count} of {records} records visible after {timeout_s:.0f} s")
    finally:
        counter.stop.set()
        if job is not None:
            rest.cancel(job)
            rest.wait_state(job, ("CANCELED", "FAILED", "FINISHED"), timeout_s=120)
        if proc is not None:
            stop_group(proc)
    total = counter.done_at - t0
    steady = counter.done_at - (counter.first_at or t0)
    return {
        "total_s": round(total, 2),
        "total_rps": round(records / total),
        "first_s": round((counter.first_at or t0) - t0, 2),
        "steady_rps": round(records / steady),
    }


def throughput(args, home: Path) -> None:
    broker = start_broker(home)
    catalog = fresh_pg(DEFAULT_PG)
    cluster = None
    try:
        create_topic(broker.bootstrap, "in")
        t = time.monotonic()
        preload(broker.bootstrap, "in", args.records)
        print(f"machine: {machine()}; preloaded {args.records:,} records in {time.monotonic() - t:.1f} s", flush=True)
        cluster = start_cluster(
            home / "cluster",
            catalog_url=catalog,
            taskmanagers=2,
            slots=2,
            warm_drivers=1,
            restart_strategy={"type": "none"},
        )
        rest = Rest(cluster.dispatcher_url)
        jar = rest.upload(COPY)
        kinds = ("headrace-eo", "bare-eo", "headrace-alo")
        results: dict[str, list[dict]] = {k: [] for k in kinds}
        for rnd in range(args.rounds):
            for kind in kinds:
                load = round(os.getloadavg()[0], 2)
                r = copy_once(
                    kind,
                    rnd,
                    home=home,
                    rest=rest,
                    cluster=cluster,
                    jar=jar,
                    bootstrap=broker.bootstrap,
                    records=args.records,
                    timeout_s=args.timeout,
                )
                results[kind].append(r)
                print(
                    f"round {rnd + 1} {kind:13s} all visible {r['total_s']:6.2f} s  {r['total_rps']:>9,} rec/s  "
                    f"first {r['first_s']:5.2f} s  steady {r['steady_rps']:>9,} rec/s  (load {load})",
                    flush=True,
                )
        med = {
            k: {f: statistics.median(r[f] for r in rs) for f in ("total_rps", "steady_rps")}
            for k, rs in results.items()
        }
        print("| run (median of %d) | records/s, whole run | records/s, first to last |" % args.rounds)
        print("|---|---|---|")
        for kind, m in med.items():
            print(f"| {kind} | {m['total_rps']:,.0f} | {m['steady_rps']:,.0f} |")
        for a, b in (("headrace-eo", "bare-eo"), ("headrace-eo", "headrace-alo")):
            print(
                f"{a} / {b}: whole run {med[a]['total_rps'] / med[b]['total_rps']:.2f}, "
                f"first to last {med[a]['steady_rps'] / med[b]['steady_rps']:.2f}"
            )
    finally:
        if cluster is not None:
            cluster.stop()
        broker.stop()
        drop_pg(DEFAULT_PG, catalog)


class TimedProducer(threading.Thread):
    """Produces record n at start + n / rate (no drift), noting when each was produced."""

    def __init__(self, bootstrap: str, topic: str, rate: float, count: int, as_event: bool):
        super().__init__(daemon=True)
        from confluent_kafka import Producer

        self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
        self.topic, self.rate, self.count, self.as_event = topic, rate, count, as_event
        self.written: dict[int, float] = {}

    def run(self) -> None:
        import datetime as dt

        start = time.monotonic()
        for n in range(self.count):
            delay = start + n / self.rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            value = (
                {"key": f"k{n % 10}", "n": n, "value": 1, "event_time": dt.datetime.now(dt.timezone.utc).isoformat()}
                if self.as_event
                else {"n": n}
            )
            self.producer.produce(self.topic, value=json.dumps(value).encode())
            self.written[n] = time.monotonic()
            self.producer.poll(0)
        self.producer.flush(30)


def summary(lat: list[float]) -> dict:
    return {
        "events": len(lat),
        "p50_s": round(percentile(lat, 0.5), 3),
        "p90_s": round(percentile(lat, 0.9), 3),
        "p99_s": round(percentile(lat, 0.99), 3),
        "max_s": round(max(lat), 3),
    }


def measure_kafka(
    engine,
    table: str,
    bootstrap: str,
    topic: str,
    *,
    rate: float,
    warmup_s: float,
    duration_s: float,
    poll_s: float = 0.01,
) -> dict:
    """Produce `rate` events/s into `topic` for warm-up + duration; latency of event n = the first
    poll of `table` showing n committed - when n was produced (bounded: 60 s after the last)."""
    total = int(rate * (warmup_s + duration_s))
    producer = TimedProducer(bootstrap, topic, rate, total, as_event=True)
    producer.start()
    seen: dict[int, float] = {}
    last, deadline = -1, time.monotonic() + warmup_s + duration_s + 60
    while last < total - 1 and time.monotonic() < deadline:
        n = committed_n(engine, table)
        now = time.monotonic()
        for k in range(last + 1, n + 1):
            seen[k] = now
        last = max(last, n)
        time.sleep(poll_s)
    skip = int(rate * warmup_s)
    return summary([seen[n] - producer.written[n] for n in range(skip, total) if n in seen and n in producer.written])


# --kinds of the latency case: the job's options (checkpoints at the cluster's default interval,
# 10 s, as in bench/latency.py, unless the kind says otherwise)
LATENCY_MODE = {"headrace.latency-mode": "true"}
LATENCY_KINDS = {
    "default": {},
    "latency-mode": LATENCY_MODE,
    "latency-mode-2s-checkpoints": {**LATENCY_MODE, **CHECKPOINTS},
    "latency-mode-1-state-partition": {**LATENCY_MODE, "spark.sql.shuffle.partitions": "1"},
    "latency-mode-no-checkpoints": {**LATENCY_MODE, "execution.checkpointing.interval": "1 h"},
}


def latency(args, home: Path) -> None:
    kinds = args.kinds.split(",")
    if unknown := [k for k in kinds if k not in LATENCY_KINDS]:
        raise SystemExit(f"unknown --kinds {unknown}; known: {', '.join(LATENCY_KINDS)}")
    broker = start_broker(home)
    catalog, sink = fresh_pg(DEFAULT_PG), fresh_pg(DEFAULT_PG)
    engine = pg_engine(sink)
    cluster = None
    try:
        cluster = start_cluster(home / "cluster", catalog_url=catalog, taskmanagers=2, slots=2, warm_drivers=1)
        rest = Rest(cluster.dispatcher_url)
        jar = rest.upload(WINDOWS)
        print(
            f"machine: {machine()}; {args.rate:g} events/s, {args.warmup_s:g} s warm-up, {args.duration_s:g} s "
            f"measured; kinds {kinds}, alternating",
            flush=True,
        )
        for rnd in range(args.rounds):
            for kind in kinds:
                topic = create_topic(broker.bootstrap, f"events-{kind}-{rnd}".replace("-", "_"))
                wait_warm(cluster, 1)
                job = rest.run(
                    jar,
                    parallelism=2,
                    jobName=topic,
                    flinkConfiguration=LATENCY_KINDS[kind],
                    programArgsList=[
                        "--topic",
                        topic,
                        "--bootstrap-servers",
                        broker.bootstrap,
                        "--sink-url",
                        sink,
                        "--table",
                        topic,
                        "--low-latency",
                    ],
                )
                try:
                    rest.wait_running_task(job, timeout_s=180)
                    r = measure_kafka(
                        engine,
                        topic,
                        broker.bootstrap,
                        topic,
                        rate=args.rate,
                        warmup_s=args.warmup_s,
                        duration_s=args.duration_s,
                    )
                    print(
                        f"round {rnd + 1} {kind:12s} Kafka -> PostgreSQL: {r} (load {os.getloadavg()[0]:.1f})",
                        flush=True,
                    )
                finally:
                    rest.cancel(job)
                    rest.wait_state(job, ("CANCELED", "FAILED", "FINISHED"), timeout_s=120)
    finally:
        if cluster is not None:
            cluster.stop()
        broker.stop()
        engine.dispose()
        drop_pg(DEFAULT_PG, catalog)
        drop_pg(DEFAULT_PG, sink)


def realtime(args, home: Path) -> None:
    from confluent_kafka import Consumer

    broker = start_broker(home)
    catalog = fresh_pg(DEFAULT_PG)
    cluster = None
    try:
        cluster = start_cluster(home / "cluster", catalog_url=catalog, taskmanagers=2, slots=2, warm_drivers=1)
        rest = Rest(cluster.dispatcher_url)
        jar = rest.upload(COPY)
        print(
            f"machine: {machine()}; {args.rate:g} records/s, {args.warmup_s:g} s warm-up, {args.duration_s:g} s "
            "measured",
            flush=True,
        )
        for rnd in range(args.rounds):
            for kind in ("micro-batch", "real-time"):
                src, out = (create_topic(broker.bootstrap, f"{kind}-{rnd}-{x}") for x in ("in", "out"))
                real_time = {"headrace.real-time-mode": args.real_time_batch} if kind == "real-time" else {}
                config = {**CHECKPOINTS, **real_time}
                wait_warm(cluster, 1)
                job = rest.run(
                    jar,
                    parallelism=2,
                    jobName=src,
                    flinkConfiguration=config,
                    programArgsList=[
                        "--input",
                        src,
                        "--output",
                        out,
                        "--bootstrap-servers",
                        broker.bootstrap,
                        "--delivery",
                        "at-least-once",
                        "--low-latency",
                    ],
                )
                consumer = Consumer(
                    {
                        "bootstrap.servers": broker.bootstrap,
                        "group.id": f"rt-{uuid.uuid4().hex[:6]}",
                        "auto.offset.reset": "earliest",
                        "fetch.wait.max.ms": 5,
                    }
                )
                consumer.subscribe([out])
                try:
                    rest.wait_running_task(job, timeout_s=180)
                    time.sleep(10 if kind == "real-time" else 3)  # the first (real-time) batch starts
                    total = int(args.rate * (args.warmup_s + args.duration_s))
                    producer = TimedProducer(broker.bootstrap, src, args.rate, total, as_event=False)
                    producer.start()
                    got: dict[int, float] = {}
                    deadline = time.monotonic() + args.warmup_s + args.duration_s + 60
                    while len(got) < total and time.monotonic() < deadline:
                        for m in consumer.consume(1000, 0.05):
                            if m.error() is None:
                                got.setdefault(int(json.loads(m.value())["n"]), time.monotonic())
                    skip = int(args.rate * args.warmup_s)
                    r = summary(
                        [got[n] - producer.written[n] for n in range(skip, total) if n in got and n in producer.written]
                    )
                    print(f"round {rnd + 1} {kind:11s} {r}", flush=True)
                finally:
                    consumer.close()
                    rest.cancel(job)
                    rest.wait_state(job, ("CANCELED", "FAILED", "FINISHED"), timeout_s=120)
    finally:
        if cluster is not None:
            cluster.stop()
        broker.stop()
        drop_pg(DEFAULT_PG, catalog)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("case", choices=("throughput", "latency", "realtime"))
    p.add_argument("--records", type=int, default=1_000_000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--rate", type=float, default=None, help="records/s (latency: 100, realtime: 1000)")
    p.add_argument("--warmup-s", type=float, default=10.0)
    p.add_argument("--duration-s", type=float, default=60.0)
    p.add_argument("--timeout", type=float, default=900.0)
    p.add_argument("--real-time-batch", default="5 s", help="realtime: how long each real-time batch runs")
    p.add_argument("--kinds", default="default,latency-mode", help=f"latency: {', '.join(LATENCY_KINDS)}")
    args = p.parse_args()
    if args.rate is None:
        args.rate = 100.0 if args.case == "latency" else 1000.0
    home = Path(tempfile.mkdtemp(prefix="hr-kafka-bench-"))
    {"throughput": throughput, "latency": latency, "realtime": realtime}[args.case](args, home)


if __name__ == "__main__":
    main()
