"""`headrace up --kafka`: a real Kafka broker beside a local cluster (services/cluster/infrastructure.py,
kafka_broker.py), supervised like the other children.

The broker answers on the address cluster.json and every service's configuration name; the
dashboard shows it; `headrace kafka create-topic` and `topics` find it through the running
cluster; a kill -9 of its process group is followed by the supervisor starting it again on the
same data directory, with the topic and the records written before; and a pipeline's driver gets
the address as ctx.kafka_bootstrap_servers (it writes to the broker through Spark's own Kafka sink).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from services.cluster import kafka_topics
from shared.jars import DEFAULT_CACHE_DIR, KAFKA_BROKER, JarCache, MissingJars
from shared.ports import free_port
from tests.clusters import Rest, start_cluster
from tests.servers import missing
from tests.waiting import wait_for

REPO = Path(__file__).resolve().parents[2]
RESTART_TIMEOUT_S = 240  # the supervisor's backoff, then a broker JVM recovering its log on 2 loaded cores
PIPELINE_TIMEOUT_S = 600  # a cold Spark driver (no warm one) on a loaded machine


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, pg_url_module):
    try:
        JarCache(DEFAULT_CACHE_DIR).jars(KAFKA_BROKER)
    except MissingJars as exc:
        missing(f"the Kafka broker's jars ({exc})")
    home = tmp_path_factory.mktemp("kafka-up-home")
    c = start_cluster(home, catalog_url=pg_url_module, taskmanagers=1, slots=1, kafka=True, kafka_port=free_port())
    c.supervise()
    yield c
    c.stop()


def headrace(cluster, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """The CLI as a user in another shell runs it: only HEADRACE_HOME says which cluster."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HEADRACE_")}
    env |= {"HEADRACE_HOME": str(cluster.settings.home), "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "services.cli", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def produce(bootstrap: str, topic: str, records: dict[str, str]) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    for key, value in records.items():
        producer.produce(topic, key=key, value=value)
    assert producer.flush(60) == 0, "records not delivered within 60 s"


def consume(bootstrap: str, topic: str, count: int, timeout_s: float = 120) -> dict[str, str]:
    from confluent_kafka import Consumer

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"test-{topic}-{time.monotonic_ns()}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    seen: dict[str, str] = {}
    deadline = time.monotonic() + timeout_s
    try:
        while len(seen) < count and time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is not None and msg.error() is None:
                seen[msg.key().decode()] = msg.value().decode()
    finally:
        consumer.close()
    assert len(seen) >= count, f"read {len(seen)} of {count} records of {topic} within {timeout_s} s: {seen}"
    return seen


def test_the_broker_answers_where_cluster_json_the_configs_and_the_dashboard_say(cluster):
    bootstrap = cluster.kafka_bootstrap
    assert bootstrap == f"127.0.0.1:{cluster.settings.kafka_port}"
    assert kafka_topics.topics(bootstrap) == {}  # answers; creates no topic by itself
    described = json.loads((cluster.run_path / "cluster.json").read_text())
    assert described["kafka"] == {"bootstrap": bootstrap, "data_dir": str(cluster.settings.home / "kafka")}
    assert "kafka" in described["processes"]
    for config in ("config.yaml", "jobmanager.yaml", "dispatcher.yaml", "tm-1.yaml"):
        assert yaml.safe_load((cluster.run_path / config).read_text())["pipeline_kafka_bootstrap_servers"] == bootstrap
    dashboard = httpx.get(f"{cluster.dispatcher_url}/config", timeout=30).json()
    assert dashboard["kafka-bootstrap-servers"] == bootstrap


def test_a_killed_broker_comes_back_on_its_data_with_its_topics_and_records(cluster):
    bootstrap = cluster.kafka_bootstrap
    made = headrace(cluster, "kafka", "create-topic", "kept", "--partitions", "3")
    assert made.returncode == 0, made.stdout + made.stderr
    assert f"on {bootstrap}" in made.stdout
    again = headrace(cluster, "kafka", "create-topic", "kept")
    assert again.returncode == 1 and again.stderr.strip() == (
        f"error: the topic kept already exists on {bootstrap} (headrace kafka topics)"
    ), again.stderr
    produce(bootstrap, "kept", {f"k{i}": f"v{i}" for i in range(10)})

    old = cluster.child("kafka").proc.pid
    os.killpg(old, signal.SIGKILL)
    t0 = time.monotonic()
    wait_for(
        "the broker started again by the supervisor",
        lambda: (lambda p: p.pid != old and p.poll() is None)(cluster.child("kafka").proc),
        RESTART_TIMEOUT_S,
    )

    def kept_topic() -> bool:
        try:
            return kafka_topics.topics(bootstrap, timeout_s=5).get("kept") == 3
        except kafka_topics.KafkaUnreachable:
            return False

    wait_for("the restarted broker serving the topic made before the kill", kept_topic, RESTART_TIMEOUT_S, poll_s=1)
    print(f"broker back {time.monotonic() - t0:.1f} s after its kill -9", flush=True)
    assert consume(bootstrap, "kept", 10) == {f"k{i}": f"v{i}" for i in range(10)}
    listed = headrace(cluster, "kafka", "topics")
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.split("\n")[1].split() == ["kept", "3"], listed.stdout
    supervision = json.loads((cluster.run_path / "cluster.json").read_text())["supervision"]["kafka"]
    assert supervision["restarts"] >= 1


PIPELINE = """
def build(ctx):
    # What the task was given, written to the broker it names through Spark's own Kafka sink.
    record = ctx.spark.createDataFrame([(ctx.job_id, ctx.kafka_bootstrap_servers)], ["key", "value"])
    record.write.format("kafka").option("kafka.bootstrap.servers", ctx.kafka_bootstrap_servers) \\
        .option("topic", "from-pipelines").save()
    return ctx.sinks.console(ctx.spark.range(1))
"""


def test_a_pipeline_gets_the_broker_as_ctx_kafka_bootstrap_servers(cluster, tmp_path):
    bootstrap = cluster.kafka_bootstrap
    kafka_topics.create_topic(bootstrap, "from-pipelines")
    path = tmp_path / "kafka_default.py"
    path.write_text(PIPELINE)
    rest = Rest(cluster.dispatcher_url)
    job = rest.run(rest.upload(path), parallelism=1, restartStrategy={"type": "none"})
    state = rest.wait_state(job, ("FINISHED", "FAILED", "CANCELED"), timeout_s=PIPELINE_TIMEOUT_S)
    assert state["state"] == "FINISHED", rest.http.get(f"/jobs/{job}/exceptions").text
    assert consume(bootstrap, "from-pipelines", 1) == {job: bootstrap}
