"""Kafka as a sink, in two delivery guarantees.

`at-least-once` is Spark's own Kafka sink (`format("kafka")`): every executor writes its rows
with a plain producer; after a failure Spark re-runs the micro-batch and consumers may see its
records twice ("Apache Kafka only supports at least once write semantics", Spark's Kafka guide).

`exactly-once` is Headrace's: each micro-batch is collected to the driver and written into the
sink's open Kafka transaction, committed at the next checkpoint (kafka_transactions.py), so a
`read_committed` consumer sees every record once, whatever fails. The price is the latency of a
checkpoint interval (records are visible once their checkpoint is taken, as with Flink's
KafkaSink) and one producer on the driver.

The DataFrame's columns are Spark's: `value` (string or binary, required), and optionally `key`
(string or binary), `headers` (array of struct<key: string, value: binary>) and `partition`
(int). A missing or mistyped column is an error when the pipeline builds the sink, naming the
columns it has.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from shared import kafka_delivery

from .kafka_options import KafkaOptionError, client_settings, normalise, to_librdkafka
from .kafka_source import check_reachable
from .kafka_transactions import TransactionalWriter
from .sinks import SinkHandle

_TEXT = ("string", "binary")
COLUMN_TYPES = {
    "value": _TEXT,
    "key": _TEXT,
    "headers": ("array<struct<key:string,value:binary>>",),
    "partition": ("int",),
}


def check_columns(df: Any) -> list[str]:
    """The sink's columns present in `df`; KafkaOptionError naming what is missing or mistyped."""
    types = {f.name: f.dataType.simpleString() for f in df.schema.fields}
    if "value" not in types:
        raise KafkaOptionError(
            f"the DataFrame for a Kafka sink needs a 'value' column (string or binary); it has "
            f"{', '.join(types) or 'no columns'}: e.g. df.select(F.to_json(F.struct('*'))"
            ".alias('value'))"
        )
    for name, allowed in COLUMN_TYPES.items():
        if name in types and types[name] not in allowed:
            raise KafkaOptionError(
                f"the Kafka sink's column {name!r} must be {' or '.join(allowed)}, not "
                f"{types[name]}: cast it (F.col({name!r}).cast({allowed[0]!r}))"
            )
    return [name for name in COLUMN_TYPES if name in types]


def sink_name(topic: str) -> str:
    """The checkpoint subdirectory of the sink's query (stable across attempts)."""
    return "kafka-" + re.sub(r"[^A-Za-z0-9._-]", "_", topic)


def kafka_sink(
    df: Any,
    topic: str,
    *,
    bootstrap_servers: str,
    delivery: str,
    sink_id: str,
    lineage: str,
    job_id: str,
    options: Mapping[str, Any] | None = None,
    trigger: str | None = None,
    transaction_timeout_s: float,
    interval_s: float | None = None,
    transactional_id_prefix: str = "headrace-",
    on_wait: Callable[[str | None], None] | None = None,
    check: bool = True,
) -> SinkHandle:
    if not isinstance(topic, str) or not topic.strip():
        raise KafkaOptionError(f"the Kafka sink needs a topic name, got {topic!r}")
    guarantee = kafka_delivery.delivery(delivery)
    columns = check_columns(df)
    opts = normalise(options, bootstrap_servers=bootstrap_servers)
    if guarantee == kafka_delivery.AT_LEAST_ONCE:
        return _spark_sink(df, topic, opts, columns, trigger)
    problem = kafka_delivery.timeout_problem(transaction_timeout_s, interval_s) if interval_s is not None else None
    if problem is not None:  # the job's own interval (the cluster's default was checked at submission)
        raise kafka_delivery.DeliveryError(problem)
    client = to_librdkafka(client_settings(opts))
    if check:
        check_reachable(opts, names=[topic], on_wait=on_wait)
    writer = TransactionalWriter(
        topic=topic,
        client=client,
        sink_id=sink_id,
        lineage=lineage,
        job_id=job_id,
        transaction_timeout_ms=int(transaction_timeout_s * 1000),
        prefix=transactional_id_prefix,
        on_wait=on_wait,
    )
    selected = df.select(*columns)

    def write(batch_df: Any, batch_id: int) -> None:
        writer.write_batch(lambda: _rows(batch_df), batch_id)

    def run_batch() -> None:  # a bounded job: one transaction, committed when every row is in
        writer.write_once(lambda: _rows(selected))

    return SinkHandle(
        name=sink_name(topic),
        df=selected,
        output_mode="append",
        trigger=trigger,
        configure=lambda w: w.foreachBatch(write),
        run_batch=run_batch,
        on_prepare=writer.prepare,
        on_early_fence=writer.fence_early,
        options={"topic": topic, "delivery": guarantee},
        two_phase=writer,
    )


def _spark_sink(df: Any, topic: str, opts: dict[str, str], columns: list[str], trigger: str | None) -> SinkHandle:
    selected = df.select(*columns)

    def run_batch() -> None:
        selected.write.format("kafka").options(**opts).option("topic", topic).save()

    return SinkHandle(
        name=sink_name(topic),
        df=selected,
        output_mode="append",
        trigger=trigger,
        configure=lambda w: w.format("kafka").options(**opts).option("topic", topic),
        run_batch=run_batch,
        options={"topic": topic, "delivery": kafka_delivery.AT_LEAST_ONCE},
        supports_real_time=True,
    )


def _rows(df: Any) -> Iterator[tuple[Any, Any, Any, Any]]:
    """(value, key, headers, partition) per row, collected to the driver as Arrow."""
    table = df.toArrow()
    n = table.num_rows
    if n == 0:
        return iter(())
    values = _bytes_column(table, "value")
    keys = _bytes_column(table, "key") if "key" in table.column_names else [None] * n
    headers = (
        [[(h["key"], h["value"]) for h in hs] if hs else None for hs in table.column("headers").to_pylist()]
        if "headers" in table.column_names
        else [None] * n
    )
    partitions = table.column("partition").to_pylist() if "partition" in table.column_names else [None] * n
    return zip(values, keys, headers, partitions, strict=True)


def _bytes_column(table: Any, name: str) -> list[Any]:
    import pyarrow as pa

    column = table.column(name)
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        return [v.encode() if v is not None else None for v in column.to_pylist()]
    return column.to_pylist()
