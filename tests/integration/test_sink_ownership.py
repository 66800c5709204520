"""Sinks fenced by lineage (issue 21, finding 6), driven as the runner drives them: a prepare
with the attempt's fence token, the batch it restored and its owner (lineage, job), then the
foreachBatch/commit calls Spark makes. Real Spark, PostgreSQL, SQLite and redis-server.

The reproduction: job X commits 20 batches into a target; a fresh job Y (a lineage of its own,
a higher fence token, restored batch -1) used to take the target over and undo all 20. Now Y
is refused with an error naming X's lineage and job, and nothing of X's output changes; X
itself goes on writing (no tug-of-war). A restore in X's own lineage still rewinds, and only
its own batches.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import redis
import sqlalchemy as sa

from services.taskmanager.runtime.connectors import SinkFencedError, SinkOwnedError, SinkOwner
from services.taskmanager.runtime.connectors.files import FileSink, file_sink
from services.taskmanager.runtime.connectors.redis_stream_entries import pack_events, unpack_entry
from services.taskmanager.runtime.connectors.redis_streams import (
    commit_entries,
    committed_key,
    fence_key,
    owner_key,
    prepare_sink,
)
from services.taskmanager.runtime.connectors.sql import SqlTableSink
from services.taskmanager.runtime.connectors.sql_engine import make_engine
from services.taskmanager.runtime.spark_session import build_spark

KV = "k string, v long, src string"
X = SinkOwner(lineage="job-x", job_id="job-x")
BATCHES = 20
ROWS_PER_BATCH = 3


@pytest.fixture(scope="module")
def spark(tmp_path_factory):
    session = build_spark(1, tmp_path_factory.mktemp("spark"), shuffle_partitions=1)
    yield session
    session.stop()


def rows(src: str, batch: int) -> list[tuple[str, int, str]]:
    return [(f"k{i}", batch, src) for i in range(ROWS_PER_BATCH)]


def frame(spark, data):
    return spark.createDataFrame(data, KV)


def fresh_jobs(n: int) -> list[SinkOwner]:
    """Jobs started without a snapshot: each is a lineage of its own."""
    return [SinkOwner(lineage=f"job-y{i}", job_id=f"job-y{i}") for i in range(n)]


# ---------------------------------------------------------------- files


def listing(path: Path) -> dict[str, tuple[int, int]]:
    """Every file under the directory with its size and mtime: any change shows."""
    return {str(p.relative_to(path)): (p.stat().st_size, p.stat().st_mtime_ns) for p in path.rglob("*") if p.is_file()}


def markers(out: Path) -> list[int]:
    return sorted(int(p.stem) for p in (out / "_headrace" / "commits").glob("*.json"))


def owner_of(out: Path, with_replaced: bool = False) -> dict:
    rec = json.loads((out / "_headrace" / "owner.json").read_text())
    return rec if with_replaced else {k: v for k, v in rec.items() if k != "replaced"}


def file_rows(spark, out: Path) -> list[tuple]:
    return sorted((r.k, r.v, r.src) for r in spark.read.parquet(str(out)).collect())


def write_x(spark, out: Path) -> FileSink:
    sink = FileSink(str(out))
    sink.prepare(3, -1, X)
    for b in range(BATCHES):
        assert sink.write_batch(frame(spark, rows("x", b)), b) is True
    return sink


@pytest.fixture(scope="module")
def x_dir(spark, tmp_path_factory) -> Path:
    """Job X's 20 committed batches, copied by each test that changes them."""
    out = tmp_path_factory.mktemp("x") / "out"
    write_x(spark, out)
    return out


def copy_of(x_dir: Path, tmp_path: Path) -> Path:
    out = tmp_path / "out"
    shutil.copytree(x_dir, out)
    return out


