"""Sinks across task attempts: a restarted attempt rewinds the sink to the batch its snapshot
holds and re-runs the rest with other batch boundaries; an older attempt that wakes up (a
zombie) is refused whatever batch id it writes. Real Spark, SQLite, PostgreSQL, redis-server.

The scenario of each sink: attempt 0 commits batches 0..5; attempt 1 restores the snapshot at
batch 2 (r = 2) and commits batches 3..6 with different contents; the output must equal the
lineage "0..2 of attempt 0, then 3..6 of attempt 1". Then attempt 0 writes again: refused, and
nothing changes. Most tests call the sink's foreachBatch function with explicit batch ids (what
Spark does); two run real streaming queries, driven by a Redis stream, to show the attempt
reaches the place where Spark commits.
"""

from __future__ import annotations

import fcntl
import json
import shutil
import sqlite3
import threading
import time
import uuid
from pathlib import Path

import pyarrow.dataset as pads
import pytest
import redis
import sqlalchemy as sa
from pyspark.errors import StreamingQueryException

from services.taskmanager.runtime.connectors import SinkFencedError
from services.taskmanager.runtime.connectors.datagen import generate_batch
from services.taskmanager.runtime.connectors.files import FileSink, file_sink
from services.taskmanager.runtime.connectors.redis_stream_entries import pack_events, unpack_entry
from services.taskmanager.runtime.connectors.redis_streams import (
    batches_key,
    commit_entries,
    committed_key,
    fence_key,
    prepare_sink,
    redis_stream_sink,
)
from services.taskmanager.runtime.connectors.sql import SqlTableSink
from services.taskmanager.runtime.connectors.sql_engine import make_engine
from services.taskmanager.runtime.connectors.sql_source import read_table
from services.taskmanager.runtime.spark_session import build_spark

KV = "k string, v long, src string"

# Events (key, value). Attempt 0 cuts them into batches 0..5 of two events; attempt 1, restored
# after batch 2 (events 0..5), cuts the rest differently and reads two more events.
EVENTS = [
    ("a", 1),
    ("b", 2),
    ("a", 3),
    ("c", 4),
    ("b", 5),
    ("d", 6),
    ("a", 7),
    ("e", 8),
    ("c", 9),
    ("f", 10),
    ("b", 11),
    ("g", 12),
    ("h", 13),
    ("a", 14),
]
LINEAGE_0 = {b: (2 * b, 2 * b + 2) for b in range(6)}
LINEAGE_1 = {3: (6, 7), 4: (7, 10), 5: (10, 12), 6: (12, 14)}


@pytest.fixture(scope="module")
def spark(tmp_path_factory):
    session = build_spark(1, tmp_path_factory.mktemp("spark"), shuffle_partitions=1)
    yield session
    session.stop()


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request) -> str:
    return request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "pg_url")


def running_totals(attempt: int, batch: int, lo: int, hi: int) -> list[tuple[str, int, str]]:
    """What an update-mode `sum(v) group by k` emits for events [lo, hi): the touched keys
    with their totals so far, tagged with the attempt and batch that wrote them."""
    totals: dict[str, int] = {}
    for k, v in EVENTS[:hi]:
        totals[k] = totals.get(k, 0) + v
    touched = {k for k, _ in EVENTS[lo:hi]}
    return [(k, totals[k], f"a{attempt}b{batch}") for k in sorted(touched)]


def raw_events(attempt: int, batch: int, lo: int, hi: int) -> list[tuple[str, int, str]]:
    """What an append-mode query of the events emits for [lo, hi)."""
    return [(k, v, f"a{attempt}b{batch}") for k, v in EVENTS[lo:hi]]


def expected_upserts(emit) -> dict[str, tuple[int, str]]:
    """The table after upserting by k the lineage 0..2 of attempt 0, then 3..6 of attempt 1."""
    table: dict[str, tuple[int, str]] = {}
    for attempt, lineage, batches in ((0, LINEAGE_0, range(3)), (1, LINEAGE_1, range(3, 7))):
        for b in batches:
            for k, v, src in emit(attempt, b, *lineage[b]):
                table[k] = (v, src)
    return table


