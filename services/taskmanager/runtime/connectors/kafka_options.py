"""Kafka client options as a pipeline gives them, for both Kafka connectors.

A pipeline passes Kafka client settings the way Spark's Kafka connector takes them: `kafka.`
followed by the Java client's name (`kafka.security.protocol`, `kafka.sasl.mechanism`,
`kafka.sasl.jaas.config`, `kafka.ssl.truststore.location`, ...); other keys are the connector's
own (`maxOffsetsPerTrigger`, `failOnDataLoss`, `minPartitions`, ...). Spark's source and
at-least-once sink take them as they are. The exactly-once sink writes through librdkafka
(confluent-kafka), whose names are mostly the Java client's: `to_librdkafka` translates what
differs and refuses, by name, what it cannot (a JAAS module other than PLAIN/SCRAM, Java key
stores), instead of connecting with half the settings.

Credentials among the options are secrets: `masked` is what logs, errors and descriptions show.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from shared.errors import ConfigError

KAFKA_PREFIX = "kafka."
# Option names whose values are never shown (the key holds one of these words).
SECRET_WORDS = ("password", "secret", "jaas", "token", "key")
MASK = "****"
# Client settings the connectors set themselves: a pipeline must not override them.
OWNED = {
    "bootstrap.servers",
    "transactional.id",
    "enable.idempotence",
    "group.id",
    "isolation.level",
    "key.serializer",
    "value.serializer",
    "key.deserializer",
    "value.deserializer",
}
# Java client names that librdkafka spells differently (or not at all).
_JAVA_TO_RDKAFKA = {
    "ssl.truststore.location": None,  # a Java key store: librdkafka takes PEM files (ssl.ca.location)
    "ssl.keystore.location": None,
    "ssl.endpoint.identification.algorithm": "ssl.endpoint.identification.algorithm",
    "max.request.size": "message.max.bytes",
    "buffer.memory": "queue.buffering.max.kbytes",
    "delivery.timeout.ms": "message.timeout.ms",
}
_JAAS = re.compile(r"""(?P<module>[\w.]+)\s+required(?P<args>(?:\s+\w+\s*=\s*"[^"]*")*)\s*;?\s*$""")
_JAAS_ARG = re.compile(r"""(\w+)\s*=\s*"([^"]*)\"""")
_JAAS_MODULES = (
    "org.apache.kafka.common.security.plain.PlainLoginModule",
    "org.apache.kafka.common.security.scram.ScramLoginModule",
)


class KafkaOptionError(ConfigError, ValueError):
    """A Kafka option the connector cannot use; the message names it and says what to write."""


def is_secret(key: str) -> bool:
    lowered = key.lower()
    return any(word in lowered for word in SECRET_WORDS)


def masked(options: Mapping[str, Any]) -> dict[str, Any]:
    """The options as they may be shown: secrets replaced by ****."""
    return {k: (MASK if is_secret(k) else v) for k, v in options.items()}


def normalise(options: Mapping[str, Any] | None, *, bootstrap_servers: str) -> dict[str, str]:
    """The connector options with `kafka.bootstrap.servers` set; values as strings. Raises
    KafkaOptionError for a non-string key or a client setting the connector owns."""
    out: dict[str, str] = {}
    for key, value in (options or {}).items():
        if not isinstance(key, str) or not key:
            raise KafkaOptionError(f"Kafka option names must be non-empty strings, got {key!r}")
        if key.startswith(KAFKA_PREFIX) and key[len(KAFKA_PREFIX) :] in OWNED:
            raise KafkaOptionError(
                f"the Kafka option {key!r} is set by Headrace's connector and cannot be "
                "overridden (bootstrap servers: pass bootstrap_servers=...)"
            )
        out[key] = value if isinstance(value, str) else str(value).lower() if isinstance(value, bool) else str(value)
    if not bootstrap_servers or not isinstance(bootstrap_servers, str):
        raise KafkaOptionError(
            "a Kafka connector needs bootstrap_servers='host:port[,host:port]' (or a cluster "
            "started with `headrace up --kafka`, whose broker is the default)"
        )
    out[f"{KAFKA_PREFIX}bootstrap.servers"] = bootstrap_servers
    return out


def client_settings(options: Mapping[str, str]) -> dict[str, str]:
    """The `kafka.*` options without their prefix: the Java client's settings."""
    return {k[len(KAFKA_PREFIX) :]: v for k, v in options.items() if k.startswith(KAFKA_PREFIX)}


# What reaching the brokers takes (an admin client's check needs no more; consumer and producer
# tuning such as fetch.max.wait.ms is for Spark's own clients and has other names in librdkafka).
_CONNECTION_PREFIXES = ("bootstrap.servers", "security.", "sasl.", "ssl.", "client.id", "socket.", "reconnect.")


def connection_only(settings: Mapping[str, str]) -> dict[str, str]:
    """The settings that say how to reach and authenticate to the brokers."""
    return {k: v for k, v in settings.items() if k.startswith(_CONNECTION_PREFIXES)}


def to_librdkafka(settings: Mapping[str, str]) -> dict[str, str]:
    """Java client settings as librdkafka's. SASL PLAIN/SCRAM credentials in `sasl.jaas.config`
    become `sasl.username`/`sasl.password`; what has no librdkafka equivalent is refused."""
    out: dict[str, str] = {}
    for key, value in settings.items():
        if key == "sasl.jaas.config":
            out.update(_jaas_credentials(value))
            continue
        if key in _JAVA_TO_RDKAFKA:
            target = _JAVA_TO_RDKAFKA[key]
            if target is None:
                raise KafkaOptionError(
                    f"kafka.{key} names a Java key store, which the exactly-once sink's client (librdkafka) "
                    "cannot read: give PEM files instead (kafka.ssl.ca.location, kafka.ssl.certificate.location, "
                    "kafka.ssl.key.location), or use delivery='at-least-once' (Spark's own sink)"
                )
            if key == "buffer.memory":
                value = str(max(1, int(value) // 1024))
            out[target] = value
            continue
        out[key] = value
    return out


def _jaas_credentials(config: str) -> dict[str, str]:
    found = _JAAS.match(config.strip())
    if found is None or found.group("module") not in _JAAS_MODULES:
        raise KafkaOptionError(
            "kafka.sasl.jaas.config: the exactly-once sink understands PlainLoginModule and ScramLoginModule "
            'with username="..." password="..."; for other mechanisms give librdkafka\'s own settings '
            "(kafka.sasl.username, kafka.sasl.password, kafka.sasl.oauthbearer.*)"
        )
    args = dict(_JAAS_ARG.findall(found.group("args")))
    if "username" not in args or "password" not in args:
        raise KafkaOptionError('kafka.sasl.jaas.config needs both username="..." and password="..."')
    return {"sasl.username": args["username"], "sasl.password": args["password"]}
