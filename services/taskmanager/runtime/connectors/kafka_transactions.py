"""The exactly-once Kafka sink's writer: micro-batches into a Kafka transaction that commits when
a Headrace checkpoint is taken, Flink's two-phase commit on Spark's micro-batches.

Why a transaction per checkpoint, not per micro-batch: a restarted attempt starts from the latest
completed checkpoint, whose batch may be several micro-batches behind what the failed attempt
wrote, and re-runs those batches with boundaries of its own (the source plans them anew). Records
a consumer has seen cannot be taken back, so nothing may become visible before the checkpoint that
covers it: the batches between two checkpoints go into one open transaction (flushed to the
brokers as each batch is written: Flink's pre-commit), committed at the checkpoint's barrier.

The barrier (SnapshotServer, snapshots.py): `hold()` stops batches from entering the transaction
and names the last batch that went through the sink; once Spark has committed that batch the
server copies the checkpoint at it, then `commit()` commits the transaction together with a
marker, then the checkpoint is acknowledged. The marker is an offset committed *inside* the
transaction for a consumer group of the sink's own (`headrace-sink.<lineage>.<digest>`, on
partition 0 of the topic, its offset the batch + 1, its metadata the checkpoint: batch, id, path,
job, fence): it is visible exactly when the records are.

What each failure leaves (docs/architecture.md, "Exactly once into Kafka"):
  * before the commit: the transaction is open; the next attempt's `init_transactions` on the same
    transactional id aborts it and fences the old producer (its epoch is bumped), so a zombie
    driver can neither commit nor write. The attempt replays from the last checkpoint.
  * after the commit, before the acknowledgement reached the JobManager: the records are visible
    but the JobManager restores the checkpoint before. The marker says so, and names the
    checkpoint the commit belongs to, whose files were complete before the commit: the new
    attempt of the same job restores that one instead (`SinkAheadOfRestore`), so nothing is
    written twice.
  * a new job restored from an older snapshot of the lineage (a rollback, `-s`): the batches the
    marker covers beyond the snapshot stay visible and are written again; the driver says so in
    its log. Kafka cannot take back committed records.
  * the transaction outlived `transaction.timeout.ms` (checkpoints failing, a paused driver): the
    broker aborted it; the next write or commit fails, so does the task, and its restart replays
    from the last checkpoint.
Another lineage may write the same topic (topics are shared by design); transactional ids are
per lineage and sink, so they never collide.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
from typing import Any

from shared import kafka_delivery
from shared.errors import TaskError

from .kafka_calls import HANG_MARGIN_S, BrokerCalls, KafkaSinkError, bounded
from .kafka_options import KafkaOptionError, connection_only
from .kafka_records import RecordShipper
from .ownership import SinkOwner
from .sinks import SinkAheadOfRestore, SinkFencedError

MARKER_PARTITION = 0


class KafkaTimeoutRefused(TaskError, RuntimeError):
    """The brokers refuse the sink's transaction timeout (above their transaction.max.timeout.ms)."""


