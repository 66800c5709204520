"""Kafka as a streaming source: Spark's own `spark-sql-kafka-0-10` connector (its jars are on every
driver's and executor's class path, shared/jars.py), with Headrace's checks in front of it.

The offsets a micro-batch read are in Spark's offset log (`offsets/<batch>` of the query's
checkpoint) and its initial offsets in `sources/0/`: both are inside every Headrace checkpoint
and savepoint (they are copies of the live Spark checkpoint at a committed batch), so a restored
job reads on from exactly where its snapshot was taken, at any parallelism. The restore check
compares the subscription (`subscribe`, `subscribePattern` or `assign`, plan_signature.py): a
changed topic list is named in its answer. New partitions of a subscribed topic are read from
their start as Spark discovers them.

Before the query starts, `check_reachable` asks the brokers for the topics (bounded, with a
waiting reason while the brokers do not answer), so an unreachable address or a topic that does
not exist is a task failure that names it, instead of a query that waits silently (Spark's
consumer retries a missing topic forever).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from shared.errors import TaskError

from .kafka_options import KafkaOptionError, client_settings, connection_only, masked, normalise, to_librdkafka

STARTING = ("earliest", "latest")
REACHABLE_TIMEOUT_S = 60.0
WAITING_AFTER_S = 3.0


class KafkaUnavailable(TaskError, RuntimeError):
    """The brokers did not answer, or a topic the source names does not exist."""


def subscription(topics: str | Sequence[str] | None, pattern: str | None) -> tuple[str, str]:
    """Spark's subscription option for `topics` or `pattern` (exactly one of them)."""
    if (topics is None) == (pattern is None):
        raise KafkaOptionError("ctx.sources.kafka needs topics (a name or a list) or pattern=..., not both")
    if pattern is not None:
        if not isinstance(pattern, str) or not pattern:
            raise KafkaOptionError(f"pattern must be a regular expression string, got {pattern!r}")
        try:
            re.compile(pattern)
        except re.error as exc:
            raise KafkaOptionError(f"pattern {pattern!r} is not a regular expression: {exc}") from None
        return "subscribePattern", pattern
    names = [topics] if isinstance(topics, str) else list(topics or [])
    if not names or not all(isinstance(t, str) and t.strip() for t in names):
        raise KafkaOptionError(f"topics must be a topic name or a non-empty list of names, got {topics!r}")
    return "subscribe", ",".join(t.strip() for t in names)


def starting_option(starting_offsets: str | Mapping[str, Any]) -> str:
    """`earliest`, `latest`, or per-partition offsets as Spark's JSON ({"topic": {"0": 42}})."""
    if isinstance(starting_offsets, str):
        if starting_offsets in STARTING:
            return starting_offsets
        try:
            parsed = json.loads(starting_offsets)
        except ValueError:
            parsed = None
        if not isinstance(parsed, dict):
            raise KafkaOptionError(
                f"starting_offsets must be 'earliest', 'latest' or per-partition offsets "
                f'such as {{"topic": {{"0": 42}}}}, got {starting_offsets!r}'
            )
        return starting_offsets
    if isinstance(starting_offsets, Mapping):
        return json.dumps(starting_offsets)
    raise KafkaOptionError(f"starting_offsets must be 'earliest', 'latest' or a mapping, got {starting_offsets!r}")


def kafka_source(
    spark: Any,
    topics: str | Sequence[str] | None,
    *,
    pattern: str | None,
    bootstrap_servers: str,
    starting_offsets: str | Mapping[str, Any] = "earliest",
    options: Mapping[str, Any] | None = None,
    on_wait: Callable[[str | None], None] | None = None,
    check: bool = True,
) -> Any:
    """Spark's Kafka source DataFrame (key, value, topic, partition, offset, timestamp,
    timestampType[, headers]) after the brokers answered and the topics exist (`check`: the
    restore check's planner reaches no broker)."""
    kind, value = subscription(topics, pattern)
    opts = normalise(options, bootstrap_servers=bootstrap_servers)
    opts[kind] = value
    opts.setdefault("startingOffsets", starting_option(starting_offsets))
    if check:
        check_reachable(opts, names=value.split(",") if kind == "subscribe" else [], on_wait=on_wait)
    return spark.readStream.format("kafka").options(**opts).load()


class RecentListings:
    """The topics the same brokers listed moments ago: a pipeline's sources and sinks on the same
    brokers are checked in one build, and each listing is a new client's round trip (~60 ms,
    bench/kafka_build_cost.py). Only a listing that has every name counts; a name missing from it
    asks the brokers again (the topic may have been created since)."""

    FRESH_S = 10.0

    def __init__(self) -> None:
        self._listed: dict[tuple[tuple[str, str], ...], tuple[float, frozenset[str]]] = {}

    @staticmethod
    def _key(settings: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
        return tuple(sorted((str(k), str(v)) for k, v in settings.items()))

    def note(self, settings: Mapping[str, Any], topics: Any) -> None:
        self._listed[self._key(settings)] = (time.monotonic(), frozenset(topics))

    def has_all(self, settings: Mapping[str, Any], names: Sequence[str]) -> bool:
        at, topics = self._listed.get(self._key(settings), (float("-inf"), frozenset()))
        return time.monotonic() - at < self.FRESH_S and all(n in topics for n in names)


_RECENT = RecentListings()


def check_reachable(
    opts: Mapping[str, str],
    *,
    names: Sequence[str],
    on_wait: Callable[[str | None], None] | None = None,
    timeout_s: float = REACHABLE_TIMEOUT_S,
) -> None:
    """Return once the brokers list their topics and every name in `names` is one of them."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    bootstrap = opts["kafka.bootstrap.servers"]
    try:
        settings: dict[str, Any] = dict(to_librdkafka(connection_only(client_settings(opts))))
    except KafkaOptionError:
        return  # settings only Spark's Java client understands: Spark's own errors will have to do
    if _RECENT.has_all(settings, names):
        return
    admin = AdminClient(settings)
    started = time.monotonic()
    told = False
    try:
        while True:
            try:
                listed = admin.list_topics(timeout=min(5.0, timeout_s))
                break
            except KafkaException as exc:
                waited = time.monotonic() - started
                if waited >= timeout_s:
                    raise KafkaUnavailable(
                        f"the Kafka brokers at {bootstrap} did not answer within {timeout_s:.0f} s "
                        f"({exc.args[0] if exc.args else exc}); options: {masked(opts)}"
                    ) from None
                if on_wait is not None and waited >= WAITING_AFTER_S and not told:
                    on_wait(f"waiting for the Kafka brokers at {bootstrap} (they do not answer yet)")
                    told = True
    finally:
        if told and on_wait is not None:
            on_wait(None)
    _RECENT.note(settings, listed.topics)
    missing = [n for n in names if n not in listed.topics]
    if missing:
        raise KafkaUnavailable(
            f"the Kafka topic(s) {', '.join(missing)} do not exist on {bootstrap} (topics there: "
            f"{', '.join(sorted(t for t in listed.topics if not t.startswith('__'))[:20]) or 'none'}); create them "
            "(`headrace kafka create-topic NAME --partitions N`) or fix the name"
        )
