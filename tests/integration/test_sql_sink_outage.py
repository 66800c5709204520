"""The SQL sink during an outage of its own PostgreSQL (a private server this module stops and
starts; connectors/sql_retry.py): a batch written while the server is down waits, and commits
exactly once when it is back; past the bound it fails with the database and the time waited; a
commit whose outcome is unknown is not doubled by the retry; and a retry still obeys the fence.
"""

from __future__ import annotations

import threading
import time
import uuid

import psycopg
import pyarrow as pa
import pytest
import sqlalchemy as sa
from pyspark.sql import types as T

from services.taskmanager.runtime.connectors import SinkFencedError
from services.taskmanager.runtime.connectors.sql import SqlTableSink
from services.taskmanager.runtime.connectors.sql_retry import RetryPolicy, SinkDatabaseUnreachable
from tests.private_postgres import PrivatePostgres

SCHEMA = T.StructType([T.StructField("key", T.StringType()), T.StructField("count", T.LongType())])


@pytest.fixture(scope="module")
def pg():
    with PrivatePostgres() as server:
        yield server


@pytest.fixture
def server(pg):
    pg.start()  # a test that failed half-way may have left it stopped
    yield pg
    pg.start()


def batch(*pairs: tuple[str, int]) -> pa.Table:
    return pa.table(
        {"key": [k for k, _ in pairs], "count": [c for _, c in pairs]},
        schema=pa.schema([("key", pa.string()), ("count", pa.int64())]),
    )


def new_sink(url: str, retry: RetryPolicy, table: str | None = None) -> SqlTableSink:
    table = table or f"counts_{uuid.uuid4().hex[:8]}"
    return SqlTableSink(url, table, sink_id=f"lineage-1:{table}", key_columns=["key"], retry=retry)


def rows(url: str, table: str) -> dict[str, int]:
    with psycopg.connect(url) as conn:
        return dict(conn.execute(f"SELECT key, count FROM {table}").fetchall())


def markers(url: str, sink_id: str) -> list[int]:
    with psycopg.connect(url) as conn:
        return [
            b
            for (b,) in conn.execute(
                "SELECT batch_id FROM _headrace_sink_commits WHERE sink_id = %s ORDER BY batch_id", (sink_id,)
            )
        ]


def restart_after(pg: PrivatePostgres, seconds: float) -> threading.Thread:
    t = threading.Thread(target=lambda: (time.sleep(seconds), pg.start()), daemon=True)
    t.start()
    return t


def test_a_batch_written_while_the_database_is_down_commits_once_when_it_is_back(server):
    sink = new_sink(server.url, RetryPolicy(max_retry_time_s=60))
    waits: list[str | None] = []
    sink.retrier.on_wait = waits.append
    try:
        sink.prepare(attempt=1, restored_batch_id=-1)
        assert sink.write_arrow(batch(("a", 1), ("b", 1)), 0, SCHEMA)
        server.stop()
        back = restart_after(server, 10)
        t0 = time.monotonic()
        assert sink.write_arrow(batch(("a", 2), ("c", 1)), 1, SCHEMA) is True
        waited = time.monotonic() - t0
        back.join(60)
        assert 9 <= waited < 40, waited
        assert rows(server.url, sink.table_name) == {"a": 2, "b": 1, "c": 1}
        assert markers(server.url, sink.sink_id) == [0, 1]
        assert sink.retrier.outages == 1
        assert len(waits) == 2 and "waiting for database postgresql://127.0.0.1" in waits[0] and waits[1] is None
        # Spark re-runs the batch after a crash: the marker makes it a no-op.
        assert sink.write_arrow(batch(("a", 99)), 1, SCHEMA) is False
        assert rows(server.url, sink.table_name)["a"] == 2
    finally:
        sink.close()


def test_prepare_and_the_committed_check_wait_for_the_database_too(server):
    sink = new_sink(server.url, RetryPolicy(max_retry_time_s=60))
    try:
        server.stop()
        back = restart_after(server, 5)
        sink.prepare(attempt=3, restored_batch_id=-1)  # a task started during the outage
        back.join(60)
        server.stop()
        back = restart_after(server, 5)
        assert sink.is_committed(0) is False
        back.join(60)
        assert sink.retrier.outages == 2
    finally:
        sink.close()


