"""The Delta connector's rules that need no Spark: where a table may lie, who may claim it, how a
transaction version carries the fence, whether rows fit a schema, the upkeep's options and the
retention snapshots pin."""

from __future__ import annotations

import json
import os

import pytest
from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType

from services.taskmanager.runtime.connectors import (
    SinkFencedError,
    SinkOwnedError,
    SinkOwner,
    delta_claim,
    delta_log,
    delta_schema,
)
from services.taskmanager.runtime.connectors.delta_errors import DeltaPathRefused, DeltaSchemaMismatch
from services.taskmanager.runtime.connectors.delta_maintenance import Maintenance, Pins, Policy
from services.taskmanager.runtime.connectors.delta_paths import resolve_table_path
from services.taskmanager.runtime.connectors.delta_sink import app_id, sink_name

# -- paths


def test_a_relative_path_lands_in_the_lake_and_may_not_climb_out(tmp_path):
    lake = str(tmp_path / "lake")
    os.makedirs(lake)
    assert resolve_table_path("clicks/bronze", lake_dir=lake) == f"{lake}/clicks/bronze"
    assert resolve_table_path(f"file://{lake}/x", lake_dir=lake) == f"{lake}/x"
    with pytest.raises(DeltaPathRefused, match="outside the lake directory"):
        resolve_table_path("../escape", lake_dir=lake)
    with pytest.raises(DeltaPathRefused, match="outside the lake directory"):
        resolve_table_path("/etc/tables", lake_dir=lake)
    with pytest.raises(DeltaPathRefused, match="scheme 's3a' is not supported"):
        resolve_table_path("s3a://bucket/t", lake_dir=lake)
    with pytest.raises(DeltaPathRefused, match="no lake directory"):
        resolve_table_path("t", lake_dir="")


def test_an_absolute_path_may_lie_under_another_storage_root_but_not_through_a_symlink_out(tmp_path):
    lake, root, outside = tmp_path / "lake", tmp_path / "shared", tmp_path / "elsewhere"
    for d in (lake, root, outside):
        d.mkdir()
    assert resolve_table_path(str(root / "t"), lake_dir=str(lake), roots=[str(root)]) == str(root / "t")
    (lake / "link").symlink_to(outside)
    with pytest.raises(DeltaPathRefused, match="which resolves to"):
        resolve_table_path("link/t", lake_dir=str(lake), roots=[str(root)])


# -- transaction versions


def test_a_transaction_version_orders_seqs_before_batches():
    assert delta_log.txn_version(1, -1) < delta_log.txn_version(1, 0) < delta_log.txn_version(1, 10**9)
    assert delta_log.txn_version(1, 10**9) < delta_log.txn_version(2, -1)  # a new attempt passes any old batch
    v = delta_log.txn_version(7, 41)
    assert (delta_log.seq_of(v), delta_log.batch_of(v)) == (7, 41)
    assert delta_log.seq_of(None) == 0
    with pytest.raises(ValueError):
        delta_log.txn_version(0, 1)


def test_names_are_stable_per_lineage_and_path():
    assert app_id("lin", "/lake/t") == app_id("lin", "/lake/t") != app_id("lin2", "/lake/t")
    assert sink_name("/lake/a b/t").startswith("delta-t-")
    assert delta_log.quoted("/x/`y`") == "delta.`/x/``y```"
    assert delta_log.sql_string("it's") == "'it\\'s'"


# -- claims


def state(records: dict[str, delta_claim.WriterRecord], version: int = 3, txn: int | None = None):
    return delta_log.TableState(
        version=version, txn=txn, properties={delta_claim.PREFIX + a: r.to_json() for a, r in records.items()}
    )


A = SinkOwner(lineage="la", job_id="ja")


def claim(st, owner=A, fence=10, shared=False, r=-1, app="app-a"):
    return delta_claim.new_record(
        "/lake/t", app, st, fence=fence, owner=owner, shared=shared, restored_batch_id=r, sink_name="delta:/lake/t"
    )