def expected_appends(emit) -> list[tuple[str, int, str]]:
    rows = [r for b in range(3) for r in emit(0, b, *LINEAGE_0[b])]
    rows += [r for b in range(3, 7) for r in emit(1, b, *LINEAGE_1[b])]
    return sorted(rows)


def frame(spark, rows):
    return spark.createDataFrame(rows, KV)


def table_rows(url: str, table: str) -> list[tuple]:
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            return sorted(tuple(r) for r in conn.execute(sa.text(f"select k, v, src from {table}")))
    finally:
        engine.dispose()


def sql_scalars(url: str, sql: str) -> list:
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            return list(conn.execute(sa.text(sql)).all())
    finally:
        engine.dispose()


# ---------------------------------------------------------------- sql


def run_two_attempts(spark, make_sink, emit):
    """Attempt 0 commits 0..5; attempt 1 restores at 2 and commits 3..6. Returns both sinks."""
    old = make_sink()
    old.prepare(0, -1)
    for b, (lo, hi) in LINEAGE_0.items():
        assert old.write_batch(frame(spark, emit(0, b, lo, hi)), b) is True
    new = make_sink()
    new.prepare(1, 2)
    for b, (lo, hi) in LINEAGE_1.items():
        assert new.write_batch(frame(spark, emit(1, b, lo, hi)), b) is True
    return old, new


def prepare_at_barrier(prepare, attempt: int, barrier: threading.Barrier, outcome: dict[int, object]) -> None:
    barrier.wait()
    try:
        prepare(attempt)
        outcome[attempt] = "prepared"
    except SinkFencedError as e:
        outcome[attempt] = e


def test_sql_upsert_sink_rewinds_to_the_snapshot_and_fences_the_old_attempt(spark, db_url):
    def make():
        return SqlTableSink(db_url, "totals", sink_id="job-1:totals", key_columns=["k"])

    old, new = run_two_attempts(spark, make, running_totals)
    expected = sorted((k, v, src) for k, (v, src) in expected_upserts(running_totals).items())
    assert table_rows(db_url, "totals") == expected
    # Keys a discarded batch touched were overwritten by the new lineage, none kept its tag.
    assert not [r for r in expected if r[2] in ("a0b3", "a0b4", "a0b5")]
    assert sql_scalars(
        db_url, "select attempt, restored_batch_id from _headrace_sink_fences where sink_id = 'job-1:totals'"
    ) == [(1, 2)]

    # The zombie: refused at its next batch, at a batch id the new attempt also wrote, and at
    # one it had written itself; nothing changes.
    markers = sql_scalars(db_url, "select batch_id, num_rows from _headrace_sink_commits order by batch_id")
    for batch in (7, 4, 2):
        with pytest.raises(SinkFencedError, match=r"attempt 0 is fenced off.*held by attempt 1"):
            old.write_batch(frame(spark, [("a", 999, f"a0b{batch}"), ("z", 1, f"a0b{batch}")]), batch)
    with pytest.raises(SinkFencedError):  # the commit itself checks, not only the pre-check
        old.write_arrow(frame(spark, [("z", 1, "x")]).toArrow(), 8, frame(spark, []).schema)
    assert table_rows(db_url, "totals") == expected
    assert sql_scalars(db_url, "select batch_id, num_rows from _headrace_sink_commits order by batch_id") == markers
    # A re-run of a batch within the new attempt is still skipped.
    assert new.write_batch(frame(spark, [("a", 999, "rerun")]), 6) is False
    assert table_rows(db_url, "totals") == expected
    # The zombie cannot take the sink back either.
    with pytest.raises(SinkFencedError):
        make().prepare(0, 5)
    old.close()
    new.close()


