"""The JobManager's commands of one unit of work go to Redis in one pipeline (CommandGateway.batch):
nothing is visible before the block ends, everything after, in order and in the shape the
TaskManager's worker accepts, each with its task-sent event; a block that raises sends nothing. The
commands are Celery's own (`send_task` through kombu's `Producer.batch`)."""

from __future__ import annotations

import base64
import json

import pytest
import redis

from shared.commands import CommandGateway, make_celery
from shared.messages import CancelTask, decode


def cancel(i: int) -> CancelTask:
    return CancelTask(taskmanager_id="tm-1", execution_id=f"{i:032x}", job_id="0" * 32)


def queued(client: redis.Redis, queue: str) -> list[str]:
    """Execution ids of the queue's commands, oldest first (kombu LPUSHes, the worker BRPOPs)."""
    out = []
    for item in reversed(client.lrange(queue, 0, -1)):
        args = json.loads(base64.b64decode(json.loads(item)["body"]))[0]
        out.append(decode(args[0].encode()).body.execution_id)
    return out


@pytest.fixture
def gateway(redis_url):
    return CommandGateway(make_celery(redis_url, "test"), sender="jobmanager", epoch=3)


def test_batched_commands_arrive_together_in_order(redis_url, gateway):
    client = redis.Redis.from_url(redis_url)
    with gateway.batch():
        for i in range(5):
            gateway.cancel("tm.tm-1", cancel(i))
        assert client.llen("tm.tm-1") == 0
    assert queued(client, "tm.tm-1") == [f"{i:032x}" for i in range(5)]
    gateway.cancel("tm.tm-1", cancel(9))  # outside a batch: at once
    assert client.llen("tm.tm-1") == 6


def test_a_failed_block_sends_nothing(redis_url, gateway):
    client = redis.Redis.from_url(redis_url)
    with pytest.raises(RuntimeError):
        with gateway.batch():
            gateway.cancel("tm.tm-1", cancel(1))
            raise RuntimeError("the unit of work failed after deciding")
    assert client.llen("tm.tm-1") == 0
    with gateway.batch():  # the gateway is usable again
        gateway.cancel("tm.tm-1", cancel(2))
    assert queued(client, "tm.tm-1") == [f"{2:032x}"]


def test_a_batch_larger_than_kombus_flush_size_is_one_pipeline(redis_url, gateway):
    client = redis.Redis.from_url(redis_url)
    with pytest.raises(RuntimeError):
        with gateway.batch():
            for i in range(600):  # 1,200 writes with their events: past kombu's default of 1,000
                gateway.cancel("tm.tm-2", cancel(i))
            raise RuntimeError("the unit of work failed after deciding")
    assert client.llen("tm.tm-2") == 0


def test_every_command_has_its_task_sent_event(redis_url, gateway):
    client = redis.Redis.from_url(redis_url)
    events = client.pubsub()
    events.psubscribe("*celeryev*")
    events.get_message(timeout=1)  # the subscription's confirmation
    with gateway.batch():
        for i in range(3):
            gateway.cancel("tm.tm-3", cancel(i))
    sent = []
    while (event := events.get_message(timeout=2)) is not None:
        message = json.loads(event["data"])
        sent.append(json.loads(base64.b64decode(message["body"])))
    assert [e["type"] for e in sent] == ["task-sent"] * 3
    assert {e["queue"] for e in sent} == {"tm.tm-3"}
    assert all(e["name"] == "headrace.cancel_task" and "taskmanager=tm-1" in e["args"] for e in sent)