def test_the_first_claim_starts_at_seq_1_since_the_current_version():
    rec = claim(state({}))
    assert (rec.lineage, rec.job_id, rec.seq, rec.since, rec.fence) == ("la", "ja", 1, 3, 10)


def test_another_lineage_is_refused_unless_both_share_by_append():
    other = delta_claim.WriterRecord(lineage="lb", job_id="jb", fence=5, seq=1, since=0)
    with pytest.raises(SinkOwnedError, match="lineage lb \\(job jb\\)"):
        claim(state({"app-b": other}))
    with pytest.raises(SinkOwnedError):
        claim(state({"app-b": other}), shared=True)  # the other writer does not share
    other.shared = True
    assert claim(state({"app-b": other}), shared=True).shared


def test_within_the_lineage_an_older_token_is_fenced_and_a_replaced_job_refused():
    own = delta_claim.WriterRecord(lineage="la", job_id="ja2", fence=50, seq=4, since=1, replaced=["ja"])
    with pytest.raises(SinkOwnedError, match="was replaced"):
        claim(state({"app-a": own}), fence=60)
    with pytest.raises(SinkFencedError):
        claim(state({"app-a": own}), owner=SinkOwner(lineage="la", job_id="ja2"), fence=40)
    newer = claim(state({"app-a": own}), owner=SinkOwner(lineage="la", job_id="ja3", generation=2), fence=60)
    assert (newer.seq, newer.since, newer.replaced) == (5, 1, ["ja", "ja2"])


def test_the_seq_passes_the_transaction_version_a_restore_left_behind():
    own = delta_claim.WriterRecord(lineage="la", job_id="ja", fence=5, seq=2, since=0)
    rec = claim(state({"app-a": own}, txn=delta_log.txn_version(9, 100)))
    assert rec.seq == 10


def test_records_ignore_properties_that_are_not_ours():
    props = {delta_claim.PREFIX + "x": "not json", "delta.appendOnly": "false"}
    assert delta_claim.records(props) == {}


# -- schema


def schema(ddl: str) -> StructType:
    """A flat schema from "name type, ..." (no Spark session needed)."""
    kinds = {"string": StringType(), "bigint": LongType(), "int": IntegerType()}
    return StructType([StructField(name, kinds[kind]) for name, kind in (c.split() for c in ddl.split(","))])


def test_rows_that_fit_pass_and_misfits_name_their_columns():
    table = schema("k string, v bigint, note string").json()
    delta_schema.check("/t", table, schema("K string, v bigint"), merge_schema=False)  # a nullable column less
    with pytest.raises(DeltaSchemaMismatch) as err:
        delta_schema.check("/t", table, schema("k string, v string, extra int"), merge_schema=False)
    assert set(err.value.columns) == {"extra", "v"}
    assert "extra (int)" in str(err.value) and "v (table: bigint, rows: string)" in str(err.value)
    delta_schema.check("/t", table, schema("k string, v bigint, extra int"), merge_schema=True)
    required = json.loads(table)
    required["fields"][2]["nullable"] = False
    with pytest.raises(DeltaSchemaMismatch, match="NOT NULL columns the rows lack: note"):
        delta_schema.check("/t", json.dumps(required), schema("k string, v bigint"), merge_schema=False)


# -- upkeep


def test_the_policy_reads_the_sinks_options_before_the_jobs():
    policy = Policy.read(
        {"optimize.every": "10"},
        {
            "sink.delta.optimize.every": "99",
            "sink.delta.vacuum.retention": "2 h",
            "sink.delta.vacuum.interval": "30 min",
        },
    )
    assert (policy.optimize_every, policy.vacuum_retention_s, policy.vacuum_interval_s) == (10, 7200.0, 1800.0)
    assert not Policy().any and policy.any
    with pytest.raises(ValueError, match="optimize.every"):
        Policy.read({"optimize.every": "-1"}, {})
    with pytest.raises(ValueError, match="vacuum.retention"):
        Policy.read({"vacuum.retention": "soon"}, {})


