"""`headrace kafka topics|create-topic`: the topics of the pipelines' Kafka broker.

The broker is `--bootstrap HOST:PORT`, else the setting `pipeline_kafka_bootstrap_servers`
(HEADRACE_PIPELINE_KAFKA_BOOTSTRAP_SERVERS, or the file named by HEADRACE_CONFIG), else the broker
of the newest `headrace up --kafka` cluster still running under HEADRACE_HOME (found as the
client verbs find its dispatcher: services/cli/client_address.py).
"""

from __future__ import annotations

from typing import Optional

import typer

from services.cli.common import fail, settings_or_fail

app = typer.Typer(no_args_is_help=True, help="Topics of the pipelines' Kafka broker (headrace up --kafka).")

BOOTSTRAP_HELP = (
    "the broker, host:port[,host:port] (default: pipeline_kafka_bootstrap_servers, else the running "
    "headrace up --kafka cluster's broker)"
)


def bootstrap_servers(explicit: str | None) -> str:
    if explicit:
        return explicit
    from services.cli.client_address import running_cluster_config

    settings = settings_or_fail()
    if settings.pipeline_kafka_bootstrap_servers:
        return settings.pipeline_kafka_bootstrap_servers
    running = running_cluster_config(settings.home) or {}
    if running.get("pipeline_kafka_bootstrap_servers"):
        return str(running["pipeline_kafka_bootstrap_servers"])
    fail(
        "no Kafka broker known: pass --bootstrap HOST:PORT, set HEADRACE_PIPELINE_KAFKA_BOOTSTRAP_SERVERS, or "
        "start one with headrace up --kafka",
        2,
    )


@app.command("create-topic")
def create_topic(
    name: str = typer.Argument(..., help="the topic's name"),
    partitions: int = typer.Option(1, "--partitions", "-p", min=1, help="how many partitions"),
    bootstrap: Optional[str] = typer.Option(None, "--bootstrap", help=BOOTSTRAP_HELP),
) -> None:
    """Create a topic (one replica: the broker is a single node)."""
    from services.cluster import kafka_topics

    servers = bootstrap_servers(bootstrap)
    try:
        kafka_topics.create_topic(servers, name, partitions=partitions)
    except kafka_topics.KafkaTopicsError as exc:
        fail(str(exc))
    typer.echo(f"created the topic {name} with {partitions} partition(s) on {servers}")


@app.command("topics")
def list_topics(
    bootstrap: Optional[str] = typer.Option(None, "--bootstrap", help=BOOTSTRAP_HELP),
    internal: bool = typer.Option(False, "--internal", help="also the broker's own topics (__consumer_offsets, ...)"),
) -> None:
    """List the topics with their partition counts."""
    from services.cluster import kafka_topics

    servers = bootstrap_servers(bootstrap)
    try:
        found = kafka_topics.topics(servers, include_internal=internal)
    except kafka_topics.KafkaTopicsError as exc:
        fail(str(exc))
    if not found:
        typer.echo(f"no topics on {servers} (headrace kafka create-topic NAME)")
        return
    width = max(len("TOPIC"), *(len(name) for name in found))
    typer.echo(f"{'TOPIC':<{width}}  PARTITIONS")
    for name, count in found.items():
        typer.echo(f"{name:<{width}}  {count}")
