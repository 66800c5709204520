"""Where a small micro-batch's time goes, and what Spark settings do to it (issue 27).

One SparkSession built the way a TaskManager's driver builds its own (services/taskmanager/
runtime/spark_session.py: local[2], the Python fork server, the connectors), running
bench/pipelines/click_windows.py (count and highest event number per key per 10 s window, a
watermark, upserts into PostgreSQL) while a producer writes --rate single JSON events per second
into a Redis stream. Each variant is a set of `spark.sql.*` options and a trigger; the variants
run one after another in rounds (alternating, so the machine's noise falls on all of them), each
on a fresh stream, table and checkpoint.

For every variant it prints:
  * the event latency (XADD -> the sink's row covering it, polled every --poll-ms): p50/p99/max,
  * the median and p90 of each phase Spark reports per micro-batch (`durationMs`: latestOffset,
    queryPlanning, walCommit, addBatch, commitOffsets, triggerExecution), over batches with data,
  * the SQL sink's own phases, timed around the connector in this process: the committed-batch
    check, collecting the batch as Arrow (this runs the batch's Spark job: the source read, the
    shuffle and the state store), the database transaction, the sink's whole foreachBatch
    function and PySpark's callback around it (addBatch less the callback is Spark's own work
    on the JVM around the call).

With `--sources redis,kafka` every variant runs on both sources one after the other: the Kafka
one is bench/pipelines/kafka_windows.py, the same query on Spark's Kafka source, fed by a producer
at the same rate into a topic of 2 partitions on a broker the script starts (bench/kafka_bench.py).

usage: python3 bench/latency_profile.py [--variants default,two-partitions,...] [--rounds 2]
       [--duration-s 40] [--rate 100] [--sources redis,kafka] [--python-over-tcp] [--smoke]
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._procs import Procs
from bench.checkpoint_overhead import DEFAULT_PG, drop_pg, fresh_pg, machine, percentile, pg_engine
from bench.latency import measure
from bench.throughput import PIPELINE

ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
FILE_CONTEXT_MANAGER_CLASS = (
    "org.apache.spark.sql.execution.streaming.checkpointing.FileContextBasedCheckpointFileManager"
)
FILE_CONTEXT_MANAGER = {"spark.sql.streaming.checkpointFileManagerClass": FILE_CONTEXT_MANAGER_CLASS}
# name -> (spark.sql.* options, trigger or None for Spark's default: the next batch at once). Every
# variant starts from the session a Headrace driver has (its checkpoint file manager, Unix sockets
# to the Python workers unless --python-over-tcp), 4 state partitions, the default trigger.
VARIANTS: dict[str, tuple[dict[str, str], str | None]] = {
    "default": ({}, None),
    "file-context-manager": (FILE_CONTEXT_MANAGER, None),
    "trigger-200ms": ({}, "200 milliseconds"),
    "two-partitions": ({"spark.sql.shuffle.partitions": "2"}, None),
    "one-partition": ({"spark.sql.shuffle.partitions": "1"}, None),
    "no-data-batches-off": ({"spark.sql.streaming.noDataMicroBatches.enabled": "false"}, None),
    "rocksdb": ({"spark.sql.streaming.stateStore.providerClass": ROCKSDB}, None),
    "rocksdb-changelog": (
        {
            "spark.sql.streaming.stateStore.providerClass": ROCKSDB,
            "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
        },
        None,
    ),
}
PHASES = ("latestOffset", "queryPlanning", "walCommit", "addBatch", "commitOffsets", "triggerExecution")
SINK_PHASES = ("check", "collect", "transaction", "foreachBatch", "callback")


class SinkTimer:
    """Times the SQL sink's steps per batch by wrapping its methods in this process."""

    def __init__(self) -> None:
        self.samples: dict[str, list[float]] = defaultdict(list)
        self.on = False

    def install(self) -> None:
        from services.taskmanager.runtime.connectors import sql

        timer = self
        cls = sql.SqlTableSink
        is_committed, write_arrow = cls.is_committed, cls.write_arrow

        def timed_check(self, batch_id):
            t = time.perf_counter()
            try:
                return is_committed(self, batch_id)
            finally:
                timer.add("check", t)

        def timed_write(self, data, batch_id, schema):
            timer.add("collect", timer.collect_started)
            t = time.perf_counter()
            try:
                return write_arrow(self, data, batch_id, schema)
            finally:
                timer.add("transaction", t)

        def timed_batch(self, df, batch_id):
            t = time.perf_counter()
            try:
                return batch(self, df, batch_id)
            finally:
                timer.add("foreachBatch", t)

        def batch(self, df, batch_id):
            flat_check = timed_check(self, batch_id)
            if flat_check:
                sql.flatten_structs(df).write.format("noop").mode("overwrite").save()
                return False
            flat = sql.flatten_structs(df)
            timer.collect_started = time.perf_counter()
            return timed_write(self, flat.toArrow(), batch_id, flat.schema)

        cls.write_batch = timed_batch
        self.collect_started = 0.0
        from pyspark.sql import utils

        callback = utils.ForeachBatchFunction.call

        def timed_callback(self, jdf, batch_id):
            t = time.perf_counter()
            try:
                return callback(self, jdf, batch_id)
            finally:
                timer.add("callback", t)

        utils.ForeachBatchFunction.call = timed_callback

    def add(self, phase: str, started: float) -> None:
        if self.on:
            self.samples[phase].append(time.perf_counter() - started)