def test_sql_keyless_sink_deletes_the_rows_of_discarded_batches(spark, db_url):
    def make():
        return SqlTableSink(db_url, "events", sink_id="job-1:events")

    # Another job appends to the same table: the rewind must not touch its rows.
    other = SqlTableSink(db_url, "events", sink_id="job-0:events")
    other.prepare(0, -1)
    for b in range(5):
        other.write_batch(frame(spark, [("x", b, f"job0b{b}")]), b)

    old, new = run_two_attempts(spark, make, raw_events)
    theirs = [("x", b, f"job0b{b}") for b in range(5)]
    expected = sorted(expected_appends(raw_events) + theirs)
    assert table_rows(db_url, "events") == expected
    with pytest.raises(SinkFencedError):
        old.write_batch(frame(spark, raw_events(0, 6, 12, 14)), 6)
    assert new.write_batch(frame(spark, raw_events(1, 6, 12, 14)), 6) is False
    assert table_rows(db_url, "events") == expected
    # The bookkeeping columns stay out of what Headrace's SQL source reads.
    assert read_table(db_url, "events").column_names == ["k", "v", "src"]
    for sink in (old, new, other):
        sink.close()


def test_sql_keyless_table_without_bookkeeping_columns_is_not_rewound_silently(spark, db_url):
    engine = make_engine(db_url)
    with engine.begin() as conn:
        conn.execute(sa.text("create table legacy (k text, v bigint, src text)"))
    engine.dispose()
    old = SqlTableSink(db_url, "legacy", sink_id="job-1:legacy")
    old.prepare(0, -1)
    for b in range(4):
        old.write_batch(frame(spark, raw_events(0, b, *LINEAGE_0[b])), b)
    before = table_rows(db_url, "legacy")

    new = SqlTableSink(db_url, "legacy", sink_id="job-1:legacy")
    with pytest.raises(ValueError, match=r"batches 2\.\.3 .*no key columns.*ALTER TABLE legacy"):
        new.prepare(1, 1)
    # Refused as a whole: the old attempt still holds the sink and nothing was deleted.
    assert table_rows(db_url, "legacy") == before
    assert old.write_batch(frame(spark, raw_events(0, 4, *LINEAGE_0[4])), 4) is True
    # Nothing to undo (restored at the last committed batch): the takeover is fine.
    new.prepare(1, 4)
    assert new.write_batch(frame(spark, raw_events(1, 5, 10, 14)), 5) is True
    with pytest.raises(SinkFencedError):
        old.write_batch(frame(spark, raw_events(0, 5, 10, 12)), 5)
    old.close()
    new.close()


def test_unprepared_sql_sink_does_not_fence(spark, sqlite_url):
    """Batch jobs and tools never call prepare: they are idempotent per batch id, as before."""
    prepared = SqlTableSink(sqlite_url, "kv", sink_id="s", key_columns=["k"])
    prepared.prepare(3, -1)
    plain = SqlTableSink(sqlite_url, "kv", sink_id="s", key_columns=["k"])
    assert plain.write_batch(frame(spark, [("a", 1, "plain")]), 0) is True
    assert plain.write_batch(frame(spark, [("a", 2, "plain")]), 0) is False
    assert table_rows(sqlite_url, "kv") == [("a", 1, "plain")]
    prepared.close()
    plain.close()


RACES = ((1, 2), (3, 4), (5, 6))  # each race has one order that a missing lock gets wrong


