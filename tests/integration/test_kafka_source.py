"""The Kafka source in a real Spark session against a real broker: what the restore check says of
a changed subscription, partitions added to a topic while the query runs, records lost to
retention named in the failure, and bad input refused with clear errors."""

from __future__ import annotations

import time
import uuid

import pytest

from services.taskmanager.runtime.connectors.kafka_options import KafkaOptionError
from services.taskmanager.runtime.connectors.kafka_sink import kafka_sink
from services.taskmanager.runtime.connectors.kafka_source import KafkaUnavailable, kafka_source
from services.taskmanager.runtime.plan_signature import plan_signature
from services.taskmanager.runtime.reports import format_failure
from services.taskmanager.runtime.spark_session import build_spark
from shared import restore_compat
from shared.kafka_delivery import DeliveryError
from shared.ports import free_port
from tests.kafka_support import produce
from tests.waiting import wait_for


@pytest.fixture(scope="module")
def spark(tmp_path_factory):
    session = build_spark(2, tmp_path_factory.mktemp("spark"), shuffle_partitions=2)
    yield session
    session.stop()


def topic(kafka, partitions: int = 1) -> str:
    return kafka.create_topic(f"src-{uuid.uuid4().hex[:8]}", partitions=partitions)


COLLECTED: dict[str, list] = {}


def run_to_memory(df, name: str, checkpoint) -> object:
    """The query's rows collected on the driver (a foreachBatch: it restarts from its checkpoint)."""
    rows = COLLECTED.setdefault(name, [])
    return (
        df.selectExpr("CAST(value AS STRING) AS v", "partition")
        .writeStream.foreachBatch(lambda batch, _id: rows.extend(batch.collect()))
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="200 milliseconds")
        .start()
    )


def wait_rows(spark, name: str, count: int, timeout_s: float = 90) -> list:
    return wait_for(
        f"{count} rows in {name}",
        lambda: list(COLLECTED.get(name, [])),
        timeout_s,
        poll_s=0.3,
        until=lambda rows: len(rows) >= count,
    )


def test_a_changed_subscription_is_named_by_the_restore_check(spark, kafka):
    a, b = topic(kafka), topic(kafka)
    old = plan_signature(kafka_source(spark, a, pattern=None, bootstrap_servers=kafka.bootstrap))
    meta = {"pipeline": {"plan": old}, "spark": {"batch_id": 3, "conf": {}}}
    assert restore_compat.check(meta, old, new_shuffle_partitions=None, allow_non_restored_state=False).ok
    new = plan_signature(kafka_source(spark, [a, b], pattern=None, bootstrap_servers=kafka.bootstrap))
    verdict = restore_compat.check(meta, new, new_shuffle_partitions=None, allow_non_restored_state=False)
    assert not verdict.ok
    text = verdict.message("the savepoint")
    assert a in text and b in text and "subscribe" in text, text
    patterned = plan_signature(kafka_source(spark, None, pattern="src-.*", bootstrap_servers=kafka.bootstrap))
    other = restore_compat.check(meta, patterned, new_shuffle_partitions=None, allow_non_restored_state=False)
    assert "subscribepattern" in other.message("the savepoint").lower()


def test_partitions_added_to_a_topic_are_read(spark, kafka, tmp_path):
    from confluent_kafka.admin import AdminClient, NewPartitions

    name = topic(kafka, partitions=1)
    produce(kafka.bootstrap, name, [f"a{i}" for i in range(50)])
    q = run_to_memory(
        kafka_source(spark, name, pattern=None, bootstrap_servers=kafka.bootstrap), "added", tmp_path / "cp"
    )
    try:
        wait_rows(spark, "added", 50)
        admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
        for future in admin.create_partitions([NewPartitions(name, 3)]).values():
            future.result(30)
        from confluent_kafka import Producer

        producer = Producer({"bootstrap.servers": kafka.bootstrap})
        for i in range(30):
            producer.produce(name, value=f"b{i}".encode(), partition=1 + i % 2)
        assert producer.flush(30) == 0
        rows = wait_rows(spark, "added", 80, timeout_s=120)
        assert {r.partition for r in rows} == {0, 1, 2}
        assert sorted(r.v for r in rows) == sorted([f"a{i}" for i in range(50)] + [f"b{i}" for i in range(30)])
    finally:
        q.stop()


