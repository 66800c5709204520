"""The Kafka sink's delivery guarantees and the transaction timeout of the exactly-once one: pure
rules read by the dispatcher at submission (what a job's configuration already says) and by the
sink when its task starts (what the pipeline and the brokers say).

An exactly-once sink keeps one Kafka transaction open from its first record after a checkpoint
until the next checkpoint commits it (services/taskmanager/runtime/connectors/kafka_transactions.py),
so its `transaction.timeout.ms` must outlast a checkpoint interval with room for the barrier,
and the brokers refuse a timeout above their `transaction.max.timeout.ms` (15 minutes by
default). Flink's KafkaSink defaults to one hour and fails against a default broker; here the
default fits both, and a value that cannot work is refused naming the values.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from shared import durations
from shared.errors import ConfigError

EXACTLY_ONCE = "exactly-once"
AT_LEAST_ONCE = "at-least-once"
DELIVERIES = (EXACTLY_ONCE, AT_LEAST_ONCE)
# The job option that sets the exactly-once sinks' transaction timeout (a Flink duration).
TRANSACTION_TIMEOUT_OPTION = "sink.kafka.transaction-timeout"
DEFAULT_TIMEOUT_S = 10 * 60.0
# Beyond one interval: the barrier waits for the batch in flight, copies the checkpoint, commits.
BARRIER_ROOM_S = 60.0
BROKER_DEFAULT_MAX_S = 15 * 60.0
# The job option that runs a stateless Kafka -> Kafka pipeline in Spark's real-time mode: its value
# is the length of each real-time batch (what a checkpoint covers), e.g. "5 s".
REAL_TIME_OPTION = "headrace.real-time-mode"
REAL_TIME_MIN_S = 1.0


class DeliveryError(ConfigError, ValueError):
    """A delivery guarantee or transaction timeout that cannot work; the message names the values."""


def delivery(word: object) -> str:
    """The delivery guarantee a pipeline asked for, or DeliveryError saying which words exist."""
    if isinstance(word, str):
        spelled = word.strip().lower().replace("_", "-").replace(" ", "-")
        if spelled in DELIVERIES:
            return spelled
    raise DeliveryError(
        f"delivery must be {EXACTLY_ONCE!r} or {AT_LEAST_ONCE!r} (Flink's EXACTLY_ONCE and AT_LEAST_ONCE), got {word!r}"
    )


def default_timeout_s(interval_s: float | None) -> float:
    """The timeout a sink gets when neither the pipeline nor the job sets one."""
    needed = (interval_s or 0.0) + BARRIER_ROOM_S
    return max(DEFAULT_TIMEOUT_S, needed)


def timeout_problem(timeout_s: float, interval_s: float | None) -> str | None:
    """Why `timeout_s` cannot work with checkpoints every `interval_s` (None: not periodic);
    None when it can."""
    if interval_s is None:
        return (
            "an exactly-once Kafka sink commits at checkpoints, and this job takes none: set "
            "execution.checkpointing.interval (e.g. \"10 s\"), or use delivery='at-least-once'"
        )
    if timeout_s < interval_s + BARRIER_ROOM_S:
        return (
            f"the Kafka transaction timeout ({_text(timeout_s)}) must be at least the checkpoint interval "
            f"({_text(interval_s)}) plus {_text(BARRIER_ROOM_S)}: a transaction stays open from one checkpoint "
            f'to the next. Set {TRANSACTION_TIMEOUT_OPTION} to "{_text(interval_s + BARRIER_ROOM_S)}" or more, '
            "or checkpoint more often"
        )
    return None


def broker_refusal(timeout_s: float, broker_max_s: float | None) -> str:
    """What to say when the brokers refuse `timeout_s` (their maximum, if they told it)."""
    limit = f" ({_text(broker_max_s)})" if broker_max_s is not None else ""
    fit = f'"{_text(broker_max_s)}" or less' if broker_max_s is not None else "below it"
    return (
        f"the Kafka brokers refuse the transaction timeout {_text(timeout_s)}: it is above their "
        f"transaction.max.timeout.ms{limit}. Set {TRANSACTION_TIMEOUT_OPTION} to {fit} (with the checkpoint "
        "interval a minute below it), or raise transaction.max.timeout.ms on the brokers"
    )


def _text(seconds: float) -> str:
    if seconds >= 60 and seconds % 60 == 0:
        return f"{int(seconds // 60)} min"
    return f"{seconds:g} s"


def real_time_seconds(value: Any) -> float:
    """A real-time batch's length from the job option (a Flink duration of at least a second)."""
    seconds = durations.parse_flink_duration(value)
    if seconds < REAL_TIME_MIN_S:
        raise DeliveryError(
            f"{REAL_TIME_OPTION} must be at least {REAL_TIME_MIN_S:g} s (each real-time batch "
            f"ends in a checkpoint), got {value!r}"
        )
    return seconds


def real_time_trigger(config: Mapping[str, Any] | None) -> str | None:
    """Spark's `realTime` trigger for a job that asks for the real-time mode, else None."""
    value = (config or {}).get(REAL_TIME_OPTION)
    if value in (None, "", False, "false", "off"):
        return None
    return f"{real_time_seconds(value):g} seconds"