class ProgressLog(threading.Thread):
    """Keeps every batch's durationMs of a query (recentProgress holds only the last 100)."""

    def __init__(self, query):
        super().__init__(daemon=True)
        self.query, self.batches, self.stop = query, {}, threading.Event()

    def run(self) -> None:
        while not self.stop.wait(2.0):
            self.collect()

    def collect(self) -> None:
        for p in self.query.recentProgress:
            if p.batchId not in self.batches:
                self.batches[p.batchId] = (int(p.numInputRows or 0), dict(p.durationMs))


def drop_unix_sockets() -> None:
    """Leave out build_spark's Unix domain socket options (a core option: fixed per session)."""
    from pyspark.sql import SparkSession

    config = SparkSession.Builder.config

    def without_sockets(self, key=None, value=None, *rest, **kw):
        if isinstance(key, str) and key.startswith("spark.python.unix.domain.socket."):
            return self
        return config(self, key, value, *rest, **kw)

    SparkSession.Builder.config = without_sockets


def load_pipeline(path: Path = PIPELINE):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(module)
    return module


class RedisFeed:
    """The Redis stream source: click_windows.py fed by bench/latency.py's producer."""

    name = "redis"

    def __init__(self, url: str) -> None:
        self.url = url
        self.module = load_pipeline()

    def pipeline_args(self, table: str) -> list[str]:
        return ["--stream", f"trickle_{table}", "--source-url", self.url]

    def measure(self, engine, table: str, args) -> dict:
        return measure(
            engine,
            table,
            self.url,
            f"trickle_{table}",
            rate=args.rate,
            warmup_s=args.warmup_s,
            duration_s=args.duration_s,
            poll_s=args.poll_ms / 1000,
        )


class KafkaFeed:
    """Spark's Kafka source: kafka_windows.py on a topic of 2 partitions of a broker of its own."""

    name = "kafka"

    def __init__(self, home: Path) -> None:
        from bench import kafka_bench

        self.bench = kafka_bench
        self.broker = kafka_bench.start_broker(home)
        self.module = load_pipeline(kafka_bench.WINDOWS)

    def pipeline_args(self, table: str) -> list[str]:
        topic = self.bench.create_topic(self.broker.bootstrap, table)
        return ["--topic", topic, "--bootstrap-servers", self.broker.bootstrap, "--low-latency"]

    def measure(self, engine, table: str, args) -> dict:
        return self.bench.measure_kafka(
            engine,
            table,
            self.broker.bootstrap,
            table,
            rate=args.rate,
            warmup_s=args.warmup_s,
            duration_s=args.duration_s,
            poll_s=args.poll_ms / 1000,
        )

    def stop(self) -> None:
        self.broker.stop()


