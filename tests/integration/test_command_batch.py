"""The JobManager's commands of one unit of work go to Redis in one pipeline (CommandGateway.batch):
nothing is visible before the block ends, everything after, in order and in the shape the
TaskManager's worker accepts; a block that raises sends nothing of what it had not flushed. Both
ways of writing commands (Celery's send_task, and shared/celery_wire.py given the broker's
client) behave alike, and write the same messages and task-sent events."""

from __future__ import annotations

import base64
import json

import pytest
import redis

from shared.commands import CommandGateway, make_celery
from shared.messages import CancelTask, decode
from shared.transport.kombu_redis import readable_message


def cancel(i: int) -> CancelTask:
    return CancelTask(taskmanager_id="tm-1", execution_id=f"{i:032x}", job_id="0" * 32)


def queued(client: redis.Redis, queue: str) -> list[str]:
    """Execution ids of the queue's commands, oldest first (kombu LPUSHes, the worker BRPOPs)."""
    out = []
    for item in reversed(client.lrange(queue, 0, -1)):
        message = readable_message(item)
        args = json.loads(base64.b64decode(message["body"]))[0]
        out.append(decode(args[0].encode()).body.execution_id)
    return out


@pytest.fixture(params=["send_task", "wire"])
def gateway(request, redis_url):
    client = redis.Redis.from_url(redis_url) if request.param == "wire" else None
    return CommandGateway(make_celery(redis_url, "test"), sender="jobmanager", epoch=3, client=client)


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


def _shape(raw: bytes) -> dict:
    """A kombu message with what differs per message (ids, times, the node name) blanked, and
    its base64 body decoded to JSON."""
    msg = json.loads(raw)
    body = json.loads(base64.b64decode(msg["body"]))
    volatile = {
        "id",
        "root_id",
        "correlation_id",
        "delivery_tag",
        "expires",
        "timestamp",
        "clock",
        "uuid",
        "reply_to",
        "origin",
        "hostname",
        "pid",
        "message_id",
        "sent_at",
    }

    def blank(x):
        if isinstance(x, dict):
            return {k: ("*" if k in volatile else blank(v)) for k, v in x.items()}
        if isinstance(x, list):
            return [blank(v) for v in x]
        if isinstance(x, str) and x.startswith('{"schema_version'):
            return blank(json.loads(x))  # the envelope inside the task's args
        if isinstance(x, str) and len(x) == 64 and all(c in "0123456789abcdef" for c in x):
            return "*"  # the envelope's signature, different with every message id
        return x

    msg["body"] = blank(body)
    return blank(msg)


def test_the_wire_writes_what_send_task_writes(redis_url):
    client = redis.Redis.from_url(redis_url)
    events = client.pubsub()
    events.psubscribe("*celeryev*")
    events.get_message(timeout=1)  # the subscription's confirmation
    written = {}
    for mode in ("send_task", "wire"):
        gateway = CommandGateway(
            make_celery(redis_url, "test"), sender="jobmanager", epoch=3, client=client if mode == "wire" else None
        )
        with gateway.batch():
            gateway.cancel(f"tm.{mode}", cancel(7))
        [item] = client.lrange(f"tm.{mode}", 0, -1)
        event = events.get_message(timeout=2)
        assert event is not None, f"{mode}: no task-sent event"
        written[mode] = (_shape(item), event["channel"], _shape(event["data"]))
    assert written["wire"][0] == {
        **written["send_task"][0],
        "properties": {
            **written["send_task"][0]["properties"],
            "delivery_info": {"exchange": "", "routing_key": "tm.wire"},
        },
        "body": written["wire"][0]["body"],
    }
    assert written["wire"][0]["body"] == written["send_task"][0]["body"]
    assert written["wire"][1] == written["send_task"][1]
    sent_task, sent_wire = written["send_task"][2], written["wire"][2]
    assert sent_wire["body"] == {**sent_task["body"], "queue": "tm.wire", "routing_key": "tm.wire"}
    assert {k: v for k, v in sent_wire.items() if k != "body"} == {k: v for k, v in sent_task.items() if k != "body"}