def test_fresh_jobs_on_a_directory_are_refused_and_the_owners_20_batches_stay(spark, x_dir, tmp_path):
    out = copy_of(x_dir, tmp_path)
    x = FileSink(str(out))
    x.prepare(4, 19, X)  # X's own restart, as after the copy: it holds the fence again
    before = listing(out)
    assert markers(out) == list(range(BATCHES))
    # Five jobs on the directory, each with a newer fence token than X, each restarted twice.
    attempt = 10
    for y in fresh_jobs(5):
        for _ in range(3):
            attempt += 1
            sink = FileSink(str(out))
            with pytest.raises(SinkOwnedError) as refused:
                sink.prepare(attempt, -1, y)
            text = str(refused.value)
            assert text.startswith(
                f"directory {out} is the sink of lineage job-x (job job-x); "
                f"job {y.job_id} (lineage {y.lineage}) may not write it"
            )
            assert "write this job to another directory" in text
            assert "savepoint or retained checkpoint of job job-x" in text
            assert f"rm -rf {out}" in text and "Nothing was written or deleted" in text
            with pytest.raises(SinkFencedError):  # its query could not write either
                sink.write_batch(frame(spark, rows(y.job_id, 0)), 0)
    assert listing(out) == before
    assert json.loads((out / "_headrace" / "fence.json").read_text()) == {"attempt": 4, "restored_batch_id": 19}
    assert owner_of(out) == X.record()
    expected = sorted(r for b in range(BATCHES) for r in rows("x", b))
    assert file_rows(spark, out) == expected
    # X is not fenced off by any of them: its next batch commits.
    assert x.write_batch(frame(spark, rows("x", BATCHES)), BATCHES) is True
    assert markers(out) == list(range(BATCHES + 1))
    assert len(file_rows(spark, out)) == (BATCHES + 1) * ROWS_PER_BATCH


def test_a_restore_in_the_owners_lineage_undoes_only_batches_after_its_snapshot(spark, x_dir, tmp_path):
    out = copy_of(x_dir, tmp_path)
    # Job X2 resumes from X's savepoint at batch 11: the same lineage, one generation on.
    x2 = SinkOwner(lineage="job-x", job_id="job-x2", generation=1)
    sink = FileSink(str(out))
    sink.prepare(7, 11, x2)
    assert markers(out) == list(range(12))
    assert file_rows(spark, out) == sorted(r for b in range(12) for r in rows("x", b))
    assert owner_of(out) == x2.record()
    for b in range(12, 15):
        assert sink.write_batch(frame(spark, rows("x2", b)), b) is True
    with pytest.raises(SinkOwnedError, match="replaced"):  # X, replaced by X2, stays out
        FileSink(str(out)).prepare(3, 19, X)
    # The lineage's latest job is the one a refusal names.
    with pytest.raises(SinkOwnedError, match=r"lineage job-x \(job job-x2\)"):
        FileSink(str(out)).prepare(20, -1, fresh_jobs(1)[0])
    expected = sorted([r for b in range(12) for r in rows("x", b)] + [r for b in range(12, 15) for r in rows("x2", b)])
    assert file_rows(spark, out) == expected
    assert markers(out) == list(range(15))


def test_a_replaced_job_of_the_lineage_cannot_take_the_directory_back(spark, x_dir, tmp_path):
    """Job X2 resumed from a savepoint of X while X still ran: X's later restart (a newer
    token) used to take the directory back and undo X2's batches, and X2's restart the same."""
    out = copy_of(x_dir, tmp_path)
    x2 = SinkOwner(lineage="job-x", job_id="job-x2", generation=1)
    sink = FileSink(str(out))
    sink.prepare(7, 11, x2)
    for b in range(12, 15):
        assert sink.write_batch(frame(spark, rows("x2", b)), b) is True
    before = listing(out)
    with pytest.raises(SinkOwnedError) as refused:
        FileSink(str(out)).prepare(8, 19, X)  # X restarts from its own latest checkpoint
    assert str(refused.value).startswith(
        f"directory {out} is the sink of lineage job-x, taken over by its newer job job-x2; "
        f"job job-x (lineage job-x) was replaced by that job"
    )
    assert listing(out) == before and markers(out) == list(range(15))
    assert sink.write_batch(frame(spark, rows("x2", 15)), 15) is True  # X2 is not fenced off
    # A rollback is a new job from an older savepoint of the lineage: it may take the directory.
    w = SinkOwner(lineage="job-x", job_id="job-w", generation=1)
    FileSink(str(out)).prepare(9, 5, w)
    assert markers(out) == list(range(6))
    assert owner_of(out, with_replaced=True) == w.record() | {"replaced": ["job-x", "job-x2"]}
    with pytest.raises(SinkOwnedError, match="taken over by its newer job job-w; job job-x2"):
        FileSink(str(out)).prepare(10, 15, x2)
    assert file_rows(spark, out) == sorted(r for b in range(6) for r in rows("x", b))