def run_variant(spark, feed, timer: SinkTimer, name: str, *, run: int, sink_url: str, engine, home: Path, args) -> dict:
    from services.taskmanager.runtime.context import PipelineContext

    conf, trigger = VARIANTS[name]
    saved = {k: spark.conf.get(k, None) for k in conf}
    for k, v in conf.items():
        spark.conf.set(k, v)
    table = f"{feed.name}_{name.replace('-', '_')}_{run}"
    pargs = [*feed.pipeline_args(table), "--sink-url", sink_url, "--table", table]
    if trigger:
        pargs += ["--trigger", trigger]
    ctx = PipelineContext(
        spark,
        job_id=table,
        args=pargs,
        parallelism=args.parallelism,
        checkpoint_dir=str(home / "cp"),
        catalog_url="",
        redis_url=getattr(feed, "url", ""),
    )
    handle = feed.module.build(ctx)
    query = handle.start(str(home / "cp" / table), query_name=table)
    log = ProgressLog(query)
    log.start()
    try:
        timer.samples.clear()
        timer.on = True
        latency = feed.measure(engine, table, args)
        timer.on = False
    finally:
        log.stop.set()
        query.stop()
        for k, v in saved.items():
            if v is None:
                spark.conf.unset(k)
            else:
                spark.conf.set(k, v)
    log.collect()
    with_data = [d for rows, d in log.batches.values() if rows > 0]
    empty = sum(1 for rows, _ in log.batches.values() if rows == 0)
    phases = {ph: [d.get(ph, 0) / 1000 for d in with_data] for ph in PHASES}
    return {
        "latency": latency,
        "batches": len(with_data),
        "empty_batches": empty,
        "phases": {ph: (statistics.median(v), percentile(v, 0.9)) for ph, v in phases.items() if v},
        "sink": {ph: (statistics.median(v), percentile(v, 0.9)) for ph, v in timer.samples.items() if v},
    }


def report(name: str, r: dict) -> None:
    lat = r["latency"]
    print(
        f"\n{name}: {lat['events']} events, p50 {lat['p50_s']:.3f} s, p99 {lat['p99_s']:.3f} s, "
        f"max {lat['max_s']:.3f} s; {r['batches']} batches with data, {r['empty_batches']} without",
        flush=True,
    )
    for ph, (med, p90) in r["phases"].items():
        print(f"    spark {ph:16s} median {med * 1000:7.1f} ms   p90 {p90 * 1000:7.1f} ms")
    for ph in SINK_PHASES:
        if ph in r["sink"]:
            med, p90 = r["sink"][ph]
            print(f"    sink  {ph:16s} median {med * 1000:7.1f} ms   p90 {p90 * 1000:7.1f} ms")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--variants", default="default,file-context-manager,two-partitions,trigger-200ms")
    p.add_argument(
        "--python-over-tcp",
        action="store_true",
        help="Spark's own loopback TCP to the Python workers instead of the driver's Unix sockets",
    )
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--duration-s", type=float, default=40)
    p.add_argument("--warmup-s", type=float, default=10)
    p.add_argument("--rate", type=float, default=100)
    p.add_argument("--poll-ms", type=float, default=20)
    p.add_argument("--parallelism", type=int, default=2)
    p.add_argument("--shuffle-partitions", type=int, default=4, help="the session's default (a driver's: 4)")
    p.add_argument("--sources", default="redis", help="redis, kafka or both (redis,kafka): each variant on each")
    p.add_argument("--smoke", action="store_true", help="tiny sizes: checks the benchmark still works")
    args = p.parse_args()
    names = args.variants.split(",")
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        raise SystemExit(f"unknown variants {unknown}; known: {', '.join(VARIANTS)}")
    if args.smoke:
        args.duration_s, args.warmup_s, args.rounds, names = 4, 3, 1, names[:2]
    home = Path(tempfile.mkdtemp(prefix="hr-latency-profile-"))
    procs = Procs(home, {})
    sink_url = fresh_pg(DEFAULT_PG)
    engine = pg_engine(sink_url)
    from services.taskmanager.runtime.spark_session import build_spark
    from services.taskmanager.runtime.warm_up import warm_up

    if args.python_over_tcp:
        drop_unix_sockets()
    feeds: list = []

    spark = build_spark(
        args.parallelism, home / "driver", shuffle_partitions=args.shuffle_partitions, python_forkserver=True
    )
    try:
        warm_up(spark, home / "driver", args.parallelism)
        timer = SinkTimer()
        timer.install()
        feeds += [RedisFeed(procs.redis()) if src == "redis" else KafkaFeed(home) for src in args.sources.split(",")]
        print(
            f"machine: {machine()}; {args.rate:g} events/s; {args.duration_s:g} s measured after "
            f"{args.warmup_s:g} s; variants {names}, {args.rounds} round(s)",
            flush=True,
        )
        for run in range(args.rounds):
            for name in names:
                for feed in feeds:
                    r = run_variant(
                        spark, feed, timer, name, run=run, sink_url=sink_url, engine=engine, home=home, args=args
                    )
                    report(f"round {run + 1} {name} ({feed.name})", r)
    finally:
        for feed in feeds:
            if isinstance(feed, KafkaFeed):
                feed.stop()
        spark.stop()
        procs.stop()
        engine.dispose()
        drop_pg(DEFAULT_PG, sink_url)


if __name__ == "__main__":
    main()
