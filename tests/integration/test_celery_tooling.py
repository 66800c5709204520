"""Celery's own tools against a running cluster: `celery inspect` reaches the TaskManager's
worker through the admin Redis user, and the worker's and the JobManager's events (what
Flower shows) arrive on Celery's event channels, allowed by the services' ACL users."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time

import pytest
import redis

from tests.clusters import start_cluster

APP = "shared.commands:celery_app"
# The JobManager's send and the TaskManager worker's receipt and completion of a deploy.
WANTED = {"task-sent", "task-received", "task-succeeded"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, pg_url_module):
    c = start_cluster(tmp_path_factory.mktemp("celery-home"), catalog_url=pg_url_module, taskmanagers=1, slots=2)
    yield c
    c.stop()


def celery(cluster, *args: str, timeout_s: float = 30) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HEADRACE_")}
    env["HEADRACE_REDIS_URL"] = cluster.redis_url  # the operator's (admin) user
    return subprocess.run(
        [sys.executable, "-m", "celery", "-A", APP, *args], env=env, capture_output=True, text=True, timeout=timeout_s
    )


def test_inspect_ping_and_active_queues_reach_the_taskmanager(cluster):
    ping = celery(cluster, "inspect", "ping", "--timeout", "2", "--json")
    assert ping.returncode == 0, ping.stderr + ping.stdout
    replies = json.loads(ping.stdout.strip().splitlines()[-1])
    assert any(name.startswith("tm-1@") and reply == {"ok": "pong"} for name, reply in replies.items()), replies

    queues = celery(cluster, "inspect", "active_queues", "--timeout", "2", "--json")
    assert queues.returncode == 0, queues.stderr + queues.stdout
    by_worker = json.loads(queues.stdout.strip().splitlines()[-1])
    names = {q["name"] for qs in by_worker.values() for q in qs}
    assert "tm.tm-1" in names, by_worker


def event_body(data: bytes) -> dict:
    """The event inside kombu's Redis envelope (its body is base64 unless said otherwise)."""
    envelope = json.loads(data)
    body = envelope["body"]
    if envelope.get("properties", {}).get("body_encoding") == "base64":
        body = base64.b64decode(body)
    return json.loads(body)


def test_commands_show_up_as_celery_events(cluster, rest, jar):
    sub = redis.Redis.from_url(cluster.redis_url).pubsub(ignore_subscribe_messages=True)
    sub.psubscribe("/0.celeryev/*")
    try:
        job = rest.run(jar, kind="noop", parallelism=1, restartStrategy={"type": "none"}, config={"noop.duration": 0.5})
        rest.wait_state(job, "FINISHED", timeout_s=30)
        seen: dict[str, dict] = {}
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not WANTED <= seen.keys():
            msg = sub.get_message(timeout=0.5)
            if msg and msg["type"] == "pmessage":
                body = event_body(msg["data"])
                # A worker sends its task events in groups ("task.multi": a list).
                for event in body if isinstance(body, list) else [body]:
                    seen[event["type"]] = event
    finally:
        sub.close()
    assert WANTED <= seen.keys(), sorted(seen)
    assert seen["task-received"]["hostname"].startswith("tm-1@")
    assert seen["task-received"]["name"] == "headrace.deploy_task"
    assert seen["task-sent"]["queue"] == "tm.tm-1"
    # Events show the command's ids, never its spec (whose catalog URL may hold a password).
    received = seen["task-received"]["args"]
    assert received.startswith("DeployTask(job=") and job in received and "catalog" not in received, received


def test_a_command_is_summarised_by_its_ids():
    from shared.commands import summary
    from shared.messages import CancelTask, DeployTask
    from shared.task_protocol import TaskSpec

    deploy = DeployTask(
        taskmanager_id="tm-1",
        allocation_id="a",
        slot_indices=(0,),
        spec=TaskSpec(
            job_id="j1",
            vertex_id="v1",
            execution_id="e1",
            attempt=2,
            parallelism=1,
            checkpoint_dir="/tmp/x",
            redis_url="redis://",
            catalog_url="postgresql://u:secret@db/headrace",
        ),
    )
    assert summary(deploy, 7) == "DeployTask(job=j1, execution=e1, attempt=2, taskmanager=tm-1, epoch=7)"
    assert (
        summary(CancelTask(taskmanager_id="tm-1", execution_id="e1", job_id="j1"), 7)
        == "CancelTask(job=j1, execution=e1, taskmanager=tm-1, epoch=7)"
    )
