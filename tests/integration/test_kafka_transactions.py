"""The exactly-once Kafka sink's writer against a real broker (no Spark): what read_committed
consumers see before and after a checkpoint's commit, fencing of older attempts by the broker,
and what a restore finds in the sink's marker."""

from __future__ import annotations

import uuid

import pytest

from services.taskmanager.runtime.connectors import SinkFencedError, SinkOwner
from services.taskmanager.runtime.connectors.kafka_transactions import (
    MARKER_PARTITION,
    Marker,
    TransactionalWriter,
    names,
)
from services.taskmanager.runtime.connectors.sinks import SinkAheadOfRestore
from tests.kafka_support import read_all


def rows(start: int, count: int):
    return lambda: iter([(f"{i}".encode(), None, None, None) for i in range(start, start + count)])


def writer(kafka, topic: str, lineage: str, job: str = "job-1") -> TransactionalWriter:
    return TransactionalWriter(
        topic=topic,
        client={"bootstrap.servers": kafka.bootstrap},
        sink_id=f"{lineage}:{topic}",
        lineage=lineage,
        job_id=job,
        transaction_timeout_ms=60_000,
    )


def take_over(w: TransactionalWriter, fence: int, restored_batch: int, owner: SinkOwner, early: bool) -> None:
    """As a restarted attempt does: with `early`, the fencing that needs no restored batch runs
    first (beside the snapshot's restore, runtime/restore.py)."""
    if early:
        w.fence_early(fence, owner)
    w.prepare(fence, restored_batch, owner)


def marker_of(kafka, topic: str, lineage: str) -> Marker | None:
    """The sink's marker as any client of the broker reads it: its consumer group's offset."""
    from confluent_kafka import Consumer, TopicPartition

    _txn_id, group = names(lineage, f"{lineage}:{topic}", "headrace-")
    consumer = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": group, "enable.auto.commit": "false"})
    try:
        found = consumer.committed([TopicPartition(topic, MARKER_PARTITION)], timeout=10)
        return Marker.decode(found[0].metadata) if found and found[0].offset >= 0 else None
    finally:
        consumer.close()


@pytest.fixture
def topic(kafka):
    return kafka.create_topic(f"out-{uuid.uuid4().hex[:8]}", partitions=2)


def test_batches_become_visible_only_at_the_checkpoints_commit(kafka, topic):
    w = writer(kafka, topic, "lin-a")
    w.prepare(1, -1, SinkOwner("lin-a", "job-1"))
    w.write_batch(rows(0, 100), 0)
    w.write_batch(rows(100, 50), 1)
    assert read_all(kafka.bootstrap, topic, settle_s=1.5) == []  # flushed, not committed
    assert len(read_all(kafka.bootstrap, topic, committed_only=False, settle_s=1.5)) == 150
    with w.hold() as last:
        assert last == 1
        w.commit(1, checkpoint_id=7, path="/chk-7", kind="checkpoint")
    assert sorted(int(v) for v in read_all(kafka.bootstrap, topic)) == list(range(150))
    w.close(abort=True)


def test_a_newer_attempt_fences_the_old_producer_and_drops_its_open_transaction(kafka, topic):
    old = writer(kafka, topic, "lin-b")
    old.prepare(1, -1, SinkOwner("lin-b", "job-1"))
    old.write_batch(rows(0, 10), 0)
    new = writer(kafka, topic, "lin-b")
    new.prepare(2, -1, SinkOwner("lin-b", "job-1"))  # as a restarted attempt does: aborts old's transaction
    with pytest.raises(SinkFencedError):  # the zombie can neither write nor commit
        old.write_batch(rows(10, 10), 1)
    with pytest.raises(SinkFencedError), old.hold():
        old.commit(0, checkpoint_id=1, path="/p", kind="checkpoint")
    new.write_batch(rows(100, 5), 0)
    with new.hold():
        new.commit(0, checkpoint_id=2, path="/chk-2", kind="checkpoint")
    assert sorted(int(v) for v in read_all(kafka.bootstrap, topic)) == list(range(100, 105))
    # An attempt older than the one that holds the sink, starting late, is refused by the marker.
    late = writer(kafka, topic, "lin-b")
    with pytest.raises(SinkFencedError):
        late.prepare(1, -1, SinkOwner("lin-b", "job-1"))
    for w in (old, new, late):
        w.close(abort=True)