def test_past_the_bound_the_batch_fails_with_the_database_and_the_time_waited(server):
    sink = new_sink(server.url, RetryPolicy(max_retry_time_s=4))
    try:
        sink.prepare(attempt=1, restored_batch_id=-1)
        assert sink.write_arrow(batch(("a", 1)), 0, SCHEMA)
        server.stop()
        t0 = time.monotonic()
        with pytest.raises(SinkDatabaseUnreachable) as info:
            sink.write_arrow(batch(("a", 2)), 1, SCHEMA)
        assert 4 <= time.monotonic() - t0 < 20
        text = str(info.value)
        assert f"postgresql://127.0.0.1:{server.port}/postgres" in text and "writing batch 1" in text
        assert info.value.waited_s >= 4 and "unreachable for" in text
        server.start()
        # What the restarted task does: the batch was not committed, so it is written once now.
        assert sink.write_arrow(batch(("a", 2)), 1, SCHEMA) is True
        assert rows(server.url, sink.table_name) == {"a": 2} and markers(server.url, sink.sink_id) == [0, 1]
    finally:
        sink.close()


class LostCommitAck(SqlTableSink):
    """The first try of each batch commits, then its connection breaks before the answer
    arrives: the sink cannot know the outcome (the fault is injected, the database is real)."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.tries = 0

    def _write_once(self, rows, batch_id, schema):
        self.tries += 1
        if self.tries == 1:
            super()._write_once(rows, batch_id, schema)
            raise sa.exc.OperationalError.instance(
                "COMMIT",
                {},
                psycopg.OperationalError("server closed the connection unexpectedly"),
                psycopg.Error,
                connection_invalidated=True,
            )
        return super()._write_once(rows, batch_id, schema)


def test_a_retry_after_a_commit_of_unknown_outcome_neither_loses_nor_doubles(server):
    table = f"keyless_{uuid.uuid4().hex[:8]}"
    # Keyless (plain inserts): a second write of the batch would show as duplicated rows.
    sink = LostCommitAck(server.url, table, sink_id=f"lineage-1:{table}", retry=RetryPolicy(max_retry_time_s=30))
    try:
        sink.prepare(attempt=1, restored_batch_id=-1)
        assert sink.write_arrow(batch(("a", 1), ("a", 1), ("b", 5)), 0, SCHEMA) is False  # found committed
        assert sink.tries == 2
        with psycopg.connect(server.url) as conn:
            got = sorted(conn.execute(f"SELECT key, count FROM {table}").fetchall())
        assert got == [("a", 1), ("a", 1), ("b", 5)]
        assert markers(server.url, sink.sink_id) == [0]
    finally:
        sink.close()


class BrokenOnce(SqlTableSink):
    """The first try of batch 1 finds its connection broken before anything was written; the
    test does something between the tries."""

    def __init__(self, *a, between_tries, **kw):
        super().__init__(*a, **kw)
        self.tries, self.between_tries = 0, between_tries

    def _write_once(self, rows, batch_id, schema):
        if batch_id != 1:
            return super()._write_once(rows, batch_id, schema)
        self.tries += 1
        if self.tries == 1:
            self.between_tries()
            raise sa.exc.OperationalError.instance(
                "BEGIN", {}, psycopg.OperationalError("connection failed: Connection refused"), psycopg.Error
            )
        return super()._write_once(rows, batch_id, schema)


def test_the_fence_holds_across_a_retry(server):
    table = f"fenced_{uuid.uuid4().hex[:8]}"
    newer = SqlTableSink(server.url, table, sink_id=f"lineage-1:{table}", key_columns=["key"])
    old = BrokenOnce(
        server.url,
        table,
        sink_id=f"lineage-1:{table}",
        key_columns=["key"],
        retry=RetryPolicy(max_retry_time_s=30),
        between_tries=lambda: newer.prepare(attempt=2, restored_batch_id=0),
    )
    try:
        old.prepare(attempt=1, restored_batch_id=-1)
        assert old.write_arrow(batch(("a", 1)), 0, SCHEMA)
        # While attempt 1 waits to retry batch 1, attempt 2 takes the sink over: the retry is refused.
        with pytest.raises(SinkFencedError):
            old.write_arrow(batch(("a", 50)), 1, SCHEMA)
        assert old.tries == 2
        assert rows(server.url, table) == {"a": 1} and markers(server.url, old.sink_id) == [0]
    finally:
        old.close()
        newer.close()
