"""kombu's Redis transport for a TaskManager's command queue, except that an item the worker
cannot take is dead-lettered instead of killing the worker.

kombu pops a queue item (BRPOP) and parses it as JSON before anything of Celery sees it, and a
parse error raises out of the worker's event loop: one `LPUSH tm.<id> garbage` made the
TaskManager exit with "Unrecoverable error: JSONDecodeError". kombu offers no hook before that
parse (celery/celery#4308, celery/kombu#2421), so this channel reads BRPOP's reply itself, the
way kombu 5 does, and checks the item before handing it on: a JSON object in kombu's envelope
whose body is base64 JSON in Celery's protocol 2 shape. Anything else goes to `hr:stream:dlq`
with the reason (the item has left the queue: nothing is redelivered). A body of any other
content type is refused unread: a pickle is never decoded.

What passes reaches Celery, whose own checks (an unknown task name, say) and the TaskManager's
command handlers (services/taskmanager/commands.py) deal with the rest.

Use: `app.conf.broker_transport = "shared.transport.kombu_redis:Transport"`.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import logging
from queue import Empty

from kombu.transport import redis as kombu_redis
from kombu.utils.encoding import bytes_to_str

from shared import streams
from shared.errors import MessageError
from shared.transport import dead_letters

log = logging.getLogger(__name__)


class UnreadableItem(MessageError, ValueError):
    """A queue item that is not a Celery message this worker could take."""


def readable_message(item: bytes | str) -> dict:
    """The item as the dict kombu delivers, or UnreadableItem saying what is wrong with it."""
    try:
        message = json.loads(item)
    except (UnicodeDecodeError, ValueError) as exc:
        raise UnreadableItem(f"not JSON: {exc}") from None
    if not isinstance(message, dict):
        raise UnreadableItem(f"not a kombu message: a JSON {type(message).__name__}")
    props, headers, body = message.get("properties"), message.get("headers"), message.get("body")
    if not isinstance(props, dict) or not isinstance(props.get("delivery_tag"), str):
        raise UnreadableItem("not a kombu message: no properties.delivery_tag")
    if not isinstance(headers, dict) or not isinstance(headers.get("task"), str):
        raise UnreadableItem("not a Celery task message: no headers.task")
    if message.get("content-type") != "application/json":
        raise UnreadableItem(f"content type {message.get('content-type')!r} refused: only application/json")
    if not isinstance(body, str):
        raise UnreadableItem("no body")
    if props.get("body_encoding") == "base64":
        try:
            body = base64.b64decode(body, validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError) as exc:
            raise UnreadableItem(f"body is not base64 of UTF-8 text: {exc}") from None
    elif props.get("body_encoding") is not None:
        raise UnreadableItem(f"body encoding {props.get('body_encoding')!r} refused")
    try:
        args = json.loads(body)
    except ValueError as exc:
        raise UnreadableItem(f"body is not JSON: {exc}") from None
    if not (isinstance(args, list) and len(args) == 3 and isinstance(args[0], list) and isinstance(args[1], dict)):
        raise UnreadableItem("body is not Celery protocol 2: [args, kwargs, embed]")
    return message


# Items one read may take from a queue with a backlog (see Channel._deliver_backlog).
MORE_PER_READ = 50
# Transport option: a callable returning a context manager that is entered around the deliveries
# of one read (the TaskManager sends the reports of the commands it took in one round trip).
AROUND_READ = "headrace_around_read"
# Transport option: the stream the items no one can read are dead-lettered to (a TaskManager's own).
DEAD_LETTERS = "headrace_dead_letters"


class Channel(kombu_redis.Channel):
    # Commands are acknowledged as soon as the worker takes them (task_acks_late=False), so
    # kombu's "unacked" hash held each one only for the moment before its ack, at two Redis
    # round trips per command; its one effect would be to put a command taken by a worker that
    # died in that moment back in the queue after the visibility timeout, minutes after the
    # JobManager's acknowledgement timer failed that deploy over.
    ack_emulation = False
    _sync_client = None

    def _create_client(self, asynchronous=False):
        # kombu builds a new redis.Redis for every ack, every unacked-hash entry and every
        # worker event: its constructor copies ~200 response callbacks, and with a backlog of
        # commands that was a tenth of a TaskManager's time. A client over the channel's pool is
        # safe to share (each command checks a connection out of the pool); the asynchronous one
        # (BRPOP, whose connection the poller holds) is still made afresh.
        if asynchronous:
            return super()._create_client(asynchronous=True)
        pool = self.pool
        if self._sync_client is None or self._sync_client.connection_pool is not pool:
            self._sync_client = super()._create_client()
        return self._sync_client

    def _brpop_read(self, **options):
        # kombu 5's Channel._brpop_read, with the item checked before it is delivered.
        try:
            try:
                dest__item = self.client.parse_response(self.client.connection, "BRPOP", **options)
            except self.connection_errors:
                self.client.connection.disconnect()
                raise
            if not dest__item:
                raise Empty()
            key, item = dest__item
            dest = bytes_to_str(key).rsplit(self.sep, 1)[0]
            self._queue_cycle.rotate(dest)
            try:
                message = readable_message(item)
            except UnreadableItem as exc:
                self._dead_letter(dest, item, str(exc))
                raise Empty() from None  # the hub's "nothing for you": it polls on
            around = self.connection.client.transport_options.get(AROUND_READ)
            with around() if around is not None else contextlib.nullcontext():
                self.connection._deliver(message, dest)
                self._deliver_backlog(key, dest)
            return True
        finally:
            self._in_poll = None  # type: ignore[assignment]  # as kombu's own: it declares a bool, stores a connection
            flush = getattr(self, "_flush_brpop_reauth", None)  # kombu >= 5.6
            if flush is not None:
                flush()

    def _deliver_backlog(self, key: bytes, queue: str) -> None:
        """After one item, up to MORE_PER_READ - 1 more of the same queue in one RPOP instead of
        a BRPOP round trip and an event-loop turn each: with thousands of commands queued (a
        burst of deploys) that turn, and the worker-event publish each turn flushes, were most
        of a TaskManager's time. An empty queue costs one RPOP that returns nothing. If a
        delivery raises, what was popped but not delivered goes back to the head of the queue.
        (RPOP with a count needs Redis 6.2 or newer: Debian 12 has 7.0, the compose stack redis:7.)"""
        with self.conn_or_acquire() as client:
            items = client.rpop(key, MORE_PER_READ - 1) or []
        for i, item in enumerate(items):
            try:
                message = readable_message(item)
            except UnreadableItem as exc:
                self._dead_letter(queue, item, str(exc))
                continue
            try:
                self.connection._deliver(message, queue)
            except BaseException:
                rest = items[i + 1 :]
                if rest:
                    with self.conn_or_acquire() as client:
                        client.rpush(key, *reversed(rest))  # BRPOP takes from the right
                raise

    def _dead_letter(self, queue: str, item: bytes, error: str) -> None:
        log.error("dead-lettering an unreadable item of queue %s (%d bytes): %s", queue, len(item), error)
        stream = self.connection.client.transport_options.get(DEAD_LETTERS, streams.DLQ_STREAM)
        with self.conn_or_acquire() as client:
            dead_letters.add_safely(
                client, error=error, origin={"queue": queue}, original={"item": item}, stream=stream
            )


class Transport(kombu_redis.Transport):
    Channel = Channel
