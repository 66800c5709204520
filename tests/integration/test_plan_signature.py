"""Plan signatures against the state Spark really writes, and the restore check end to end
(one local[1] SparkSession for the module; the planner test starts its own, cold)."""

from __future__ import annotations

import json
import logging
import os
import sys
import textwrap
import time
from pathlib import Path

import pytest
from pyspark.sql import functions as F

from services.dispatcher.submission import restore_check
from services.taskmanager.runtime.plan_signature import IncompatibleStateError, check_before_start, plan_signature
from services.taskmanager.runtime.spark_session import build_spark
from shared import checkpoint_storage as storage
from shared import restore_compat

EVENTS_DDL = "url STRING, user_id STRING, n BIGINT, event_time TIMESTAMP"


@pytest.fixture(scope="module")
def spark(tmp_path_factory):
    # One state partition: half the state store tasks of two, and the schemas are the same.
    session = build_spark(1, tmp_path_factory.mktemp("spark"), shuffle_partitions=1)
    yield session
    session.stop()


def clicks(spark, total=40, seed=1):
    return spark.readStream.format("datagen").options(seed=str(seed), total=str(total), partitions="1").load()


def watermarked(spark, total=40, seed=1):
    return clicks(spark, total, seed).withWatermark("event_time", "10 seconds")


def windowed_count(df, key="url"):
    return df.groupBy(F.window("event_time", "1 minute"), key).count()


def joined(spark, total=40):
    left = watermarked(spark, total, 1).alias("a")
    right = watermarked(spark, total, 2).alias("b")
    cond = F.expr(
        "a.i = b.i AND a.url = b.url AND "
        "b.event_time BETWEEN a.event_time - INTERVAL 1 MINUTE AND a.event_time + INTERVAL 1 MINUTE"
    )
    return left.join(right, cond)


# name -> (DataFrame factory taking (spark, total), output mode)
PIPELINES = {
    "windowed count by url": (lambda s, n: windowed_count(watermarked(s, n)), "update"),
    "count by a computed key": (lambda s, n: clicks(s, n).groupBy(F.upper("url")).count(), "update"),
    "avg": (lambda s, n: clicks(s, n).groupBy("url").agg(F.avg("i")), "update"),
    "dropDuplicates": (lambda s, n: clicks(s, n).dropDuplicates(["user_id"]), "append"),
    "dedupe within watermark, then windowed count": (
        lambda s, n: windowed_count(watermarked(s, n).dropDuplicatesWithinWatermark(["i"])),
        "append",
    ),
    "stream-stream join": (joined, "append"),
}


def run_to_end(df, checkpoint: Path, mode: str) -> None:
    q = (
        df.writeStream.format("noop")
        .outputMode(mode)
        .trigger(availableNow=True)
        .option("checkpointLocation", str(checkpoint))
        .start()
    )
    q.awaitTermination()


@pytest.fixture(scope="module")
def checkpoints(spark, tmp_path_factory):
    """A real checkpoint per pipeline, written once (40 events) and shared by the tests."""
    root = tmp_path_factory.mktemp("checkpoints")
    done: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in done:
            make, mode = PIPELINES[name]
            cp = root / name.replace(" ", "_").replace(",", "")
            run_to_end(make(spark, 40), cp, mode)
            done[name] = cp
        return done[name]

    return get


# ---------------------------------------------------------------- reading what Spark wrote


def read_schema_file(path: Path) -> tuple[dict, dict]:
    """Spark's state schema file (v2): writeUTF("v2"), then key and value schema JSON, each as
    writeInt(chunks) + chunks x writeUTF."""
    data, pos = path.read_bytes(), 0

    def utf() -> str:
        nonlocal pos
        n = int.from_bytes(data[pos : pos + 2], "big")
        pos += 2
        pos += n
        return data[pos - n : pos].decode()

    def chunked() -> dict:
        nonlocal pos
        count = int.from_bytes(data[pos : pos + 4], "big")
        pos += 4
        return json.loads("".join(utf() for _ in range(count)))

    assert utf() == "v2"
    return chunked(), chunked()


def state_operators(checkpoint: Path) -> list[dict]:
    """The snapshot metadata's `spark.operators`, as the checkpoint's state files describe them."""
    ops = []
    for op_dir in sorted((checkpoint / "state").iterdir(), key=lambda p: int(p.name)):
        info = json.loads((op_dir / "_metadata" / "metadata").read_text().split("\n", 1)[1])
        stores = []
        for s in info["stateStoreInfo"]:
            base = op_dir / "0" if s["storeName"] == "default" else op_dir / "0" / s["storeName"]
            key, value = read_schema_file(base / "_metadata" / "schema")
            stores.append(
                {"name": s["storeName"], "partitions": s["numPartitions"], "key_schema": key, "value_schema": value}
            )
        ops.append(
            {"id": info["operatorInfo"]["operatorId"], "name": info["operatorInfo"]["operatorName"], "stores": stores}
        )
    return ops


