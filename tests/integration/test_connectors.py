"""Connectors against real Spark, redis-server, SQLite and PostgreSQL (one SparkSession)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import redis
import sqlalchemy as sa

from services.taskmanager.runtime.connectors import SinkHandle
from services.taskmanager.runtime.connectors.datagen import generate_batch, generate_events
from services.taskmanager.runtime.connectors.redis_stream_entries import pack_events, unpack_entry
from services.taskmanager.runtime.connectors.redis_streams import commit_entries
from services.taskmanager.runtime.connectors.sql import SqlTableSink
from services.taskmanager.runtime.connectors.sql_engine import make_engine
from services.taskmanager.runtime.context import PipelineContext
from services.taskmanager.runtime.spark_session import build_spark
from tests.waiting import wait_for

EVENT_DDL = "i long, user_id string, url string, event_time timestamp"


@pytest.fixture(scope="module")
def spark(tmp_path_factory):
    session = build_spark(2, tmp_path_factory.mktemp("spark"), shuffle_partitions=2)
    yield session
    session.stop()


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request) -> str:
    return request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "pg_url")


def ctx_for(spark, tmp_path: Path, **kw) -> PipelineContext:
    return PipelineContext(
        spark, job_id=kw.pop("job_id", "job-t"), parallelism=2, checkpoint_dir=str(tmp_path / "cp"), **kw
    )


def rerun_last_batch(checkpoint: Path) -> int:
    """Make Spark re-execute the last micro-batch on restart, as after a crash between the
    sink write and the commit log: drop the batch's commit file."""
    commits = sorted((checkpoint / "commits").glob("[0-9]*"), key=lambda p: int(p.name))
    last = commits[-1]
    last.unlink()
    crc = last.parent / f".{last.name}.crc"
    if crc.exists():
        crc.unlink()
    return int(last.name)


def datagen_stream(spark, **opts):
    base = {"seed": "3", "partitions": "2"}
    base.update({k: str(v) for k, v in opts.items()})
    return spark.readStream.format("datagen").options(**base).load()


# ---------------------------------------------------------------- redis streams


def test_pack_and_unpack_round_trip():
    events = generate_events(1, 0, 10)
    table = unpack_entry({b"arrow": pack_events(events)})
    assert table.to_pylist() == events
    single = unpack_entry({"json": json.dumps({"i": 1, "url": "/x"})})
    assert single.to_pylist() == [{"i": 1, "url": "/x"}]


def test_redis_source_reads_packed_and_json_entries_and_replays(spark, redis_url, tmp_path):
    r = redis.Redis.from_url(redis_url)
    ids = []
    for k in range(3):  # 3 packed entries of 1000 events: i in [0, 3000)
        ids.append(r.xadd("clicks", {"arrow": pack_events(generate_batch(2, 1000 * k, 1000 * (k + 1)))}))
    for i in range(3000, 3005):  # 5 single JSON events from an "outside producer"
        e = generate_event_json(2, i)
        ids.append(r.xadd("clicks", {"json": json.dumps(e)}))

    def run(checkpoint: Path, **opts) -> dict[int, dict]:
        """Events read by a query, by i; a duplicate read would fail the count check."""
        got: list[dict] = []
        df = (
            spark.readStream.format("redis_stream")
            .schema(EVENT_DDL)
            .option("url", redis_url)
            .option("stream", "clicks")
            .options(**opts)
            .load()
        )
        q = (
            df.writeStream.foreachBatch(lambda b, _id: got.extend(r.asDict() for r in b.collect()))
            .option("checkpointLocation", str(checkpoint))
            .start()
        )
        try:
            q.processAllAvailable()
        finally:
            q.stop()
        by_i = {e["i"]: e for e in got}
        assert len(by_i) == len(got)
        return by_i

    got = run(tmp_path / "cp1", max_entries_per_trigger="2", partitions="2")
    assert sorted(got) == list(range(3005))
    for i in (5, 3002):  # one packed, one JSON event, every field
        expected = generate_events(2, i, i + 1)[0]
        assert got[i] == {**expected, "event_time": expected["event_time"].replace(tzinfo=None)}

    # Replay from an entry id: everything after the second packed entry.
    got = run(tmp_path / "cp2", start=ids[1].decode())
    assert sorted(got) == list(range(2000, 3005))

    # A restarted query resumes from its checkpoint: only entries added since are read.
    r.xadd("clicks", {"arrow": pack_events(generate_batch(2, 3005, 3100))})
    got = run(tmp_path / "cp1", max_entries_per_trigger="2")
    assert sorted(got) == list(range(3005, 3100))


