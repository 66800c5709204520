"""A Headrace pipeline file run as a plain PySpark script: no TaskManager, no warm driver, no
control plane. The benchmarks compare Headrace against this.

The jars are the same (Spark's Kafka connector and Delta Lake from the cache, shared/jars.py). A
sink that commits at checkpoints (the exactly-once Kafka sink) is committed every
--commit-interval seconds by a loop here, as a hand-written script would have to.

What a user would write by hand: a `SparkSession` built with the same Spark settings a
TaskManager's driver gets (master local[p], shuffle partitions, driver memory, UTC, Arrow), the
project's connectors registered, the pipeline's `build(ctx)` called on a context over that
session, the query started on a checkpoint directory and awaited. The sink is not fenced (no
attempts exist here); everything else is the same code.

    python bench/bare_spark.py PIPELINE.py --parallelism 2 --checkpoint DIR \
        [--shuffle-partitions 4] [--driver-memory 1g] [--conf KEY=VALUE]... -- PIPELINE ARGS...

It prints `bare: query started` when the query runs and runs until it is killed (SIGTERM stops
the query) or the query ends.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import signal
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> int:
    t0 = time.monotonic()
    p = argparse.ArgumentParser(prog="bench/bare_spark.py")
    p.add_argument("pipeline")
    p.add_argument("--parallelism", type=int, default=2)
    p.add_argument("--shuffle-partitions", type=int, default=4)
    p.add_argument("--driver-memory", default="1g")
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    p.add_argument("--catalog-url", default="")
    p.add_argument("--conf", action="append", default=[], help="KEY=VALUE: a Spark option more (repeatable)")
    p.add_argument(
        "--commit-interval",
        type=float,
        default=2.0,
        help="seconds between commits of a sink that commits at checkpoints",
    )
    p.add_argument("args", nargs=argparse.REMAINDER)
    args = p.parse_args()
    pipeline_args = args.args[1:] if args.args[:1] == ["--"] else args.args

    # Pitfall 1 of PySpark: workers must run this interpreter (it has pyarrow).
    os.environ["PYSPARK_PYTHON"] = os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")]))
    from pyspark.sql import SparkSession

    from shared.jars import DEFAULT_CACHE_DIR, JarCache

    builder = SparkSession.builder
    for key, value in JarCache(DEFAULT_CACHE_DIR).spark_conf().items():
        builder = builder.config(key, value)
    for item in args.conf:
        key, _, value = item.partition("=")
        builder = builder.config(key, value)
    spark = (
        builder.master(f"local[{args.parallelism}]")
        .appName("bare")
        .config("spark.driver.memory", args.driver_memory)
        .config("spark.sql.shuffle.partitions", str(args.shuffle_partitions))
        .config("spark.ui.enabled", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("WARN")
    from services.taskmanager.runtime.connectors import register_data_sources
    from services.taskmanager.runtime.context import PipelineContext

    register_data_sources(spark)
    spec = importlib.util.spec_from_file_location(Path(args.pipeline).stem, args.pipeline)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(module)
    ctx = PipelineContext(
        spark,
        job_id="bare",
        args=pipeline_args,
        parallelism=args.parallelism,
        checkpoint_dir=args.checkpoint,
        catalog_url=args.catalog_url,
        redis_url=args.redis_url,
    )
    handle = module.build(ctx)
    live = Path(args.checkpoint) / handle.name
    if handle.two_phase is not None:
        handle.prepare(0, -1)
    query = handle.start(str(live), query_name="bare")
    print(f"bare: query started after {time.monotonic() - t0:.2f} s", flush=True)
    if handle.two_phase is not None:
        import threading

        threading.Thread(target=commit_loop, args=(handle.two_phase, live, args.commit_interval), daemon=True).start()
    signal.signal(signal.SIGTERM, lambda *_: query.stop())
    try:
        query.awaitTermination()
    finally:
        spark.stop()
    return 0


def commit_loop(sink, live: Path, interval_s: float) -> None:
    """Commit the sink's open transaction every interval at the last batch Spark committed."""
    from shared import checkpoint_storage as storage

    n = 0
    while True:
        time.sleep(interval_s)
        with sink.hold() as last:
            if last is None:
                continue
            deadline = time.monotonic() + 60
            while (storage.latest_committed_batch(live) or -1) < last and time.monotonic() < deadline:
                time.sleep(0.02)
            n += 1
            sink.commit(last, checkpoint_id=n, path="", kind="bare")


if __name__ == "__main__":
    sys.exit(main())
