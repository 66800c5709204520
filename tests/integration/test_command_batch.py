"""The JobManager's commands of one unit of work go to Redis in one pipeline (CommandGateway.batch):
nothing is visible before the block ends, everything after, in order and in the shape the
TaskManager's worker accepts; a block that raises sends nothing of what it had not flushed."""

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


def test_batched_commands_arrive_together_in_order(redis_url):
    client = redis.Redis.from_url(redis_url)
    gateway = CommandGateway(make_celery(redis_url, "test"), sender="jobmanager", epoch=3)
    with gateway.batch():
        for i in range(5):
            gateway.cancel("tm.tm-1", cancel(i))
        assert client.llen("tm.tm-1") == 0
    assert queued(client, "tm.tm-1") == [f"{i:032x}" for i in range(5)]
    gateway.cancel("tm.tm-1", cancel(9))  # outside a batch: at once
    assert client.llen("tm.tm-1") == 6


def test_a_failed_block_sends_nothing(redis_url):
    client = redis.Redis.from_url(redis_url)
    gateway = CommandGateway(make_celery(redis_url, "test"), sender="jobmanager", epoch=3)
    with pytest.raises(RuntimeError):
        with gateway.batch():
            gateway.cancel("tm.tm-1", cancel(1))
            raise RuntimeError("the unit of work failed after deciding")
    assert client.llen("tm.tm-1") == 0
    with gateway.batch():  # the gateway is usable again
        gateway.cancel("tm.tm-1", cancel(2))
    assert queued(client, "tm.tm-1") == [f"{2:032x}"]