def generate_event_json(seed: int, i: int) -> dict:
    e = generate_events(seed, i, i + 1)[0]
    return {**e, "event_time": e["event_time"].isoformat()}


def test_redis_sink_writes_packed_entries_once_per_batch(spark, redis_url, tmp_path):
    checkpoint = tmp_path / "cp"
    ctx = ctx_for(spark, tmp_path, redis_url=redis_url, job_id="job-redis")
    r = redis.Redis.from_url(redis_url)

    def run() -> int:
        df = datagen_stream(spark, total=2500, max_rows_per_batch=1000)
        q = ctx.sinks.redis_stream(df, "out", rows_per_entry=400).start(str(checkpoint))
        try:
            q.processAllAvailable()
            return q.lastProgress["batchId"]
        finally:
            q.stop()

    def stream_events() -> list[int]:
        return [i for _, fields in r.xrange("out") for i in unpack_entry(fields).column("i").to_pylist()]

    run()
    first = stream_events()
    assert sorted(first) == list(range(2500))
    assert all(b"arrow" in fields for _, fields in r.xrange("out"))
    # Batches of 1000, 1000, 500 rows, 2 tasks each, <= 400 rows per entry: 4 + 4 + 2 entries.
    assert r.xlen("out") == 10

    rerun = rerun_last_batch(checkpoint)
    assert run() == rerun  # Spark did execute the batch again ...
    assert sorted(stream_events()) == list(range(2500))  # ... and the sink wrote nothing twice

    # The commit itself is idempotent per batch id.
    before = r.xlen("out")
    assert (
        commit_entries(r, "out", [pack_events(generate_events(0, 0, 2))], sink_id="job-redis:out", batch_id=rerun)
        is False
    )
    assert r.xlen("out") == before


# ---------------------------------------------------------------- sql


def test_sql_sink_is_exactly_once_per_micro_batch(spark, db_url, tmp_path):
    checkpoint = tmp_path / "cp"
    ctx = ctx_for(spark, tmp_path, catalog_url=db_url, job_id="job-sql")

    def run() -> int:
        df = datagen_stream(spark, total=1500, max_rows_per_batch=500)
        # No key columns: plain inserts, so only the commit marker prevents double writes.
        q = ctx.sinks.sql_table(df, "events", output_mode="append").start(str(checkpoint))
        try:
            q.processAllAvailable()
            return q.lastProgress["batchId"]
        finally:
            q.stop()

    run()
    rerun = rerun_last_batch(checkpoint)
    assert run() == rerun
    engine = make_engine(db_url)
    with engine.connect() as conn:
        n, distinct = conn.execute(sa.text("select count(*), count(distinct i) from events")).one()
        commits = (
            conn.execute(
                sa.text(
                    "select batch_id from _headrace_sink_commits where sink_id = 'job-sql:events' order by batch_id"
                )
            )
            .scalars()
            .all()
        )
    engine.dispose()
    assert (n, distinct) == (1500, 1500)
    assert commits == list(range(rerun + 1))

    # The source reads the table back with its types.
    back = ctx.sources.sql_table("events").orderBy("i").collect()
    assert [row.asDict() for row in back[:3]] == [
        {**e, "event_time": e["event_time"].replace(tzinfo=None)} for e in generate_events(3, 0, 3)
    ]
    assert len(back) == 1500