def test_records_lost_to_retention_fail_the_query_naming_partition_and_offsets(spark, kafka, tmp_path):
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    name = topic(kafka)
    produce(kafka.bootstrap, name, [str(i) for i in range(20)])
    source = kafka_source(spark, name, pattern=None, bootstrap_servers=kafka.bootstrap)
    q = run_to_memory(source, "lost", tmp_path / "cp")
    wait_rows(spark, "lost", 20)
    q.processAllAvailable()  # the rows are collected before Spark commits their batch: wait for the commit
    q.stop()
    produce(kafka.bootstrap, name, [str(i) for i in range(20, 60)])
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})  # as retention would: 20..49 go unread
    for future in admin.delete_records([TopicPartition(name, 0, 50)], request_timeout=30).values():
        future.result(30)
    q = run_to_memory(source, "lost2", tmp_path / "cp")
    with pytest.raises(Exception) as failed:
        q.awaitTermination(120)
    text = format_failure(failed.value)
    last = text.strip().splitlines()[-1]
    assert last.startswith(
        f"KafkaDataLoss: Kafka records were lost before this query read them: {name}-0, offsets 20 to 59"
    ), last


def test_bad_input_gets_clear_errors(spark, kafka):
    name = topic(kafka)
    with pytest.raises(KafkaUnavailable) as gone:
        kafka_source(spark, "no-such-topic", pattern=None, bootstrap_servers=kafka.bootstrap)
    assert "no-such-topic" in str(gone.value) and "do not exist" in str(gone.value)
    silent = f"127.0.0.1:{free_port()}"
    waits: list = []
    started = time.monotonic()
    with pytest.raises(KafkaUnavailable) as unreachable:
        from services.taskmanager.runtime.connectors.kafka_source import check_reachable

        check_reachable({"kafka.bootstrap.servers": silent}, names=[name], on_wait=waits.append, timeout_s=8)
    assert time.monotonic() - started < 30
    assert silent in str(unreachable.value)
    assert waits and silent in waits[0] and waits[-1] is None  # a waiting reason, then cleared
    df = kafka_source(spark, name, pattern=None, bootstrap_servers=kafka.bootstrap)
    with pytest.raises(KafkaOptionError) as no_value:
        kafka_sink(
            df.selectExpr("key"),
            name,
            bootstrap_servers=kafka.bootstrap,
            delivery="exactly-once",
            sink_id="l:t",
            lineage="l",
            job_id="j",
            transaction_timeout_s=600,
        )
    assert "'value' column" in str(no_value.value) and "key" in str(no_value.value)
    with pytest.raises(DeliveryError) as misspelt:
        kafka_sink(
            df,
            name,
            bootstrap_servers=kafka.bootstrap,
            delivery="exactly_one",
            sink_id="l:t",
            lineage="l",
            job_id="j",
            transaction_timeout_s=600,
        )
    assert "'exactly-once' or 'at-least-once'" in str(misspelt.value)
    with pytest.raises(KafkaOptionError):
        kafka_source(
            spark,
            name,
            pattern=None,
            bootstrap_servers=kafka.bootstrap,
            options={"kafka.bootstrap.servers": "elsewhere:9092"},
        )
    with pytest.raises(DeliveryError) as short:
        kafka_sink(
            df,
            name,
            bootstrap_servers=kafka.bootstrap,
            delivery="exactly-once",
            sink_id="l:t",
            lineage="l",
            job_id="j",
            transaction_timeout_s=30,
            interval_s=60,
        )
    assert "(1 min)" in str(short.value) and "sink.kafka.transaction-timeout" in str(short.value)
