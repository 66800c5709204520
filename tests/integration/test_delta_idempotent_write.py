"""The Delta sink's idempotent write (connectors/delta_idempotent_write.py) on real tables: the log
it leaves is Delta's own (a `txn` action beside the files, read back by delta-rs and by Delta's
own lookup), a version already reached writes nothing, no state reconstruction runs, and a
concurrent commit of the same app id still fails the slower writer, as Delta's own write does."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
from deltalake import DeltaTable

from services.taskmanager.runtime.connectors import delta_log
from services.taskmanager.runtime.connectors.delta_idempotent_write import write_once
from services.taskmanager.runtime.spark_session import build_spark


@pytest.fixture(scope="module")
def spark(tmp_path_factory):
    session = build_spark(1, tmp_path_factory.mktemp("spark"), shuffle_partitions=1)
    yield session
    session.stop()


def table(spark, tmp_path: Path, name: str = "t") -> str:
    path = str(tmp_path / name)
    spark.createDataFrame([], "k string, v long").write.format("delta").save(path)
    return path


def frame(spark, *values: int):
    return spark.createDataFrame([(f"k{v}", v) for v in values], "k string, v long")


def newest_commit(path: str) -> list[dict]:
    newest = sorted((Path(path) / "_delta_log").glob("*.json"))[-1]
    return [json.loads(line) for line in newest.read_text().splitlines()]


def test_a_version_is_written_once_and_the_log_is_deltas_own(spark, tmp_path):
    path = table(spark, tmp_path)
    assert write_once(
        spark, frame(spark, 1, 2), path, app_id="app", version=7, mode="append", options={}, user_metadata="batch 7"
    )
    actions = newest_commit(path)
    assert {"appId": "app", "version": 7} == {
        k: v for k, v in next(a["txn"] for a in actions if "txn" in a).items() if k in ("appId", "version")
    }
    assert next(a["commitInfo"] for a in actions if "commitInfo" in a)["userMetadata"] == "batch 7"
    # the same version again, and an older one: nothing written
    assert not write_once(
        spark, frame(spark, 3), path, app_id="app", version=7, mode="append", options={}, user_metadata="again"
    )
    assert not write_once(
        spark, frame(spark, 4), path, app_id="app", version=6, mode="append", options={}, user_metadata="older"
    )
    assert sorted(r["v"] for r in DeltaTable(path).to_pyarrow_table().to_pylist()) == [1, 2]
    assert delta_log.table_state(spark, path, "app").txn == 7
    # another app id has its own versions
    assert write_once(
        spark, frame(spark, 5), path, app_id="other", version=1, mode="append", options={}, user_metadata="other 1"
    )
    assert sorted(r["v"] for r in DeltaTable(path).to_pyarrow_table().to_pylist()) == [1, 2, 5]


def test_overwrite_replaces_the_rows_in_one_commit(spark, tmp_path):
    path = table(spark, tmp_path)
    write_once(
        spark, frame(spark, 1, 2, 3), path, app_id="app", version=1, mode="append", options={}, user_metadata="1"
    )
    assert write_once(
        spark, frame(spark, 9), path, app_id="app", version=2, mode="overwrite", options={}, user_metadata="2"
    )
    assert [r["v"] for r in DeltaTable(path).to_pyarrow_table().to_pylist()] == [9]


def test_no_state_reconstruction_runs(spark, tmp_path):
    """Delta's own idempotent write runs three Spark jobs over the log's state before the write
    (docs/benchmarks.md); this one runs the write's job only."""
    path = table(spark, tmp_path)
    write_once(spark, frame(spark, 1), path, app_id="app", version=1, mode="append", options={}, user_metadata="1")
    tracker = spark.sparkContext.statusTracker()
    spark.sparkContext.setJobGroup("write-once-jobs", "one idempotent write")
    try:
        write_once(spark, frame(spark, 2), path, app_id="app", version=2, mode="append", options={}, user_metadata="2")
    finally:
        spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)
    assert len(tracker.getJobIdsForGroup("write-once-jobs")) == 1


def test_of_two_concurrent_writes_of_one_app_the_second_commit_fails(spark, tmp_path):
    """Both transactions read the app's version before either committed (the slow one writes its
    file for seconds meanwhile): Delta's conflict check must refuse whichever commits second, as
    it does for its own idempotent writes, because the app id is among the transaction's reads."""
    path = table(spark, tmp_path)
    write_once(spark, frame(spark, 0), path, app_id="app", version=1, mode="append", options={}, user_metadata="1")

    from pyspark.sql import functions as F
    from pyspark.sql.types import LongType

    slow_v = F.udf(lambda v: (time.sleep(4), v)[1], LongType())
    writes = {2: frame(spark, 100).withColumn("v", slow_v("v")), 3: frame(spark, 3)}
    outcome: dict[int, object] = {}

    def write(version: int) -> None:
        try:
            outcome[version] = write_once(
                spark,
                writes[version],
                path,
                app_id="app",
                version=version,
                mode="append",
                options={},
                user_metadata=f"v{version}",
            )
        except Exception as exc:  # noqa: BLE001 - the outcome under test
            outcome[version] = exc

    threads = [threading.Thread(target=write, args=(2,))]
    threads[0].start()
    time.sleep(1.5)  # the slow writer's transaction has read the table and is writing its file
    threads.append(threading.Thread(target=write, args=(3,)))
    threads[1].start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    winners = [v for v, r in outcome.items() if r is True]
    losers = [v for v, r in outcome.items() if isinstance(r, Exception)]
    assert len(winners) == 1 and len(losers) == 1, outcome
    assert "ConcurrentTransaction" in str(outcome[losers[0]])
    winner_rows = {2: [0, 100], 3: [0, 3]}[winners[0]]
    assert sorted(r["v"] for r in DeltaTable(path).to_pyarrow_table().to_pylist()) == winner_rows
    assert delta_log.table_state(spark, path, "app").txn == winners[0]