def test_sql_sink_batch_upserts_flattened_windows(spark, db_url, tmp_path):
    from pyspark.sql import functions as F

    ctx = ctx_for(spark, tmp_path, catalog_url=db_url)
    clicks = ctx.sources.datagen(seed=4, total=2000, streaming=False)
    counts = clicks.groupBy(F.window("event_time", "1 minute"), "url").count()
    handle = ctx.sinks.sql_table(counts, "per_minute", key_columns=["window_start", "window_end", "url"])
    assert isinstance(handle, SinkHandle) and not handle.streaming
    handle.run()
    # Same job (e.g. a retried attempt): the batch marker turns the second write into a no-op.
    ctx.sinks.sql_table(counts, "per_minute", key_columns=["window_start", "window_end", "url"]).run()

    expected = Counter(
        (e["event_time"].replace(second=0, microsecond=0, tzinfo=None), e["url"]) for e in generate_events(4, 0, 2000)
    )
    engine = make_engine(db_url)
    with engine.connect() as conn:
        rows = conn.execute(sa.text("select window_start, window_end, url, count from per_minute")).all()
    engine.dispose()
    got = {(_dt(ws), url): c for ws, we, url, c in rows}
    assert got == dict(expected)


def _dt(v):
    from datetime import datetime

    return v if isinstance(v, datetime) else datetime.fromisoformat(v)


def test_sql_sink_skip_path_is_a_noop(db_url):
    from pyspark.sql import types as T

    schema = T.StructType([T.StructField("k", T.LongType()), T.StructField("v", T.StringType())])
    sink = SqlTableSink(db_url, "kv", sink_id="s1", key_columns=["k"])
    data = pa.table({"k": [1, 2], "v": ["a", "b"]})
    assert sink.write_arrow(data, 7, schema) is True
    assert sink.write_arrow(pa.table({"k": [1, 3], "v": ["z", "c"]}), 7, schema) is False
    assert sink.write_arrow(pa.table({"k": [1, 3], "v": ["z", "c"]}), 8, schema) is True
    with sink.engine.connect() as conn:
        assert sorted(conn.execute(sa.text("select k, v from kv")).all()) == [(1, "z"), (2, "b"), (3, "c")]
    sink.close()


# ---------------------------------------------------------------- files and the batch example


def test_parquet_sink_batch_and_streaming(spark, tmp_path):
    ctx = ctx_for(spark, tmp_path)
    ctx.sinks.files(ctx.sources.datagen(seed=5, total=1200, streaming=False), str(tmp_path / "batch")).run()
    table = pq.read_table(tmp_path / "batch")
    assert sorted(table.column("i").to_pylist()) == list(range(1200))

    handle = ctx.sinks.files(datagen_stream(spark, total=900, max_rows_per_batch=300), str(tmp_path / "stream"))
    q = handle.start(str(tmp_path / "cp-files"))
    try:
        q.processAllAvailable()
    finally:
        q.stop()
    # Committed files are the only data files (bookkeeping lives under `_headrace/`, which
    # readers skip), so Spark and plain pyarrow read the same rows.
    rows = spark.read.parquet(str(tmp_path / "stream")).select("i").collect()
    assert sorted(r.i for r in rows) == list(range(900))
    assert sorted(pq.read_table(tmp_path / "stream").column("i").to_pylist()) == list(range(900))
    assert not (tmp_path / "stream" / "_spark_metadata").exists()