def race_prepares(prepare, hold_lock) -> None:
    """Per race, two attempts prepare at the same moment while `hold_lock` keeps the sink
    locked, so both are inside prepare when it is released; the higher one must end up holding
    the sink. The lower one either came first (and was then replaced) or found the higher one
    in place; either way its sink then refuses to write (checked by the callers)."""
    for low, high in RACES:
        outcome: dict[int, object] = {}
        barrier = threading.Barrier(3)

        threads = [
            threading.Thread(target=prepare_at_barrier, args=(prepare, a, barrier, outcome)) for a in (low, high)
        ]
        with hold_lock():
            for t in threads:
                t.start()
            barrier.wait()
            time.sleep(0.3)
            assert not outcome, "prepare did not wait for the lock"
        for t in threads:
            t.join(30)
        assert outcome[high] == "prepared"
        assert outcome[low] == "prepared" or (
            isinstance(outcome[low], SinkFencedError) and outcome[low].newer == high
        ), outcome


def test_concurrent_prepares_leave_the_higher_attempt_holding_the_sql_sink(spark, db_url):
    make = lambda: SqlTableSink(db_url, "race", sink_id="job-1:race", key_columns=["k"])  # noqa: E731
    first = make()
    first.prepare(0, -1)
    engine = make_engine(db_url)

    class hold_fence_row:
        def __enter__(self):
            if engine.dialect.name == "sqlite":
                self.conn = sqlite3.connect(db_url.removeprefix("sqlite:///"), isolation_level=None)
                self.conn.execute("BEGIN IMMEDIATE")
            else:
                self.conn = engine.connect()
                self.conn.execute(
                    sa.text("select attempt from _headrace_sink_fences where sink_id = 'job-1:race' for update")
                )

        def __exit__(self, *exc):
            if engine.dialect.name == "sqlite":
                self.conn.execute("COMMIT")
            else:
                self.conn.commit()
            self.conn.close()

    sinks = {a: make() for low_high in RACES for a in low_high}
    race_prepares(lambda a: sinks[a].prepare(a, 0), hold_fence_row)
    assert sql_scalars(db_url, "select attempt from _headrace_sink_fences") == [(6,)]
    with pytest.raises(SinkFencedError):
        sinks[5].write_batch(frame(spark, [("a", 1, "a5")]), 1)
    assert sinks[6].write_batch(frame(spark, [("a", 2, "a6")]), 1) is True
    engine.dispose()
    for s in (first, *sinks.values()):
        s.close()


# ---------------------------------------------------------------- files


def listing(path: Path) -> dict[str, float]:
    return {str(p.relative_to(path)): p.stat().st_mtime_ns for p in path.rglob("*")}


def test_file_sink_rewinds_to_the_snapshot_and_fences_the_old_attempt(spark, tmp_path):
    out = tmp_path / "out"

    def make():
        return FileSink(str(out), format="parquet", partition_by=["k"])

    old, new = run_two_attempts(spark, make, raw_events)
    expected = expected_appends(raw_events)
    # A staged but never committed batch holds a readable parquet file under _headrace/.
    (out / "_headrace" / "staging" / "a9-b9-x").mkdir()
    spark.createDataFrame([("zz", 0, "staged")], KV).write.parquet(str(out / "_headrace" / "staging" / "a9-b9-x" / "d"))

    def spark_rows():
        return sorted((r.k, r.v, r.src) for r in spark.read.parquet(str(out)).collect())

    def arrow_rows():
        t = pads.dataset(str(out), format="parquet", partitioning="hive").to_table()
        return sorted(
            zip(t.column("k").to_pylist(), t.column("v").to_pylist(), t.column("src").to_pylist(), strict=True)
        )

    assert spark_rows() == expected
    assert arrow_rows() == expected
    names = sorted(p.name.split("-part-")[0] for p in out.rglob("*.parquet") if "_headrace" not in p.parts)
    assert set(names) == {"b0-a0", "b1-a0", "b2-a0", "b3-a1", "b4-a1", "b5-a1", "b6-a1"}

    before = listing(out)
    for batch in (7, 4, 2):
        with pytest.raises(SinkFencedError, match=r"attempt 0 is fenced off.*held by attempt 1"):
            old.write_batch(frame(spark, [("a", 999, "zombie")]), batch)
    assert new.write_batch(frame(spark, [("a", 999, "rerun")]), 6) is False
    assert listing(out) == before
    assert spark_rows() == expected
    with pytest.raises(SinkFencedError):
        make().prepare(0, 5)

    # A commit that died between moving its files and writing its marker left files no marker
    # claims; the next prepare removes them, and the staging area, and keeps batches <= r.
    leftover = out / "k=a" / "b7-a1-part-00000-dead.snappy.parquet"
    shutil.copy(next((out / "k=a").glob("b6-a1-*.parquet")), leftover)
    make().prepare(2, 6)
    assert not leftover.exists()
    assert list((out / "_headrace" / "staging").iterdir()) == []
    assert spark_rows() == expected