def test_a_batch_write_into_an_owned_directory_is_refused(spark, x_dir, tmp_path):
    out = copy_of(x_dir, tmp_path)
    before = listing(out)
    handle = file_sink(frame(spark, rows("batch", 0)), str(out), format="parquet", mode="overwrite")
    with pytest.raises(SinkOwnedError, match=r"is the sink of lineage job-x \(job job-x\); a batch write may not"):
        handle.run()
    assert listing(out) == before


def test_deleting_the_directory_releases_it(spark, x_dir, tmp_path):
    out = copy_of(x_dir, tmp_path)
    y = fresh_jobs(1)[0]
    with pytest.raises(SinkOwnedError):
        FileSink(str(out)).prepare(30, -1, y)
    shutil.rmtree(out)
    sink = FileSink(str(out))
    sink.prepare(31, -1, y)
    assert sink.write_batch(frame(spark, rows("y", 0)), 0) is True
    assert markers(out) == [0] and file_rows(spark, out) == rows("y", 0)
    assert owner_of(out) == y.record()


def test_a_directory_from_before_owners_is_adopted_by_a_restore_and_refused_to_a_fresh_start(spark, x_dir, tmp_path):
    out = copy_of(x_dir, tmp_path)
    (out / "_headrace" / "owner.json").unlink()  # as a Headrace without owners left it
    before = listing(out)
    with pytest.raises(SinkOwnedError, match="unknown lineage .*written before Headrace recorded sink owners"):
        FileSink(str(out)).prepare(40, -1, fresh_jobs(1)[0])
    assert listing(out) == before
    FileSink(str(out)).prepare(41, 17, X)
    assert markers(out) == list(range(18))
    assert owner_of(out) == X.record()


# ---------------------------------------------------------------- sql


def sql_rows(url: str, table: str) -> list[tuple]:
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            return sorted(tuple(r) for r in conn.execute(sa.text(f"select k, v, src from {table}")))
    finally:
        engine.dispose()


def sql_scalar(url: str, sql: str):
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            return conn.execute(sa.text(sql)).scalar()
    finally:
        engine.dispose()


@pytest.fixture(params=["postgresql", "sqlite"])
def db_url(request) -> str:
    return request.getfixturevalue("pg_url" if request.param == "postgresql" else "sqlite_url")


def test_a_fresh_job_reusing_a_sql_sink_id_is_refused_and_the_owners_rows_stay(spark, db_url):
    x = SqlTableSink(db_url, "events", sink_id="shared:events")
    x.prepare(3, -1, X)
    for b in range(BATCHES):
        assert x.write_batch(frame(spark, rows("x", b)), b) is True
    expected = sorted(r for b in range(BATCHES) for r in rows("x", b))
    for attempt, y in enumerate(fresh_jobs(3), start=4):
        sink = SqlTableSink(db_url, "events", sink_id="shared:events")
        with pytest.raises(SinkOwnedError) as refused:
            sink.prepare(attempt, -1, y)
        assert str(refused.value).startswith(
            f"SQL sink 'shared:events' (table events) is the sink of lineage job-x (job job-x); job {y.job_id}"
        )
        assert "DELETE FROM _headrace_sink_owners" in str(refused.value)
        with pytest.raises(SinkFencedError):
            sink.write_batch(frame(spark, rows(y.job_id, 0)), 0)
        sink.close()
    assert sql_rows(db_url, "events") == expected
    assert sql_scalar(db_url, "select count(*) from _headrace_sink_commits where sink_id = 'shared:events'") == BATCHES
    assert sql_scalar(db_url, "select attempt from _headrace_sink_fences where sink_id = 'shared:events'") == 3
    assert sql_scalar(db_url, "select job_id from _headrace_sink_owners where sink_id = 'shared:events'") == "job-x"
    assert x.write_batch(frame(spark, rows("x", BATCHES)), BATCHES) is True
    x.close()