def test_batch_sql_to_parquet_example_seeds_and_aggregates(spark, sqlite_url, tmp_path):
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "examples" / "batch_sql_to_parquet.py"
    spec = importlib.util.spec_from_file_location("batch_sql_to_parquet", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = tmp_path / "daily"
    ctx = ctx_for(
        spark, tmp_path, catalog_url=sqlite_url, args=["--seed-events", "1500", "--seed", "9", "--output", str(out)]
    )
    module.build(ctx).run()
    got = {(r["day"], r["url"]): r["clicks"] for r in pq.read_table(out).to_pylist()}
    events = generate_events(9, 0, 1500)
    assert got == dict(Counter((e["event_time"].date(), e["url"]) for e in events))


# ---------------------------------------------------------------- pipeline artifacts


def test_zip_pipeline_is_importable_on_workers(spark, tmp_path):
    import zipfile

    from services.taskmanager.runtime.pipeline_loader import load_pipeline

    artifact = tmp_path / "pipeline.zip"
    with zipfile.ZipFile(artifact, "w") as z:
        z.writestr(
            "zpipe/__init__.py",
            (
                "from pyspark.sql import functions as F\n"
                "from .helpers import double\n"
                "def build(ctx):\n"
                "    df = ctx.spark.range(10).select(F.udf(double, 'long')('id').alias('x'))\n"
                "    return ctx.sinks.console(df)\n"
            ),
        )
        z.writestr("zpipe/helpers.py", "def double(x):\n    return 2 * x\n")
    module = load_pipeline(str(artifact), {}, spark)
    assert module.__name__ == "zpipe"
    handle = module.build(ctx_for(spark, tmp_path))
    # The UDF lives in the zip: Python workers must import it from the shipped file.
    assert sorted(r.x for r in handle.df.collect()) == [2 * i for i in range(10)]

    two = tmp_path / "two.zip"
    with zipfile.ZipFile(two, "w") as z:
        z.writestr("a.py", "def build(ctx):\n    return 'a'\n")
        z.writestr("b/__init__.py", "def build(ctx):\n    return 'b'\n")
    with pytest.raises(ValueError, match="module"):
        load_pipeline(str(two), {}, spark)
    assert load_pipeline(str(two), {"module": "b"}, spark).build(None) == "b"


# ---------------------------------------------------------------- the driver's warm-up


def test_the_warm_up_runs_to_its_end_when_no_task_waits(spark, tmp_path):
    from services.taskmanager.runtime.warm_up import warm_up

    assert warm_up(spark, tmp_path / "w1", 2) is True
    assert spark.streams.active == []


def test_the_warm_up_query_runs_the_micro_batches_asked_for(spark, tmp_path):
    from services.taskmanager.runtime.warm_up import warm_up

    assert warm_up(spark, tmp_path / "w3", 2, batches=5) is True
    commits = tmp_path / "w3" / "warmup-checkpoint" / "commits"
    assert sorted(int(f.name) for f in commits.iterdir() if f.name.isdigit())[:5] == [0, 1, 2, 3, 4]
    assert spark.streams.active == []


def test_the_driver_warm_up_of_a_cluster_driver_runs_no_spark_job(spark):
    """A driver of a Spark cluster warms in reserve without taking executors: no job runs, and a
    task waiting for the driver ends the warm-up between its steps."""
    from services.taskmanager.runtime.warm_up import warm_up_driver

    tracker = spark.sparkContext.statusTracker()
    jobs_before = set(tracker.getJobIdsForGroup(None))
    assert warm_up_driver(spark, 2) is True
    assert set(tracker.getJobIdsForGroup(None)) == jobs_before
    assert spark.streams.active == []
    assert warm_up_driver(spark, 2, cut_short=lambda: True) is False


def test_a_waiting_task_stops_the_warm_up_query_and_the_session_still_serves(spark, tmp_path):
    """cut_short is looked at between the warm-up's steps, during its shuffle job and in its
    streaming query's wait; a task arriving while the query runs stops the query, as a task taken
    mid-warm-up does: the warm-up returns at once and the query stops beside the task's."""
    from services.taskmanager.runtime.warm_up import warm_up

    looks = []

    def task_waits() -> bool:
        looks.append(spark.streams.active)
        return bool(looks[-1])  # the task arrives once the warm-up's query runs

    assert warm_up(spark, tmp_path / "w2", 2, cut_short=task_waits) is False
    assert looks[-1] and not any(looks[:-1]), "only the last look is while the warm-up's query runs"
    wait_for("the cut warm-up query stopped", lambda: spark.streams.active, 60, until=lambda active: active == [])
    # The task that waited runs on the same session: a streaming count over every event.
    q = (
        datagen_stream(spark, total=200)
        .groupBy("url")
        .count()
        .writeStream.format("memory")
        .queryName("after_warm_up")
        .outputMode("complete")
        .trigger(availableNow=True)
        .option("checkpointLocation", str(tmp_path / "task-cp"))
        .start()
    )
    assert q.awaitTermination(120), "the query after the cut warm-up did not finish within 120 s"
    assert sum(r["count"] for r in spark.sql("select * from after_warm_up").collect()) == 200
