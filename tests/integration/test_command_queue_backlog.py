"""A TaskManager's command queue with a backlog (shared/transport/kombu_redis.py): after one
BRPOP the channel takes up to MORE_PER_READ - 1 more items in one RPOP. Against a real Redis,
through kombu's own consumer API as the Celery worker uses it: every command arrives once, in the
order it was queued; items whose delivery fails (kombu cannot parse them, or the consumer raised
on them) are dead-lettered without costing their neighbours; and when the worker stops in the
middle of a read, what was popped but not delivered is back at the head of the queue, in order."""

from __future__ import annotations

import base64
import contextlib
import json
import uuid

import pytest
import redis
from celery.exceptions import WorkerShutdown
from kombu import Connection, Consumer, Queue

from shared import streams
from shared.transport import kombu_redis


def item(queue: str, n: int) -> bytes:
    """A Celery protocol-2 message as kombu stores it in the queue list; its task id is `cmd-<n>`."""
    body = base64.b64encode(
        json.dumps([[n], {}, {"callbacks": None, "errbacks": None, "chain": None, "chord": None}]).encode()
    ).decode()
    return json.dumps(
        {
            "body": body,
            "content-encoding": "utf-8",
            "content-type": "application/json",
            "headers": {"lang": "py", "task": "headrace.test", "id": f"cmd-{n}", "retries": 0},
            "properties": {
                "delivery_mode": 2,
                "priority": 0,
                "body_encoding": "base64",
                "delivery_info": {"exchange": "", "routing_key": queue},
                "delivery_tag": str(uuid.uuid4()),
            },
        }
    ).encode()


def queue_in_order(client: redis.Redis, queue: str, items: list[bytes]) -> None:
    """LPUSH each in turn, as producers do: the first pushed is the first BRPOP takes."""
    pipe = client.pipeline(transaction=False)
    for it in items:
        pipe.lpush(queue, it)
    pipe.execute()


def drain(conn: Connection, queue: str, on_message, *, until, prefetch: int | None = None) -> None:
    with Consumer(
        conn.channel(),
        queues=[Queue(queue, routing_key=queue)],
        callbacks=[on_message],
        accept=["json"],
        prefetch_count=prefetch,
    ):
        for _ in range(200):
            if until():
                return
            try:
                conn.drain_events(timeout=0.2)
            except TimeoutError:
                pass
    raise AssertionError("the queue was not drained")


def test_a_backlog_arrives_complete_in_order_and_unreadable_items_are_dead_lettered(redis_url):
    client = redis.Redis.from_url(redis_url)
    queue = "tm.backlog-1"
    total = 3 * kombu_redis.MORE_PER_READ + 7  # several reads' worth, the last one partial
    garbage = {10: b"not json", 11: b'{"a": 1}', kombu_redis.MORE_PER_READ + 3: b"[]"}
    items = [garbage.get(i) or item(queue, i) for i in range(total)]
    queue_in_order(client, queue, items)
    seen: list[str] = []

    def on_message(_body, message):
        seen.append(message.headers["id"])
        message.ack()

    reads, inside = [], []

    @contextlib.contextmanager
    def around_read():  # the TaskManager sends its reports of one read together this way
        reads.append(len(seen))
        yield
        inside.append(len(seen) - reads[-1])

    with Connection(
        redis_url, transport=kombu_redis.Transport, transport_options={kombu_redis.AROUND_READ: around_read}
    ) as conn:
        drain(conn, queue, on_message, until=lambda: len(seen) == total - len(garbage))
    assert seen == [f"cmd-{i}" for i in range(total) if i not in garbage]
    # Every command was delivered inside a read's hook, up to MORE_PER_READ per read.
    assert sum(inside) == len(seen) and max(inside) <= kombu_redis.MORE_PER_READ
    assert len(reads) <= -(-total // kombu_redis.MORE_PER_READ) + 1
    assert client.llen(queue) == 0
    letters = client.xrange(streams.DLQ_STREAM)
    assert len(letters) == len(garbage)
    assert all(fields[b"queue"] == queue.encode() for _, fields in letters)


def test_an_item_the_consumer_raised_on_is_dead_lettered_and_the_others_arrive(redis_url):
    client = redis.Redis.from_url(redis_url)
    queue = "tm.backlog-3"
    total = 2 * kombu_redis.MORE_PER_READ + 5  # reads after the one that took cmd-5
    queue_in_order(client, queue, [item(queue, i) for i in range(total)])
    seen: list[str] = []

    def raising_on_5(_body, message):
        if message.headers["id"] == "cmd-5":
            raise ValueError("Celery could not unpack cmd-5")
        seen.append(message.headers["id"])
        message.ack()

    with Connection(redis_url, transport=kombu_redis.Transport) as conn:
        # A prefetch window of one: had cmd-5 stayed unacknowledged, no read would follow it.
        drain(conn, queue, raising_on_5, until=lambda: len(seen) == total - 1, prefetch=1)
    assert seen == [f"cmd-{i}" for i in range(total) if i != 5]
    [(_, letter)] = client.xrange(streams.DLQ_STREAM)
    assert letter[b"error"] == b"delivery failed: ValueError: Celery could not unpack cmd-5"
    assert b"cmd-5" in letter[b"orig.item"]


def test_what_a_stopping_worker_left_undelivered_goes_back_to_the_head_of_the_queue(redis_url):
    client = redis.Redis.from_url(redis_url)
    queue = "tm.backlog-2"
    total = 30
    queue_in_order(client, queue, [item(queue, i) for i in range(total)])
    seen: list[str] = []
    stopped = []

    def stopping_once_on_5(_body, message):
        if message.headers["id"] == "cmd-5" and not stopped:
            stopped.append(True)
            raise WorkerShutdown("the worker stops while taking cmd-5")
        seen.append(message.headers["id"])
        message.ack()

    with Connection(redis_url, transport=kombu_redis.Transport) as conn:
        with pytest.raises(WorkerShutdown, match="cmd-5"):
            drain(conn, queue, stopping_once_on_5, until=lambda: False)
        assert seen == [f"cmd-{i}" for i in range(5)]
        # cmd-6 .. cmd-29 were popped with cmd-5 but not delivered: back, in order, at the head.
        assert client.llen(queue) == total - 6
    # cmd-5 itself was delivered and never acknowledged: kombu puts it back, at the tail, when
    # the channel closes. Every command arrives once.
    with Connection(redis_url, transport=kombu_redis.Transport) as conn:
        drain(conn, queue, stopping_once_on_5, until=lambda: len(seen) == total)
    assert seen == [f"cmd-{i}" for i in range(total) if i != 5] + ["cmd-5"]
    assert client.llen(queue) == 0


def test_a_lost_connection_during_a_delivery_is_not_the_items_fault(redis_url):
    client = redis.Redis.from_url(redis_url)
    queue = "tm.backlog-4"
    queue_in_order(client, queue, [item(queue, 0)])

    def losing_the_connection(_body, message):
        raise redis.ConnectionError("Redis went away while the worker took cmd-0")

    with Connection(redis_url, transport=kombu_redis.Transport) as conn:
        with pytest.raises(redis.ConnectionError):  # to Celery's consumer, which reconnects
            drain(conn, queue, losing_the_connection, until=lambda: False)
    assert client.xlen(streams.DLQ_STREAM) == 0