def test_a_replaced_job_cannot_take_a_sql_sink_back(spark, db_url):
    x = SqlTableSink(db_url, "events", sink_id="job-x:events")
    x.prepare(3, -1, X)
    for b in range(BATCHES):
        x.write_batch(frame(spark, rows("x", b)), b)
    x2 = SqlTableSink(db_url, "events", sink_id="job-x:events")
    x2.prepare(7, 11, SinkOwner(lineage="job-x", job_id="job-x2", generation=1))
    assert x2.write_batch(frame(spark, rows("x2", 12)), 12) is True
    again = SqlTableSink(db_url, "events", sink_id="job-x:events")
    with pytest.raises(SinkOwnedError, match="taken over by its newer job job-x2; job job-x "):
        again.prepare(8, 19, X)
    expected = sorted([r for b in range(12) for r in rows("x", b)] + rows("x2", 12))
    assert sql_rows(db_url, "events") == expected
    assert sql_scalar(db_url, "select replaced from _headrace_sink_owners where sink_id = 'job-x:events'") == "job-x"
    assert x2.write_batch(frame(spark, rows("x2", 13)), 13) is True
    for s in (x, x2, again):
        s.close()


def test_lineages_sharing_a_table_undo_only_their_own_rows(spark, pg_url):
    """`ctx.sinks.sql_table` names sinks `<lineage>:<table>`: two lineages may share a table."""
    x = SqlTableSink(pg_url, "events", sink_id="job-x:events")
    x.prepare(3, -1, X)
    for b in range(BATCHES):
        x.write_batch(frame(spark, rows("x", b)), b)
    y_owner = fresh_jobs(1)[0]
    y = SqlTableSink(pg_url, "events", sink_id="job-y0:events")
    y.prepare(4, -1, y_owner)
    for b in range(5):
        y.write_batch(frame(spark, rows("y", b)), b)
    # Y's next job resumes from Y's snapshot at batch 2: Y's batches 3 and 4 go, X's 20 stay.
    y2 = SqlTableSink(pg_url, "events", sink_id="job-y0:events")
    y2.prepare(5, 2, SinkOwner(lineage="job-y0", job_id="job-y0b", generation=1))
    expected = sorted([r for b in range(BATCHES) for r in rows("x", b)] + [r for b in range(3) for r in rows("y", b)])
    assert sql_rows(pg_url, "events") == expected
    assert sql_scalar(pg_url, "select count(*) from _headrace_sink_commits where sink_id = 'job-x:events'") == BATCHES
    for s in (x, y, y2):
        s.close()


# ---------------------------------------------------------------- redis streams


def stream_rows(r: redis.Redis, stream: str) -> list[tuple]:
    out = []
    for _, fields in r.xrange(stream):
        t = unpack_entry(fields)
        out += list(zip(t.column("k").to_pylist(), t.column("v").to_pylist(), t.column("src").to_pylist(), strict=True))
    return sorted(out)


def packed(data) -> bytes:
    return pack_events([{"k": k, "v": v, "src": s} for k, v, s in data])