@pytest.mark.parametrize("early", [False, True], ids=["fenced-after-restore", "fenced-beside-restore"])
def test_a_commit_whose_acknowledgement_was_lost_sends_the_next_attempt_to_that_checkpoint(kafka, topic, early):
    first = writer(kafka, topic, "lin-c")
    first.prepare(1, 4, SinkOwner("lin-c", "job-1"))
    first.write_batch(rows(0, 20), 5)
    with first.hold():
        first.commit(5, checkpoint_id=3, path="/ckpt/chk-3", kind="checkpoint")
    first.close(abort=False)
    # The JobManager never heard of checkpoint 3: the next attempt of the job restores batch 4.
    second = writer(kafka, topic, "lin-c")
    with pytest.raises(SinkAheadOfRestore) as ahead:
        take_over(second, 2, 4, SinkOwner("lin-c", "job-1"), early)
    assert (ahead.value.path, ahead.value.batch_id) == ("/ckpt/chk-3", 5)
    second.prepare(2, 5, SinkOwner("lin-c", "job-1"))  # restored that checkpoint instead
    assert second.write_batch(rows(0, 20), 5) == 0  # batch 5 is already visible: skipped
    second.write_batch(rows(20, 5), 6)
    with second.hold():
        second.commit(6, checkpoint_id=4, path="/ckpt/chk-4", kind="checkpoint")
    assert sorted(int(v) for v in read_all(kafka.bootstrap, topic)) == list(range(25))
    second.close(abort=True)


@pytest.mark.parametrize("early", [False, True], ids=["fenced-after-restore", "fenced-beside-restore"])
def test_a_new_job_restored_from_an_older_savepoint_writes_the_later_batches_again(kafka, topic, early):
    first = writer(kafka, topic, "lin-d", job="job-1")
    first.prepare(1, -1, SinkOwner("lin-d", "job-1"))
    first.write_batch(rows(0, 10), 0)
    first.write_batch(rows(10, 10), 1)
    with first.hold():
        first.commit(1, checkpoint_id=2, path="/sp-1", kind="savepoint")
    first.close(abort=False)
    rollback = writer(kafka, topic, "lin-d", job="job-2")
    take_over(rollback, 5, 0, SinkOwner("lin-d", "job-2", generation=1), early)  # from a savepoint at batch 0
    assert rollback.write_batch(rows(10, 10), 1) == 10  # re-emitted: Kafka cannot take it back
    with rollback.hold():
        rollback.commit(1, checkpoint_id=1, path="/chk-1", kind="checkpoint")
    assert len(read_all(kafka.bootstrap, topic)) == 30
    rollback.close(abort=True)


def test_fencing_beside_the_restore_fences_the_zombie_and_claims_the_marker_before_the_restore_ends(kafka, topic):
    old = writer(kafka, topic, "lin-e")
    old.prepare(1, -1, SinkOwner("lin-e", "job-1"))
    old.write_batch(rows(0, 10), 0)
    with old.hold():
        old.commit(0, checkpoint_id=1, path="/chk-1", kind="checkpoint")
    old.write_batch(rows(10, 10), 1)  # open when its driver is killed
    new = writer(kafka, topic, "lin-e")
    new.fence_early(2, SinkOwner("lin-e", "job-1"))  # the snapshot's restore is still running
    with pytest.raises(SinkFencedError):
        old.write_batch(rows(20, 10), 2)
    assert marker_of(kafka, topic, "lin-e").fence == 2  # claimed: an attempt older than 2 now stops
    new.prepare(2, 0, SinkOwner("lin-e", "job-1"))  # the restore ended at batch 0
    assert new.write_batch(rows(0, 10), 0) == 0  # visible already
    new.write_batch(rows(10, 10), 1)
    with new.hold():
        new.commit(1, checkpoint_id=2, path="/chk-2", kind="checkpoint")
    assert sorted(int(v) for v in read_all(kafka.bootstrap, topic)) == list(range(20))
    for w in (old, new):
        w.close(abort=True)


def test_the_marker_round_trips_and_foreign_metadata_is_no_marker():
    m = Marker(batch=3, fence=9, job="j", lineage="l", checkpoint_id=4, path="/x", kind="checkpoint")
    assert Marker.decode(m.encode()) == m
    for text in (None, "", "{}", "[1]", '{"batch": "3", "fence": 1}', "not json"):
        assert Marker.decode(text) is None