def test_file_sink_csv_unprepared_writes_and_empty_batches(spark, tmp_path):
    out = tmp_path / "csv"
    sink = FileSink(str(out), format="csv", options={"header": "true"})
    assert sink.write_batch(frame(spark, [("a", 1, "x"), ("b", 2, "x")]), 0) is True
    assert sink.write_batch(frame(spark, [("a", 1, "again")]), 0) is False
    rows = spark.read.options(header="true").schema(KV).csv(str(out)).collect()
    assert sorted((r.k, r.v, r.src) for r in rows) == [("a", 1, "x"), ("b", 2, "x")]
    # An empty batch (e.g. one that only advanced the watermark) commits without adding a file.
    for fmt, d in (("csv", out), ("parquet", tmp_path / "pq")):
        empty = FileSink(str(d), format=fmt, options={"header": "true"} if fmt == "csv" else {})
        assert empty.write_batch(frame(spark, []), 1) is True
        assert json.loads((d / "_headrace" / "commits" / "1.json").read_text())["files"] == []
        assert not list(d.glob("b1-*"))


def test_file_sink_refuses_a_directory_of_sparks_own_file_sink(spark, tmp_path):
    out = tmp_path / "old"
    (out / "_spark_metadata").mkdir(parents=True)
    with pytest.raises(ValueError, match="_spark_metadata"):
        FileSink(str(out)).prepare(0, -1)


def test_concurrent_prepares_leave_the_higher_attempt_holding_the_file_sink(spark, tmp_path):
    out = tmp_path / "race"
    FileSink(str(out)).prepare(0, -1)
    sinks = {a: FileSink(str(out)) for low_high in RACES for a in low_high}

    class hold_lock:
        def __enter__(self):
            self.f = open(out / "_headrace" / "lock", "a+")
            fcntl.flock(self.f, fcntl.LOCK_EX)

        def __exit__(self, *exc):
            fcntl.flock(self.f, fcntl.LOCK_UN)
            self.f.close()

    race_prepares(lambda a: sinks[a].prepare(a, 0), hold_lock)
    assert json.loads((out / "_headrace" / "fence.json").read_text()) == {"attempt": 6, "restored_batch_id": 0}
    with pytest.raises(SinkFencedError):
        sinks[5].write_batch(frame(spark, [("a", 1, "a5")]), 1)
    assert sinks[6].write_batch(frame(spark, [("a", 2, "a6")]), 1) is True


# ---------------------------------------------------------------- redis streams


def entries_by_batch(r: redis.Redis, stream: str) -> list[tuple[str, int, str]]:
    rows = []
    for _, fields in r.xrange(stream):
        t = unpack_entry(fields)
        rows += list(
            zip(t.column("k").to_pylist(), t.column("v").to_pylist(), t.column("src").to_pylist(), strict=True)
        )
    return sorted(rows)


def packed(rows) -> bytes:
    return pack_events([{"k": k, "v": v, "src": s} for k, v, s in rows])