def test_a_fresh_job_reusing_a_redis_sink_id_is_refused_and_the_owners_entries_stay(redis_url):
    r = redis.Redis.from_url(redis_url)
    sink = "shared:out"
    prepare_sink(r, "out", sink_id=sink, attempt=3, restored_batch_id=-1, owner=X)
    for b in range(BATCHES):
        assert commit_entries(r, "out", [packed(rows("x", b))], sink_id=sink, batch_id=b, attempt=3)
    expected = sorted(r_ for b in range(BATCHES) for r_ in rows("x", b))
    for attempt, y in enumerate(fresh_jobs(3), start=4):
        with pytest.raises(SinkOwnedError) as refused:
            prepare_sink(r, "out", sink_id=sink, attempt=attempt, restored_batch_id=-1, owner=y)
        assert str(refused.value).startswith(
            f"Redis stream sink 'shared:out' (stream out) is the sink of lineage job-x (job job-x); job {y.job_id}"
        )
    assert stream_rows(r, "out") == expected and r.xlen("out") == BATCHES
    assert int(r.get(committed_key(sink))) == BATCHES - 1 and int(r.get(fence_key(sink))) == 3
    assert r.hgetall(owner_key(sink)) == {
        b"lineage": b"job-x",
        b"job_id": b"job-x",
        b"generation": b"0",
        b"replaced": b"",
    }
    assert commit_entries(r, "out", [packed(rows("x", BATCHES))], sink_id=sink, batch_id=BATCHES, attempt=3)
    # A restore in X's lineage rewinds X's entries as before.
    assert (
        prepare_sink(
            r,
            "out",
            sink_id=sink,
            attempt=9,
            restored_batch_id=9,
            owner=SinkOwner(lineage="job-x", job_id="job-x2", generation=1),
        )
        == BATCHES + 1 - 10
    )
    assert stream_rows(r, "out") == sorted(r_ for b in range(10) for r_ in rows("x", b))


def test_a_replaced_job_cannot_take_a_redis_sink_back(redis_url):
    r = redis.Redis.from_url(redis_url)
    sink = "job-x:out"
    prepare_sink(r, "out", sink_id=sink, attempt=3, restored_batch_id=-1, owner=X)
    for b in range(BATCHES):
        commit_entries(r, "out", [packed(rows("x", b))], sink_id=sink, batch_id=b, attempt=3)
    x2 = SinkOwner(lineage="job-x", job_id="job-x2", generation=1)
    assert prepare_sink(r, "out", sink_id=sink, attempt=7, restored_batch_id=11, owner=x2) == 8
    with pytest.raises(SinkOwnedError, match="taken over by its newer job job-x2; job job-x "):
        prepare_sink(r, "out", sink_id=sink, attempt=8, restored_batch_id=19, owner=X)
    assert r.xlen("out") == 12 and int(r.get(fence_key(sink))) == 7
    assert r.hget(owner_key(sink), "replaced") == b"job-x"
    w = SinkOwner(lineage="job-x", job_id="job-w", generation=1)
    assert prepare_sink(r, "out", sink_id=sink, attempt=9, restored_batch_id=5, owner=w) == 6
    assert r.hget(owner_key(sink), "replaced") == b"job-x job-x2"
    with pytest.raises(SinkOwnedError, match="taken over by its newer job job-w; job job-x2 "):
        prepare_sink(r, "out", sink_id=sink, attempt=10, restored_batch_id=11, owner=x2)
    assert stream_rows(r, "out") == sorted(r_ for b in range(6) for r_ in rows("x", b))


def test_lineages_sharing_a_stream_undo_only_their_own_entries(redis_url):
    r = redis.Redis.from_url(redis_url)
    prepare_sink(r, "out", sink_id="job-x:out", attempt=3, restored_batch_id=-1, owner=X)
    y = fresh_jobs(1)[0]
    prepare_sink(r, "out", sink_id="job-y0:out", attempt=4, restored_batch_id=-1, owner=y)
    for b in range(BATCHES):
        commit_entries(r, "out", [packed(rows("x", b))], sink_id="job-x:out", batch_id=b, attempt=3)
        if b < 5:
            commit_entries(r, "out", [packed(rows("y", b))], sink_id="job-y0:out", batch_id=b, attempt=4)
    deleted = prepare_sink(
        r,
        "out",
        sink_id="job-y0:out",
        attempt=5,
        restored_batch_id=2,
        owner=SinkOwner(lineage="job-y0", job_id="job-y0b", generation=1),
    )
    assert deleted == 2
    expected = sorted(
        [r_ for b in range(BATCHES) for r_ in rows("x", b)] + [r_ for b in range(3) for r_ in rows("y", b)]
    )
    assert stream_rows(r, "out") == expected