def take_savepoint(checkpoint: Path, target: Path, plan: dict | None) -> dict:
    """A savepoint of the query's last committed batch, by checkpoint storage, as the runner takes
    it; `plan` None is a snapshot from before signatures were recorded."""
    pipeline = {"artifact_sha256": "0" * 64, "entry": "build", "args": []}
    if plan is not None:
        pipeline["plan"] = plan
    meta = {"job_id": "c" * 32, "vertex_id": "d" * 32, "checkpoint_id": 3, "kind": "savepoint", "pipeline": pipeline}
    batch = storage.latest_committed_batch(checkpoint)
    return storage.take_snapshot(checkpoint, target, batch_id=batch, metadata=meta).metadata


# ---------------------------------------------------------------- the signature is what Spark writes


@pytest.mark.parametrize("name", list(PIPELINES))
def test_signature_predicts_the_state_spark_writes(spark, checkpoints, name):
    make, mode = PIPELINES[name]
    signature = plan_signature(make(spark, 40), output_mode=mode)
    written = state_operators(checkpoints(name))
    assert [o["id"] for o in signature["operators"]] == [o["id"] for o in written]
    for predicted, actual in zip(signature["operators"], written, strict=True):
        assert predicted["spark_name"] == actual["name"]
        stores = {s["name"]: s for s in predicted["stores"]}
        assert sorted(stores) == sorted(s["name"] for s in actual["stores"])
        for store in actual["stores"]:
            key_names, key_types = restore_compat.schema_fields(store["key_schema"])
            value_names, value_types = restore_compat.schema_fields(store["value_schema"])
            p = stores[store["name"]]
            assert (p["key_names"], p["key_types"]) == (key_names, key_types), (name, store["name"])
            assert (p["value_names"], p["value_types"]) == (value_names, value_types), (name, store["name"])
    offsets = (checkpoints(name) / "offsets" / "0").read_text().splitlines()[2:]
    assert len(signature["sources"]) == len(offsets)


def test_signature_details_of_known_plans(spark):
    computed = plan_signature(clicks(spark).groupBy(F.upper("url")).count())["operators"][0]
    assert (computed["key_names"], computed["key_exprs"]) == (["_groupingexpression"], ["upper(url)"])
    chain = plan_signature(windowed_count(watermarked(spark).dropDuplicatesWithinWatermark(["i"])))
    # Spark numbers state operators from the sink: the aggregate (outermost) is operator 0.
    assert [(o["id"], o["kind"]) for o in chain["operators"]] == [(0, "aggregate"), (1, "deduplicateWithinWatermark")]
    assert chain["sources"] == [{"format": "datagen", "options": {"seed": "1"}}]
    redis = (
        spark.readStream.format("redis_stream")
        .schema(EVENTS_DDL)
        .options(url="redis://nowhere.invalid:1/0", stream="clicks")
        .load()
    )  # planning never connects
    sig = plan_signature(
        redis.union(clicks(spark, seed=7).select("url", "user_id", F.col("i").alias("n"), "event_time"))
        .groupBy("user_id")
        .count()
    )
    assert sig["sources"] == [
        {"format": "redis_stream", "options": {"stream": "clicks"}},
        {"format": "datagen", "options": {"seed": "7"}},
    ]
    assert plan_signature(clicks(spark).limit(5), output_mode="append")["operators"][0]["kind"] == "limit"
    assert plan_signature(spark.range(3))["streaming"] is False


# ---------------------------------------------------------------- the check before a restore


def test_changed_grouping_key_is_refused_and_the_same_pipeline_passes(spark, checkpoints, tmp_path):
    cp = checkpoints("windowed count by url")
    meta = take_savepoint(cp, tmp_path / "sp", plan_signature(windowed_count(watermarked(spark)), output_mode="update"))
    same = windowed_count(watermarked(spark, 80))
    assert check_before_start(same, meta, shuffle_partitions=None, allow_non_restored_state=False) == []
    assert check_before_start(same, meta, shuffle_partitions=1, allow_non_restored_state=False) == []
    by_user = windowed_count(watermarked(spark, 80), key="user_id")
    for recorded in (meta, take_savepoint(cp, tmp_path / "old", None)):  # the recorded plan; the schema files alone
        with pytest.raises(IncompatibleStateError) as err:
            check_before_start(by_user, recorded, shuffle_partitions=None, allow_non_restored_state=False)
        text = str(err.value)
        assert "operator 0 (aggregate by window, url)" in text and "user_id" in text, text
        assert "What to do:" in text and "fresh job" in text
    with pytest.raises(IncompatibleStateError) as err:
        check_before_start(same, meta, shuffle_partitions=4, allow_non_restored_state=False)
    assert "set it to 1" in str(err.value)


def test_changed_key_type_is_refused_from_the_schema_files(spark, checkpoints, tmp_path):
    meta = take_savepoint(checkpoints("windowed count by url"), tmp_path / "sp", None)
    with pytest.raises(IncompatibleStateError) as err:
        check_before_start(
            windowed_count(watermarked(spark), key="i"), meta, shuffle_partitions=None, allow_non_restored_state=False
        )
    assert "url: string), now (window: struct<start:timestamp,end:timestamp>, i: bigint)" in str(err.value)