def test_redis_sink_rewinds_to_the_snapshot_and_fences_the_old_attempt(redis_url):
    r = redis.Redis.from_url(redis_url)
    sink = "job-1:out"
    prepare_sink(r, "out", sink_id=sink, attempt=0, restored_batch_id=-1)
    for b, (lo, hi) in LINEAGE_0.items():
        rows = raw_events(0, b, lo, hi)
        # One entry per event: a batch of several entries must be deleted whole.
        assert commit_entries(r, "out", [packed([row]) for row in rows], sink_id=sink, batch_id=b, attempt=0)
        r.xadd("out", {"arrow": packed([("outsider", b, "producer")])})  # another producer
    assert prepare_sink(r, "out", sink_id=sink, attempt=1, restored_batch_id=2) == 6
    assert int(r.get(committed_key(sink))) == 2
    for b, (lo, hi) in LINEAGE_1.items():
        assert commit_entries(r, "out", [packed(raw_events(1, b, lo, hi))], sink_id=sink, batch_id=b, attempt=1)
    outsiders = [("outsider", b, "producer") for b in range(6)]
    expected = sorted(expected_appends(raw_events) + outsiders)
    assert entries_by_batch(r, "out") == expected

    length = r.xlen("out")
    for batch in (7, 4, 2):
        with pytest.raises(SinkFencedError, match=r"attempt 0 is fenced off.*held by attempt 1"):
            commit_entries(r, "out", [packed([("a", 999, "zombie")])], sink_id=sink, batch_id=batch, attempt=0)
    assert commit_entries(r, "out", [packed([("a", 999, "rerun")])], sink_id=sink, batch_id=6, attempt=1) is False
    assert r.xlen("out") == length and int(r.get(committed_key(sink))) == 6
    with pytest.raises(SinkFencedError):
        prepare_sink(r, "out", sink_id=sink, attempt=0, restored_batch_id=6)
    assert int(r.get(fence_key(sink))) == 1

    # A fresh start (no completed snapshot) undoes every batch of the sink.
    prepare_sink(r, "out", sink_id=sink, attempt=2, restored_batch_id=-1)
    assert entries_by_batch(r, "out") == sorted(outsiders)
    assert r.get(committed_key(sink)) is None and r.hlen(batches_key(sink)) == 0


def test_redis_sink_refuses_to_rewind_batches_it_has_no_record_of(redis_url):
    r = redis.Redis.from_url(redis_url)
    r.xadd("out", {"arrow": packed([("a", 1, "old")])})
    r.set(committed_key("job-1:out"), 4)  # written by a version that kept no batch records
    with pytest.raises(RuntimeError, match=r"batch 3 .*not recorded"):
        prepare_sink(r, "out", sink_id="job-1:out", attempt=1, restored_batch_id=2)
    assert r.get(fence_key("job-1:out")) is None and r.xlen("out") == 1
    prepare_sink(r, "out", sink_id="job-1:out", attempt=1, restored_batch_id=4)
    assert int(r.get(fence_key("job-1:out"))) == 1


def test_concurrent_prepares_leave_the_higher_attempt_holding_the_redis_sink(redis_url):
    r = redis.Redis.from_url(redis_url)
    prepare_sink(r, "out", sink_id="s", attempt=0, restored_batch_id=-1)
    commit_entries(r, "out", [packed([("a", 1, "a0")])], sink_id="s", batch_id=0, attempt=0)

    class pause_writes:
        def __enter__(self):
            r.client_pause(5000, all=False)  # WRITE mode: scripts wait too

        def __exit__(self, *exc):
            r.client_unpause()

    def prepare(attempt):
        with redis.Redis.from_url(redis_url) as client:
            prepare_sink(client, "out", sink_id="s", attempt=attempt, restored_batch_id=0)

    race_prepares(prepare, pause_writes)
    assert int(r.get(fence_key("s"))) == 6
    with pytest.raises(SinkFencedError):
        commit_entries(r, "out", [packed([("a", 1, "a5")])], sink_id="s", batch_id=1, attempt=5)
    assert commit_entries(r, "out", [packed([("a", 2, "a6")])], sink_id="s", batch_id=1, attempt=6)


# ---------------------------------------------------------------- real streaming queries


