"""Kafka end to end on a multi-process cluster, with a real broker fed from outside.

exactly once into Kafka: a Kafka -> Kafka copy job (examples/kafka_exactly_once.py) through a
    TaskManager kill -9 and a broker kill -9; a read_committed consumer finds every input id in
    the output exactly once.
offsets in savepoints: a Kafka -> PostgreSQL count per key (examples/kafka_to_postgres.py)
    stopped with a savepoint, the savepoint moved, resumed at parallelism 2, fed on: every key's
    count and sum exact.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from tests.clusters import Rest, start_cluster
from tests.e2e.counting import expected_totals, sql_totals
from tests.e2e.drills import kill_task_taskmanager, savepoint
from tests.kafka_support import Feeder, counting_event, produce, read_all
from tests.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
CHECKPOINTS = {"execution.checkpointing.interval": "2 s", "state.checkpoints.num-retained": 2}


@pytest.fixture(scope="module")
def storage(tmp_path_factory) -> Path:
    """Where savepoints are written and moved to (an allowed storage root of the cluster)."""
    return tmp_path_factory.mktemp("kafka-e2e-storage")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, pg_url_module, storage):
    c = start_cluster(
        tmp_path_factory.mktemp("kafka-e2e"),
        catalog_url=pg_url_module,
        pipeline_catalog_url=pg_url_module,
        warm_drivers=1,
        slots=2,
        storage_roots=str(storage),
    )
    c.supervise()
    yield c
    c.stop()


def key_of(value: str) -> str:
    return json.loads(value)["key"]


def test_exactly_once_into_kafka_through_a_taskmanager_and_a_broker_kill(cluster, kafka):
    rest = Rest(cluster.dispatcher_url)
    source = kafka.create_topic("eo-in", partitions=2)
    sink = kafka.create_topic("eo-out", partitions=2)
    jar = rest.upload(ROOT / "examples" / "kafka_exactly_once.py")
    job = rest.run(
        jar,
        parallelism=2,
        jobName="kafka-eo",
        flinkConfiguration=CHECKPOINTS,
        programArgsList=[
            "--input",
            source,
            "--output",
            sink,
            "--bootstrap-servers",
            kafka.bootstrap,
            "--trigger",
            "500 milliseconds",
        ],
    )
    rest.wait_attempt_running(job, 0, timeout_s=300)
    feeder = Feeder(kafka.bootstrap, source, rate=100).start()
    try:
        wait_for(
            "output before the faults",
            lambda: len(read_all(kafka.bootstrap, sink, settle_s=0.5)) > 200,
            120,
            poll_s=0.25,
        )
        kill_task_taskmanager(cluster, rest, job, respawn=False, timeout_s=180)
        wait_for(
            "checkpoints after the TaskManager kill",
            lambda: rest.get(f"/jobs/{job}/checkpoints")["counts"]["completed"] >= 3,
            120,
            poll_s=0.25,
        )
        kafka.broker.kill()  # kill -9; the job rides it out or restarts, the feeder buffers
        time.sleep(5)
        kafka.broker.start()
    finally:
        produced = feeder.stop()
    expected = list(range(produced))

    def complete():
        got = read_all(kafka.bootstrap, sink, settle_s=1.0)
        return got if len(got) >= produced else None

    got = wait_for(f"{produced} records in the output", complete, 240, poll_s=0.25)
    ids = sorted(int(json.loads(v)["payload"]) for v in got)
    assert ids == expected, f"{len(ids)} records for {produced} ids; duplicates or gaps"
    assert rest.job(job)["state"] == "RUNNING"
    rest.cancel(job)


def test_kafka_to_postgres_counts_exact_through_stop_with_savepoint_and_resume_at_parallelism_2(
    cluster, kafka, pg_url_module, storage
):
    rest = Rest(cluster.dispatcher_url)
    topic = kafka.create_topic("counts-in", partitions=2)
    produce(kafka.bootstrap, topic, [counting_event(n) for n in range(600)], key_of=key_of)
    jar = rest.upload(ROOT / "examples" / "kafka_to_postgres.py")
    args = [
        "--topic",
        topic,
        "--bootstrap-servers",
        kafka.bootstrap,
        "--table",
        "kafka_counts",
        "--trigger",
        "1 second",
    ]
    a = rest.run(jar, parallelism=1, jobName="kafka-counts-a", flinkConfiguration=CHECKPOINTS, programArgsList=args)
    rest.wait_attempt_running(a, 0, timeout_s=300)
    wait_for(
        "the first 600 events counted",
        lambda: sum(c for c, _ in sql_totals(pg_url_module, "kafka_counts").values()) == 600,
        120,
        poll_s=0.25,
    )
    produce(kafka.bootstrap, topic, [counting_event(n) for n in range(600, 900)], key_of=key_of)
    stopped = savepoint(rest, a, "stop", {"targetDirectory": str(storage / "savepoints"), "drain": False})
    assert rest.wait_state(a, ("FINISHED", "FAILED", "CANCELED"), timeout_s=60)["state"] == "FINISHED"
    moved = storage / "elsewhere" / Path(stopped).name
    moved.parent.mkdir(parents=True)
    shutil.move(stopped, moved)
    produce(kafka.bootstrap, topic, [counting_event(n) for n in range(900, 1500)], key_of=key_of)
    b = rest.run(
        jar,
        parallelism=2,
        jobName="kafka-counts-b",
        flinkConfiguration=CHECKPOINTS,
        programArgsList=args,
        savepointPath=f"file://{moved}",
    )
    assert rest.wait_attempt_running(b, 0, timeout_s=300)[-1]["restored-from"] == str(moved)
    wait_for(
        "every key's count and sum exact after the resume",
        lambda: sql_totals(pg_url_module, "kafka_counts") == expected_totals(1500),
        180,
        poll_s=0.25,
    )
    rest.cancel(b)


def test_the_real_time_mode_copies_kafka_to_kafka_and_refuses_other_sinks(cluster, kafka):
    rest = Rest(cluster.dispatcher_url)
    source, sink = kafka.create_topic("rt-in", partitions=2), kafka.create_topic("rt-out", partitions=2)
    jar = rest.upload(ROOT / "bench" / "pipelines" / "kafka_copy.py")
    args = ["--input", source, "--output", sink, "--bootstrap-servers", kafka.bootstrap, "--low-latency"]
    config = {**CHECKPOINTS, "headrace.real-time-mode": "5 s"}
    job = rest.run(
        jar,
        parallelism=2,
        jobName="kafka-rt",
        flinkConfiguration=config,
        programArgsList=[*args, "--delivery", "at-least-once"],
    )
    rest.wait_attempt_running(job, 0, timeout_s=300)
    produce(kafka.bootstrap, source, [json.dumps({"n": n}) for n in range(500)])
    got = wait_for(
        "500 records through the real-time mode",
        lambda: (v := read_all(kafka.bootstrap, sink, settle_s=1.0)) and len(v) >= 500 and v,
        120,
        poll_s=0.25,
    )
    assert sorted(json.loads(v)["n"] for v in got) == list(range(500))
    wait_for(
        "a checkpoint at the end of a real-time batch",
        lambda: rest.get(f"/jobs/{job}/checkpoints")["counts"]["completed"] >= 1,
        90,
        poll_s=0.25,
    )
    rest.cancel(job)
    refused = rest.run(
        jar,
        parallelism=1,
        jobName="kafka-rt-eo",
        flinkConfiguration=config,
        programArgsList=[*args, "--delivery", "exactly-once"],
    )
    final = rest.wait_state(refused, ("FAILED",), timeout_s=180)
    assert final["state"] == "FAILED"
    cause = json.dumps(rest.get(f"/jobs/{refused}/exceptions"))
    assert "DeliveryError" in cause and "real-time" in cause, cause[:2000]