def test_allow_non_restored_state_drops_a_trailing_operator_that_spark_then_restores_without(
    spark, checkpoints, tmp_path
):
    name = "dedupe within watermark, then windowed count"
    savepoint = tmp_path / "sp"
    recorded = plan_signature(PIPELINES[name][0](spark, 40), output_mode="append")
    meta = take_savepoint(checkpoints(name), savepoint, recorded)
    without_dedupe = windowed_count(watermarked(spark, 80))
    with pytest.raises(IncompatibleStateError, match="allowNonRestoredState"):
        check_before_start(without_dedupe, meta, shuffle_partitions=None, allow_non_restored_state=False)
    drop = check_before_start(without_dedupe, meta, shuffle_partitions=None, allow_non_restored_state=True)
    assert drop == [1]
    # The runner then restores without the dropped operator's state, and Spark (which refuses any
    # operator list other than the checkpoint's) accepts the new query and continues.
    restored = tmp_path / "restored"
    storage.restore(savepoint, restored, drop_operators=drop)
    assert not (restored / "state" / "1").exists()
    first = storage.latest_committed_batch(restored)
    run_to_end(without_dedupe, restored, "append")
    assert storage.latest_committed_batch(restored) > first
    # The dedupe without the aggregate would be operator 0 reading the aggregate's state: refused.
    only_dedupe = watermarked(spark, 80).dropDuplicatesWithinWatermark(["i"])
    with pytest.raises(IncompatibleStateError, match="can only drop the state of operators numbered after"):
        check_before_start(only_dedupe, meta, shuffle_partitions=None, allow_non_restored_state=True)


# ---------------------------------------------------------------- the dispatcher's check, through the planner

PIPELINE_FILE = """
from pyspark.sql import functions as F

print("a pipeline printing while it is imported")  # must not spoil the planner's stdout


def build(ctx):
    key = ctx.args[0]
    events = ctx.sources.redis_stream("clicks", schema="{ddl}")
    counts = events.groupBy(key).agg(F.count("*").alias("count"))
    return ctx.sinks.sql_table(counts, "counts", key_columns=[key])
"""


def test_dispatcher_refuses_a_changed_pipeline_through_the_planner(spark, tmp_path, caplog):
    """One cold planner run (~15-30 s): the file, planned in a subprocess, groups by user_id; the
    savepoint was taken by the version grouping by url."""
    artifact = tmp_path / "counts_job.py"
    artifact.write_text(textwrap.dedent(PIPELINE_FILE.format(ddl=EVENTS_DDL)))
    events = (
        spark.readStream.format("redis_stream")
        .schema(EVENTS_DDL)
        .options(url="redis://x.invalid:1/0", stream="clicks")
        .load()
    )
    old_plan = plan_signature(events.groupBy("url").agg(F.count("*").alias("count")), output_mode="update")
    meta = {
        "format": "headrace-snapshot/1",
        "job_id": "e" * 32,
        "checkpoint_id": 5,
        "kind": "savepoint",
        "pipeline": {"artifact_sha256": "1" * 64, "entry": "build", "args": ["url"], "plan": old_plan},
        "spark": {
            "batch_id": 4,
            "state_partitions": 2,
            "source_offsets": [{"id": "5-0"}],
            "operators": [{"id": 0, "name": "stateStoreSave", "stores": []}],
        },
    }
    caplog.set_level(logging.INFO, logger=restore_check.__name__)
    t0 = time.monotonic()
    with pytest.raises(restore_check.RestoreIncompatible) as err:
        restore_check.check_restore(
            python=sys.executable,
            artifact_path=str(artifact),
            artifact_sha256="2" * 64,
            entry="build",
            args=["user_id"],
            parallelism=2,
            snapshot_meta=meta,
            config={"spark.sql.shuffle.partitions": "2", "sink_url": "sqlite:///:memory:"},
        )
    elapsed = time.monotonic() - t0
    assert "savepoint 5 of job" in err.value.message
    assert "operator 0 (aggregate by url): its key changed from (url) to (user_id)" in err.value.message
    assert "fresh job" in err.value.hint
    assert any("planned" in r.getMessage() for r in caplog.records), f"planner did not answer ({elapsed:.1f} s)"


def test_planner_timeout_is_killed_and_leaves_the_decision_to_the_driver(tmp_path, caplog):
    artifact = tmp_path / "slow.py"
    artifact.write_text("def build(ctx):\n    raise AssertionError('never reached')\n")
    # batch_id >= 0: the snapshot holds state, so the (changed) pipeline must be planned.
    meta = {"pipeline": {"artifact_sha256": "1" * 64}, "spark": {"batch_id": 3, "state_partitions": 2}}
    caplog.set_level(logging.WARNING, logger=restore_check.__name__)
    restore_check.check_restore(
        python=sys.executable,
        artifact_path=str(artifact),
        artifact_sha256="2" * 64,
        entry="build",
        args=[],
        config={},
        parallelism=1,
        snapshot_meta=meta,
        timeout_s=1.0,
    )
    [record] = [r for r in caplog.records if "did not finish" in r.getMessage()]
    pid = record.args[0]
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