def xadd_events(r: redis.Redis, lo: int, hi: int) -> None:
    """One entry of 100 generated events per hundred."""
    for start in range(lo, hi, 100):
        r.xadd("in", {"arrow": pack_events(generate_batch(7, start, start + 100))})


def source(spark, redis_url, per_trigger: int):
    return (
        spark.readStream.format("redis_stream")
        .schema("i long, user_id string, url string, event_time timestamp")
        .option("url", redis_url)
        .option("stream", "in")
        .option("max_entries_per_trigger", str(per_trigger))
        .option("partitions", "1")
        .load()
    )


def failover(spark, redis_url, tmp_path, make_handle, read_back):
    """Attempt 0 commits batches 0..2, its checkpoint is snapshotted (r = 2), it commits 3..5
    and freezes; attempt 1 starts from the snapshot with other batch boundaries; then attempt 0
    wakes up. Returns the zombie's failure."""
    r = redis.Redis.from_url(redis_url)
    cp0, cp1 = tmp_path / "cp0", tmp_path / "cp1"
    old = make_handle(source(spark, redis_url, 1))
    old.prepare(0, -1)
    q0 = old.start(str(cp0))
    try:
        xadd_events(r, 0, 300)
        q0.processAllAvailable()
        assert q0.lastProgress["batchId"] == 2
        shutil.copytree(cp0, cp1)  # the completed checkpoint at batch 2
        # The attempts share a SparkSession here, not so in production: give the copy its own
        # query id, or Spark would stop the old run when the new one starts.
        (cp1 / "metadata").write_text(json.dumps({"id": str(uuid.uuid4())}))
        # Its checksum would no longer match; a restored snapshot carries none either.
        (cp1 / ".metadata.crc").unlink(missing_ok=True)
        xadd_events(r, 300, 600)
        q0.processAllAvailable()
        assert q0.lastProgress["batchId"] == 5
        assert sorted(read_back()) == list(range(600))

        new = make_handle(source(spark, redis_url, 2))
        new.prepare(1, 2)
        q1 = new.start(str(cp1))
        try:
            q1.processAllAvailable()  # entries 3..5 as batches 3 (two entries) and 4 (one)
            assert q1.lastProgress["batchId"] == 4
            xadd_events(r, 600, 700)
            q1.processAllAvailable()
            with pytest.raises(StreamingQueryException) as zombie:  # fails at its batch 6
                q0.awaitTermination(60)
            assert sorted(read_back()) == list(range(700))
        finally:
            q1.stop()
        return zombie.value
    finally:
        q0.stop()


def test_file_sink_streaming_failover_is_exactly_once(spark, redis_url, tmp_path):
    out = tmp_path / "out"

    def read_back():
        if not any(out.glob("*.parquet")):
            return []
        return [row.i for row in spark.read.parquet(str(out)).select("i").collect()]

    error = failover(spark, redis_url, tmp_path, lambda df: file_sink(df, str(out)), read_back)
    assert "SinkFencedError" in str(error) and "attempt 0 is fenced off" in str(error)
    batches = {p.name.split("-part-")[0] for p in out.glob("*.parquet")}
    assert batches == {"b0-a0", "b1-a0", "b2-a0", "b3-a1", "b4-a1", "b5-a1"}


def test_redis_sink_streaming_failover_is_exactly_once(spark, redis_url, tmp_path):
    r = redis.Redis.from_url(redis_url)

    def read_back():
        return [i for _, f in r.xrange("out") for i in unpack_entry(f).column("i").to_pylist()]

    error = failover(
        spark, redis_url, tmp_path, lambda df: redis_stream_sink(df, redis_url, "out", sink_id="job-1:out"), read_back
    )
    # Raised in the Python worker that runs the data source's commit: the attempt got there.
    assert "SinkFencedError" in str(error) and "attempt 0 is fenced off" in str(error)
    assert int(r.get(committed_key("job-1:out"))) == 5
