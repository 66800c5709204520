"""What a driver runs before it reports ready, so that the task that takes it does not pay for it:
the connectors' imports, Spark's Python workers and planner, and a stateful streaming query shaped
like most pipelines for enough micro-batches that the JVM has compiled the path every micro-batch
takes (warm_up). A driver whose executors come from a Spark cluster runs no job in reserve
(warm_up_driver). Used by the runner and by the class archive builder (class_archive.py), which
runs one micro-batch of warm_up in a JVM that dumps its classes."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# How often the warm-up's streaming query looks whether a task is waiting for the driver.
WARM_UP_POLL_S = 0.1
# The warm-up query's micro-batches in reserve (shared.driver_contract.WARM_UP_BATCHES, 150 unless
# Settings.warm_up_batches says otherwise): a task's batches took ~0.65 s in its first 20 s and
# ~0.3 s after ~100 of them as the JVM compiled their path, and one micro-batch of warm-up in
# reserve did not change that; after 150 of this query the task's first batches run at the later
# pace (docs/benchmarks.md, "A job's first minute"). ~60 s of one core more than one batch, once
# per driver, at its rank's priority (warm_pool.py); a task that arrives meanwhile cuts it short.
ROWS_PER_BATCH = 64


def warm_up_kafka(spark: Any) -> None:
    """Load what a Kafka pipeline's build(ctx) would otherwise load on the task's clock: the
    Python Kafka client (the brokers' reachability check, the exactly-once sink) and Spark's
    Kafka source classes. Defining a Kafka source reaches no broker. Without the connector's jars
    (a bare install) there is nothing to load."""
    try:
        import confluent_kafka.admin  # noqa: F401

        source = (
            spark.readStream.format("kafka")
            .option("kafka.bootstrap.servers", "127.0.0.1:9")
            .option("subscribe", "headrace-warm-up")
            .load()
        )
        source.select("value").schema  # noqa: B018 - analysing the plan is the point
    except Exception as exc:  # noqa: BLE001 - a warm-up step, never a reason to lose the driver
        print(f"warm-up: no Kafka classes loaded ({type(exc).__name__}: {str(exc)[:200]})", flush=True)


def warm_up_driver(spark: Any, parallelism: int = 1, cut_short: Callable[[], bool] = lambda: False) -> bool:
    """The warm-up of a driver whose executors come from a Spark cluster, which runs no job in
    reserve (it would take executors a running task could use): what a task's `build(ctx)` would
    otherwise pay on the driver alone. The connectors' imports, Spark's Kafka classes, a Python
    data source defined (Spark starts its data-source daemon on the driver, which every later
    source reuses) and a stateful aggregation over it analysed, as a restore's compatibility check
    walks it (Catalyst's classes, the Py4J calls). In the compose stack a task's `build(ctx)` took
    1.0 s of its 2.1 s to RUNNING on a driver without it (docs/benchmarks.md, "The compose
    stack"). Returns whether it ran to its end."""
    from . import context  # noqa: F401 - preload the connector modules (SQLAlchemy etc.)
    from .connectors.sql import warm_drivers as warm_sql_drivers

    warm_sql_drivers()
    if cut_short():
        return False
    warm_up_kafka(spark)
    if cut_short():
        return False
    analyse_a_stateful_query(spark, parallelism)
    return True


def analyse_a_stateful_query(spark: Any, parallelism: int) -> None:
    """What a task's `build(ctx)` pays on a fresh session: a Python data source defined as a
    stream (Spark starts its data-source daemon on the driver, which every later source reuses)
    and a stateful aggregation over it analysed, as a restore's compatibility check walks it
    (Catalyst's classes, the Py4J calls). No job runs."""
    from pyspark.sql import functions as F

    from .plan_signature import plan_signature

    source = spark.readStream.format("datagen").option("total", "64").option("partitions", str(max(1, parallelism)))
    totals = source.load().groupBy("url").agg(F.count("*").alias("count"), F.sum("i").alias("total"))
    plan_signature(totals, output_mode="update")  # what a restore compares its snapshot with


def warm_up(
    spark: Any,
    workdir: str | Path,
    parallelism: int = 1,
    cut_short: Callable[[], bool] = lambda: False,
    batches: int = 1,
    steps: list[str] | None = None,
) -> bool:
    """Run what the first micro-batch of a task's query would otherwise pay for (measured in
    docs/benchmarks.md, "Submission to first result"): the connectors' imports on the driver
    (SQLAlchemy, the PostgreSQL driver), a stateful query analysed as a task's build(ctx) does
    (`analyse_a_stateful_query`), a shuffle job, then a stateful streaming query shaped
    like most pipelines: a Python data source read with `parallelism` partitions (Spark's Python
    planner and worker daemons, which the task reuses), a watermarked window aggregation with
    several aggregates, and a foreachBatch that collects each batch as Arrow, as the SQL sink
    does (Py4J callback server, Arrow collection, code generation of the aggregation, the state
    store), for `batches` micro-batches. No RDD job: RDD Python workers run under a daemon of
    their own that SQL never uses.

    `cut_short()` true (a task is waiting for this driver) ends it between steps, during the
    analysis or the shuffle job (left to finish beside the task), or in its streaming query
    (stopped beside the task): a waiting task's own first batch pays for the same work once, where
    finishing the warm-up first made it pay twice. Returns whether the warm-up ran to its end;
    `steps`, if given, gets each step's name as it starts (the driver's log says where a cut came)."""
    from pyspark.sql import functions as F

    from . import context  # noqa: F401 - preload the connector modules (SQLAlchemy etc.)
    from .connectors.sql import warm_drivers as warm_sql_drivers

    started = steps.append if steps is not None else lambda _name: None
    started("the SQL drivers' imports")
    warm_sql_drivers()
    if cut_short():
        return False
    started("Kafka's classes")
    warm_up_kafka(spark)  # ~50 ms: no look of its own at cut_short
    parts = max(1, parallelism)
    # First what the task's build(ctx) needs, then what its first micro-batch does: a task that
    # came 6.6 s into a warm-up (its streaming query not started) spent 2.5 s in build(ctx), one
    # that came after 10 s or more 0.12-0.33 s (docs/benchmarks.md, "Kill 2 and build(ctx)").
    started("the analysis of a stateful query")
    if not in_background_unless_cut(lambda: analyse_a_stateful_query(spark, parts), cut_short):
        return False
    started("the shuffle job")
    if not in_background_unless_cut(
        lambda: spark.range(64).groupBy((F.col("id") % 4).alias("k")).count().collect(), cut_short
    ):
        return False
    started("the warm-up query")
    checkpoint = Path(workdir) / "warmup-checkpoint"
    return run_warm_up_query(spark, checkpoint, parts, max(1, batches), cut_short) >= max(1, batches)


def in_background_unless_cut(step: Callable[[], Any], cut_short: Callable[[], bool]) -> bool:
    """Run a warm-up step (a Spark job: seconds of a cold JVM on a loaded machine), looking at
    `cut_short` while it runs; False as soon as a task waits, the step left to finish beside the
    task's start rather than ahead of it."""
    finished = threading.Event()

    def run() -> None:
        try:
            step()
        except Exception as exc:  # noqa: BLE001 - a warm-up step, never a reason to lose the driver
            print(f"warm-up step failed ({type(exc).__name__}: {str(exc)[:200]}); going on", flush=True)
        finally:
            finished.set()

    threading.Thread(target=run, name="warm-up-step", daemon=True).start()
    while not finished.wait(WARM_UP_POLL_S):
        if cut_short():
            return False
    return not cut_short()


def run_warm_up_query(spark: Any, checkpoint: Path, parts: int, batches: int, cut_short: Callable[[], bool]) -> int:
    """The warm-up's streaming query for `batches` micro-batches of ROWS_PER_BATCH rows, stopped
    when `cut_short()`; how many micro-batches it completed."""
    from pyspark.sql import functions as F

    writer = (
        spark.readStream.format("datagen")
        .option("total", str(ROWS_PER_BATCH * batches))
        .option("max_rows_per_batch", str(ROWS_PER_BATCH))
        .option("partitions", str(parts))
        .load()
        .withWatermark("event_time", "10 seconds")
        .groupBy(F.window("event_time", "1 minute"), "url")
        .agg(F.count("*").alias("count"), F.max("i").alias("last"))
        .writeStream.foreachBatch(lambda df, _id: df.toArrow())
        .outputMode("update")
        .option("checkpointLocation", str(checkpoint))
    )
    # A Python source reads everything available in one batch under availableNow, so a query of
    # more than one batch runs on the default trigger and is stopped after its last batch.
    q = (writer.trigger(availableNow=True) if batches == 1 else writer).start()
    while not q.awaitTermination(WARM_UP_POLL_S):
        done = completed(q)
        if done >= batches:
            stop_query(q)
            return done
        if cut_short():
            # A task waits: it need not wait for the batch in flight to end too (a stop waits for
            # the batch's foreachBatch call, seconds on a loaded machine). Its own query starts
            # beside the stopping one; nothing of the task's looks at the session's other queries.
            threading.Thread(target=stop_query, args=(q, time.monotonic()), name="warm-up-stop", daemon=True).start()
            return done
    return batches


def stop_query(query: Any, cut_at: float | None = None) -> None:
    """Stop the warm-up query; never raise (its end must never cost the task its driver)."""
    try:
        query.stop()  # Spark logs the cancelled batch's jobs: harmless, the task's query is its own
    except Exception as exc:  # noqa: BLE001
        print(f"warm-up query did not stop cleanly ({type(exc).__name__}: {exc}); going on", flush=True)
        return
    if cut_at is not None:
        print(f"warm-up query stopped {time.monotonic() - cut_at:.2f}s after it was cut short", flush=True)


def completed(query: Any) -> int:
    """Micro-batches a streaming query has completed (from its last progress)."""
    progress = query.lastProgress
    return int(progress["batchId"]) + 1 if progress else 0
