"""A replaced attempt's transaction left open in the SQL sink's PostgreSQL (a driver frozen inside a
batch) no longer blocks the new attempt's `prepare` (connectors/sql_stale_writers.py): the frozen
session is ended after a short lock wait and the sink changes hands; a session that is not an
attempt of the sink is never ended, only waited for with a reason, then named in the error."""

from __future__ import annotations

import time
import uuid

import psycopg
import pyarrow as pa
import pytest
from pyspark.sql import types as T

from services.taskmanager.runtime.connectors import sql_stale_writers
from services.taskmanager.runtime.connectors.sql import SqlTableSink
from services.taskmanager.runtime.connectors.sql_stale_writers import SinkFenceLockedError, session_name

SCHEMA = T.StructType([T.StructField("key", T.StringType()), T.StructField("count", T.LongType())])


def new_sink(url: str, table: str, waits: list) -> SqlTableSink:
    return SqlTableSink(url, table, sink_id=f"lineage-1:{table}", key_columns=["key"], on_wait=waits.append)


def hold_fence(url: str, sink_id: str, application_name: str) -> psycopg.Connection:
    """A session inside a batch's transaction, frozen: the fence row share-locked, never committed."""
    conn = psycopg.connect(url)
    conn.execute("SELECT set_config('application_name', %s, true)", (application_name,))
    conn.execute("SELECT attempt FROM _headrace_sink_fences WHERE sink_id = %s FOR SHARE", (sink_id,))
    return conn


def fence_holder(url: str, sink_id: str) -> int:
    with psycopg.connect(url) as conn:
        return conn.execute("SELECT attempt FROM _headrace_sink_fences WHERE sink_id = %s", (sink_id,)).fetchone()[0]


def test_a_frozen_older_attempt_is_ended_and_the_new_attempt_takes_the_sink(pg_url):
    table = f"counts_{uuid.uuid4().hex[:8]}"
    waits: list = []
    old = new_sink(pg_url, table, waits)
    old.prepare(1, -1)
    assert old.write_arrow(pa.table({"key": ["a"], "count": [1]}), 0, SCHEMA)
    frozen = hold_fence(pg_url, old.sink_id, session_name(old.sink_id, 1))
    try:
        new = new_sink(pg_url, table, waits)
        t0 = time.monotonic()
        new.prepare(2, 0)
        took = time.monotonic() - t0
        assert took < sql_stale_writers.LOCK_WAIT_S + 10, took
        assert fence_holder(pg_url, new.sink_id) == 2
        with pytest.raises(psycopg.OperationalError):  # its session was ended: the zombie can write nothing
            frozen.execute("SELECT 1")
        assert new.write_arrow(pa.table({"key": ["a"], "count": [2]}), 1, SCHEMA)
    finally:
        frozen.close()
        old.close()


def test_a_session_that_is_no_attempt_of_the_sink_is_waited_for_and_named(pg_url, monkeypatch):
    monkeypatch.setattr(sql_stale_writers, "LOCK_WAIT_S", 1.0)
    monkeypatch.setattr(sql_stale_writers, "FENCE_WAIT_S", 4.0)
    table = f"counts_{uuid.uuid4().hex[:8]}"
    waits: list = []
    first = new_sink(pg_url, table, waits)
    first.prepare(1, -1)
    # Another sink's batch in flight: it locks only its own row of the shared fence table.
    neighbour = new_sink(pg_url, f"counts_{uuid.uuid4().hex[:8]}", [])
    neighbour.prepare(1, -1)
    busy = hold_fence(pg_url, neighbour.sink_id, session_name(neighbour.sink_id, 1))
    # An operator's session holding this sink's row: never ended.
    other = hold_fence(pg_url, first.sink_id, "psql-operator")
    pid = other.info.backend_pid
    try:
        second = new_sink(pg_url, table, waits)
        with pytest.raises(SinkFenceLockedError) as caught:
            second.prepare(2, -1)
        assert f"session {pid} (psql-operator" in str(caught.value), caught.value
        assert f"session {busy.info.backend_pid} " not in str(caught.value), caught.value  # not this sink's
        assert any(w and "waiting for its fence row" in w and str(pid) in w for w in waits), waits
        assert waits[-1] is None  # the waiting reason is cleared when the wait ends
        assert other.execute("SELECT 1").fetchone() == (1,)  # still alive
        assert fence_holder(pg_url, first.sink_id) == 1
        assert busy.execute("SELECT 1").fetchone() == (1,)  # an older attempt of another sink: left alone
    finally:
        other.close()
        busy.close()
        neighbour.close()
        first.close()
    second.prepare(2, -1)  # once the session let go, the sink changes hands
    assert fence_holder(pg_url, first.sink_id) == 2
    second.close()