def test_retention_covers_the_oldest_live_snapshot(tmp_path):
    table = tmp_path / "t"
    table.mkdir()
    pins = Pins(str(table), "app")
    day = 86400 * 1000
    now = 100 * day
    live, gone = tmp_path / "sp-live", tmp_path / "sp-gone"
    live.mkdir()
    (live / "_metadata").write_text("{}")
    pins.add(str(live), 3, committed_ms=now - 30 * day, now_ms=now - 30 * day)
    pins.add(str(gone), 1, committed_ms=now - 60 * day, now_ms=now - 60 * day)
    m = Maintenance(str(table), "app", Policy(vacuum_retention_s=3600.0), pins)
    assert m.retention_s(now) == pytest.approx(30 * 86400 + 3600)
    pins.add(str(tmp_path / "being-written"), 9, committed_ms=now - 1000, now_ms=now)  # no directory yet: held
    assert m.retention_s(now) == pytest.approx(30 * 86400 + 3600)
    (live / "_metadata").unlink()  # disposed of
    assert m.retention_s(now) == pytest.approx(3600 + 1)


def test_maintenance_runs_when_due_and_never_fails_the_batch(tmp_path):
    ran: list[str] = []

    class FakeSpark:
        class conf:
            @staticmethod
            def set(key, value):
                pass

            @staticmethod
            def unset(key):
                pass

            @staticmethod
            def get(key, default=None):
                return default

        def sql(self, text):
            ran.append(text.split()[0])
            raise RuntimeError("disk full")

    waits: list[str | None] = []
    m = Maintenance(str(tmp_path), "app", Policy(optimize_every=2), Pins(str(tmp_path), "app"), on_wait=waits.append)
    for b in range(5):
        m.after_batch(FakeSpark(), b)
    assert ran == ["OPTIMIZE", "OPTIMIZE"]
    assert waits[0] and waits[0].startswith("running OPTIMIZE") and waits[1] is None


# -- the log, read as files


def write_log(table, commits: list[list[dict]], crc: dict | None = None) -> None:
    log = table / "_delta_log"
    log.mkdir(parents=True)
    for v, actions in enumerate(commits):
        (log / f"{v:020d}.json").write_text("\n".join(json.dumps(a) for a in actions) + "\n")
    if crc is not None:
        (log / f"{len(commits) - 1:020d}.crc").write_text(json.dumps(crc))


def test_the_state_comes_from_the_newest_checksum_and_commits_without_spark(tmp_path):
    table = tmp_path / "t"
    info = {"commitInfo": {"timestamp": 1234, "operation": "WRITE", "userMetadata": "headrace:app:batch 0"}}
    add = {"add": {"path": "p0.parquet", "dataChange": True, "stats": json.dumps({"numRecords": 3})}}
    other = {"txn": {"appId": "other", "version": 1}}
    write_log(
        table,
        [[info, {"txn": {"appId": "app", "version": 5}}, add], [info, other]],
        crc={
            "metadata": {"configuration": {"headrace.writer.app": "{}"}, "schemaString": "{}"},
            "setTransactions": [{"appId": "app", "version": 5}, {"appId": "other", "version": 1}],
        },
    )
    state = delta_log.table_state(None, str(table), "app")  # no Spark needed: the checksum answers
    assert (state.version, state.txn, state.timestamp_ms) == (1, 5, 1234)
    assert state.properties == {"headrace.writer.app": "{}"}
    assert delta_log.table_state(None, str(table), "nobody").txn is None
    assert delta_log._newest_txn(str(table), "app", 1) == (True, 5)
    assert delta_log._newest_txn(str(table), "nobody", 1) == (True, None)
    c = delta_log.commit(str(table), 0)
    assert c is not None and c.by("app") and c.data_change and (c.files_added, c.rows) == (1, 3)
    assert delta_log.commit(str(table), 7) is None
    assert delta_log.latest_version(str(table)) == 1 and delta_log.latest_version(str(tmp_path / "none")) == -1
    (table / "_delta_log" / f"{0:020d}.json").unlink()  # cleaned up: the search cannot answer
    assert delta_log._newest_txn(str(table), "nobody", 1) == (False, None)
