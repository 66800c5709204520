"""Topics on a Kafka broker, through confluent_kafka's AdminClient (`headrace kafka`, the tests).

The one module that speaks AdminClient: its futures, its error codes and librdkafka's own log
lines (which it would print to stderr on every failed connection) stay here, and callers get
plain results or one of the errors below, each a sentence naming the broker's address.
The broker of `headrace up --kafka` creates no topic by itself (auto.create.topics.enable is off:
a misspelt name is an error, not a new topic), so a topic is created here first.
"""

from __future__ import annotations

import logging
from typing import Any

from shared import errors

INTERNAL_PREFIX = "__"  # the broker's own topics (consumer offsets, transaction state)
LIST_TIMEOUT_S = 10.0
CREATE_TIMEOUT_S = 30.0

# librdkafka logs every refused connection at ERROR; the failure reaches the caller as an error.
_librdkafka = logging.getLogger("headrace.kafka.librdkafka")
_librdkafka.addHandler(logging.NullHandler())
_librdkafka.propagate = False


class KafkaTopicsError(errors.ClusterError, RuntimeError):
    """The broker could not be asked, or refused what it was asked; the message says which."""


class KafkaUnreachable(KafkaTopicsError):
    pass


class TopicExists(KafkaTopicsError):
    pass


def admin_client(bootstrap: str):
    from confluent_kafka.admin import AdminClient

    config: dict[str, Any] = {"bootstrap.servers": bootstrap, "logger": _librdkafka}
    return AdminClient(config)


def unreachable(bootstrap: str, why: str) -> KafkaUnreachable:
    return KafkaUnreachable(
        f"cannot reach the Kafka broker at {bootstrap} ({why}): is it running? "
        "(headrace up --kafka; docs/runbooks/kafka-broker.md)"
    )


def topics(bootstrap: str, *, include_internal: bool = False, timeout_s: float = LIST_TIMEOUT_S) -> dict[str, int]:
    """Topic name -> partition count, sorted by name; the broker's own topics only if asked."""
    from confluent_kafka import KafkaException

    try:
        metadata = admin_client(bootstrap).list_topics(timeout=timeout_s)
    except KafkaException as exc:
        raise unreachable(bootstrap, exc.args[0].str()) from None
    return {
        name: len(topic.partitions)
        for name, topic in sorted(metadata.topics.items())
        if include_internal or not name.startswith(INTERNAL_PREFIX)
    }


def create_topic(
    bootstrap: str, name: str, *, partitions: int = 1, replication_factor: int = 1, timeout_s: float = CREATE_TIMEOUT_S
) -> None:
    """Create `name`; TopicExists if it is there already, KafkaUnreachable if nobody answers."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import NewTopic

    topics(bootstrap, timeout_s=min(timeout_s, LIST_TIMEOUT_S))  # unreachable: said as such, not as a timeout
    client = admin_client(bootstrap)  # kept until the future is done: it dies with its client
    future = client.create_topics(
        [NewTopic(name, num_partitions=partitions, replication_factor=replication_factor)],
        operation_timeout=timeout_s,
        request_timeout=timeout_s,
    )[name]
    try:
        future.result(timeout=timeout_s + 5)
    except KafkaException as exc:
        error = exc.args[0]
        if error.code() == KafkaError.TOPIC_ALREADY_EXISTS:
            raise TopicExists(f"the topic {name} already exists on {bootstrap} (headrace kafka topics)") from None
        if error.code() in (KafkaError._TRANSPORT, KafkaError._TIMED_OUT):
            raise unreachable(bootstrap, error.str()) from None
        raise KafkaTopicsError(f"the broker at {bootstrap} refused to create the topic {name}: {error.str()}") from None
    except TimeoutError:
        raise KafkaTopicsError(
            f"the broker at {bootstrap} did not confirm the topic {name} within "
            f"{timeout_s + 5:.0f} s; see headrace kafka topics"
        ) from None