@dataclass(frozen=True)
class Marker:
    """What the last commit made visible: the batches up to `batch`, by attempt `fence` of `job`,
    with the checkpoint `checkpoint_id` at `path`."""

    batch: int
    fence: int
    job: str
    lineage: str
    checkpoint_id: int | None = None
    path: str | None = None
    kind: str | None = None

    def encode(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def decode(cls, text: str | None) -> "Marker | None":
        """None for anything that is not a marker of ours (no marker is the fresh state)."""
        try:
            data = json.loads(text or "")
            if (
                not isinstance(data, dict)
                or not isinstance(data.get("batch"), int)
                or not isinstance(data.get("fence"), int)
            ):
                return None
            return cls(
                batch=data["batch"],
                fence=data["fence"],
                job=str(data.get("job") or ""),
                lineage=str(data.get("lineage") or ""),
                checkpoint_id=data.get("checkpoint_id"),
                path=data.get("path"),
                kind=data.get("kind"),
            )
        except (ValueError, TypeError):
            return None


@dataclass(frozen=True)
class EarlyFence:
    """What fence_early() found (`marker`) and whether it claimed that marker for `fence`."""

    lineage: str
    fence: int
    marker: Marker | None
    claimed: bool


def names(lineage: str, sink_id: str, prefix: str) -> tuple[str, str]:
    """(transactional id, marker group) of a lineage's sink: stable across its attempts and jobs."""
    digest = hashlib.sha256(sink_id.encode()).hexdigest()[:12]
    return f"{prefix}{lineage}-{digest}", f"headrace-sink.{lineage}.{digest}"


class TransactionalWriter:
    """One sink's producer, open transaction and marker (driver side)."""

    def __init__(
        self,
        *,
        topic: str,
        client: dict[str, str],
        sink_id: str,
        lineage: str,
        job_id: str,
        transaction_timeout_ms: int,
        prefix: str = "headrace-",
        on_wait: Callable[[str | None], None] | None = None,
    ):
        self.topic, self.client, self.sink_id = topic, dict(client), sink_id
        self.default_owner = SinkOwner(lineage=lineage, job_id=job_id)
        self.transaction_timeout_ms, self.prefix = transaction_timeout_ms, prefix
        self.on_wait = on_wait or (lambda _reason: None)
        self.bootstrap = self.client.get("bootstrap.servers", "?")
        self.calls = BrokerCalls(topic, self.bootstrap, self.on_wait)
        self.records = RecordShipper(topic, self.bootstrap, self.calls)
        self._lock = threading.Lock()
        self._producer: Any = None
        self._group: Any = None  # a consumer only for its group metadata and committed offsets
        self.owner: SinkOwner | None = None
        self.fence = -1
        self.visible: Marker | None = None  # what the last commit made visible
        self.batches_in_txn: list[int] = []
        self.last_seen: int | None = None  # the last batch that went through write_batch
        self._ahead_told: int | None = None  # the restored batch SinkAheadOfRestore was raised for
        self._early: EarlyFence | None = None  # what fence_early() found, for the prepare() after it

    # -- taking the sink over -------------------------------------------------------------
    def fence_early(self, fence: int, owner: SinkOwner | None = None) -> None:
        """The part of prepare() that needs no restored batch, run beside the snapshot's restore
        (runtime/restore.py) because each step is a broker round trip: register the producer
        (older producers fenced, what they left open aborted), read the marker, and, when the
        marker is this job's own (a restart), claim it with this attempt's fence. The marker of
        another job is left as it is: what prepare() makes of it depends on the restored batch."""
        owner = owner or self.default_owner
        self.owner, self.fence = owner, fence
        self.calls.fence = fence
        marker = self._open(owner.lineage)
        claimed = False
        if marker is not None and marker.fence > fence:
            raise SinkFencedError(f"kafka topic {self.topic}", fence, marker.fence)
        if marker is not None and marker.job == owner.job_id and marker.lineage == owner.lineage:
            self._commit(replace(marker, fence=fence))
            claimed = True
        self._early = EarlyFence(lineage=owner.lineage, fence=fence, marker=marker, claimed=claimed)

    def prepare(self, fence: int, restored_batch: int, owner: SinkOwner | None = None) -> None:
        """Fence every older producer of this lineage's sink, read what is visible, claim it
        (the first two already done if fence_early() ran for the same lineage and fence).
        Raises SinkFencedError (a newer attempt holds it) or SinkAheadOfRestore."""
        owner = owner or self.default_owner
        self.owner, self.fence = owner, fence
        self.calls.fence = fence
        early, self._early = self._early, None
        if early is not None and (early.lineage, early.fence) == (owner.lineage, fence):
            marker = early.marker
        else:
            early = None
            marker = self._open(owner.lineage)
        if marker is not None and marker.fence > fence:
            raise SinkFencedError(f"kafka topic {self.topic}", fence, marker.fence)
        if marker is not None and marker.batch > restored_batch:
            if marker.job == owner.job_id and marker.path and self._ahead_told != restored_batch:
                self._ahead_told = restored_batch  # asked again for the same batch: it could not be restored
                raise SinkAheadOfRestore(marker.path, marker.batch, restored_batch)
            print(
                f"kafka sink {self.topic}: batches {restored_batch + 1}..{marker.batch} were committed to the topic "
                f"by job {marker.job} before this restore (at batch {restored_batch}); Kafka cannot take committed "
                "records back, so consumers see them again as this job re-runs them",
                flush=True,
            )
            marker = None
        if early is not None and early.claimed and marker is not None:
            return  # claimed beside the restore, and the restored batch changes nothing about it
        # Claim the sink with this attempt's fence: an older attempt that starts late reads it and
        # stops. What is visible stays as it was (an empty transaction moves only the marker).
        kept = marker or Marker(batch=restored_batch, fence=fence, job=owner.job_id, lineage=owner.lineage)
        self._commit(
            Marker(
                batch=kept.batch,
                fence=fence,
                job=owner.job_id,
                lineage=owner.lineage,
                checkpoint_id=kept.checkpoint_id,
                path=kept.path,
                kind=kept.kind,
            )
        )

    def _open(self, lineage: str) -> Marker | None:
        """The producer (registered: that aborts what an older one left open and fences it) and
        the marker it finds."""
        from confluent_kafka import Consumer, KafkaException, Producer

        self.close(abort=False)  # a second prepare (a restore switched to a newer checkpoint)
        txn_id, group = names(lineage, self.sink_id, self.prefix)
        try:
            self._producer = Producer(
                {
                    **self.client,
                    "transactional.id": txn_id,
                    "transaction.timeout.ms": str(self.transaction_timeout_ms),
                    "on_delivery": self.records.delivered,
                }
            )
            self.records.producer = self._producer
            self._group = Consumer({**connection_only(self.client), "group.id": group, "enable.auto.commit": "false"})
        except KafkaException as exc:  # a setting librdkafka does not take: the pipeline's to fix
            raise KafkaOptionError(
                f"the exactly-once Kafka sink's client refuses its settings: {exc.args[0].str() if exc.args else exc}"
            ) from None
        try:
            self.calls.patiently(
                "registering the transactional producer", lambda t: self._producer.init_transactions(t)
            )
        except KafkaSinkError as exc:
            if "INVALID_TRANSACTION_TIMEOUT" not in str(exc):
                raise
            raise KafkaTimeoutRefused(
                kafka_delivery.broker_refusal(self.transaction_timeout_ms / 1000, self._broker_max_timeout_s())
            ) from None
        return self._read_marker()

    def _broker_max_timeout_s(self) -> float | None:
        """The brokers' transaction.max.timeout.ms, in seconds (None if they do not say)."""
        from confluent_kafka.admin import AdminClient, ConfigResource

        admin = AdminClient(dict(connection_only(self.client)))
        try:
            brokers = admin.list_topics(timeout=10).brokers
            resource = ConfigResource(ConfigResource.Type.BROKER, str(next(iter(brokers))))
            configs = admin.describe_configs([resource], request_timeout=10)[resource].result(10)
            return int(configs["transaction.max.timeout.ms"].value) / 1000
        except Exception:  # noqa: BLE001 - only to word the refusal: the brokers refused either way
            return None

    def write_once(self, rows: Callable[[], Iterator[tuple[Any, ...]]]) -> int:
        """A bounded job's whole output in one transaction, committed once every row is in; a
        run of the same job that finds its own commit (a restart after it) writes nothing."""
        owner = self.owner = self.default_owner
        marker = self._open(owner.lineage)
        if marker is not None and marker.kind == "batch" and marker.job == owner.job_id:
            print(
                f"kafka sink {self.topic}: job {owner.job_id} already committed its output; nothing written", flush=True
            )
            return 0
        self.calls.call("beginning a transaction", self._producer.begin_transaction)
        count = self.records.produce(rows())
        self.records.flush()
        self.batches_in_txn = [0]
        self._commit(Marker(batch=0, fence=0, job=owner.job_id, lineage=owner.lineage, kind="batch"), begun=True)
        return count

    # -- the micro-batches -----------------------------------------------------------------
    def write_batch(self, rows: Callable[[], Iterator[tuple[Any, ...]]], batch_id: int) -> int:
        """Write a micro-batch into the open transaction (flushed, not committed); a batch already
        visible or already in the transaction (Spark re-runs a batch it had not committed) is
        skipped. Returns the records written."""
        with self._lock:
            self.last_seen = batch_id if self.last_seen is None else max(self.last_seen, batch_id)
            if (self.visible is not None and batch_id <= self.visible.batch) or batch_id in self.batches_in_txn:
                print(f"kafka sink {self.topic}: batch {batch_id} is already written; skipped", flush=True)
                return 0
            if not self.batches_in_txn:
                self.calls.call("beginning a transaction", self._producer.begin_transaction)
            count = self.records.produce(rows())
            self.records.flush()
            self.batches_in_txn.append(batch_id)
            return count

    # -- the barrier -----------------------------------------------------------------------
    @contextlib.contextmanager
    def hold(self) -> Iterator[int | None]:
        """No batch enters the transaction meanwhile; yields the last batch that went through."""
        with self._lock:
            yield self.last_seen

    def pending_beyond(self, committed: int | None) -> bool:
        """Whether the transaction holds a batch Spark has not committed (a batch a stop cut off
        after the sink wrote it)."""
        return bool(self.batches_in_txn) and (committed is None or max(self.batches_in_txn) > committed)

    def commit(self, batch_id: int, *, checkpoint_id: int, path: str, kind: str) -> None:
        """Make the transaction's batches (all <= batch_id) visible with the checkpoint's marker.
        Call inside hold(). A transaction without records commits nothing (nothing to show)."""
        if self.owner is None:
            raise KafkaSinkError("the Kafka sink was not prepared")
        if self.batches_in_txn and max(self.batches_in_txn) > batch_id:
            raise KafkaSinkError(
                f"kafka sink {self.topic}: the transaction holds batch {max(self.batches_in_txn)}, "
                f"beyond the checkpoint's batch {batch_id}"
            )
        if not self.batches_in_txn:
            return
        marker = Marker(
            batch=batch_id,
            fence=self.fence,
            job=self.owner.job_id,
            lineage=self.owner.lineage,
            checkpoint_id=checkpoint_id,
            path=path,
            kind=kind,
        )
        self._commit(marker, begun=True)

    def _commit(self, marker: Marker, *, begun: bool = False) -> None:
        from confluent_kafka import TopicPartition

        if not begun:
            self.calls.call("beginning a transaction", self._producer.begin_transaction)
        offsets = [TopicPartition(self.topic, MARKER_PARTITION, marker.batch + 1, marker.encode())]
        group = self._group.consumer_group_metadata()
        # librdkafka 2.16 may never return from this call after the group's coordinator restarted,
        # whatever its timeout: bounded here, the task fails and its restart gets a fresh client.
        self.calls.patiently(
            "adding the sink's marker",
            lambda t: bounded(
                lambda: self._producer.send_offsets_to_transaction(offsets, group, t),
                t + HANG_MARGIN_S,
                "adding the sink's marker to the transaction",
            ),
        )
        self.calls.patiently("committing the transaction", lambda t: self._producer.commit_transaction(t))
        self.visible = marker
        self.batches_in_txn = []

    def _read_marker(self) -> Marker | None:
        from confluent_kafka import TopicPartition

        found = self.calls.patiently(
            "reading the sink's marker",
            lambda t: self._group.committed([TopicPartition(self.topic, MARKER_PARTITION)], timeout=t),
        )
        return Marker.decode(found[0].metadata) if found and found[0].offset >= 0 else None

    def close(self, *, abort: bool) -> None:
        """End the producer; `abort`: end an open transaction now instead of at its timeout (a
        cancel), so read_committed consumers are not held up."""
        if self._producer is not None and abort and self.batches_in_txn:
            with contextlib.suppress(Exception):
                self._producer.abort_transaction(5)
        if self._group is not None:
            with contextlib.suppress(Exception):
                self._group.close()
        self._producer = self._group = self.records.producer = None
