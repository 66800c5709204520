"""kombu's Redis transport for a TaskManager's command queue, except that an item whose delivery
fails is dead-lettered instead of ending the worker.

kombu pops a queue item (BRPOP), parses it and hands it to Celery's consumer, all inside the
worker's event loop, and an exception on the way is "Unrecoverable error": one
`LPUSH tm.<id> garbage` made the TaskManager exit with a JSONDecodeError, and a body Celery cannot
unpack is a ValueError out of its solo pool. kombu offers no hook around a delivery
(celery/celery#4308, celery/kombu#2421), so this channel reads BRPOP's reply itself, the way
kombu 5 does, and delivers each item inside a guard: whatever kombu or Celery raised on it goes to
the dead-letter stream with the error, and the worker goes on (the item has left the queue:
nothing is redelivered). It knows nothing of Celery's message layout (of kombu's, only the
delivery tag, to release a failed item): kombu parses the item, Celery reads the task, and
Celery's own refusals (an unknown task, a content type other than JSON: a pickle is never decoded)
are dead-lettered through its signals (services/taskmanager/commands.py).

Use: `app.conf.broker_transport = "shared.transport.kombu_redis:Transport"`.
"""

from __future__ import annotations

import contextlib
import logging
from queue import Empty

import redis
from kombu.transport import redis as kombu_redis
from kombu.utils.encoding import bytes_to_str
from kombu.utils.json import loads

from shared import streams
from shared.transport import dead_letters

log = logging.getLogger(__name__)

# Items one read may take from a queue with a backlog (see Channel._deliver_backlog).
MORE_PER_READ = 50
# Transport option: a callable returning a context manager that is entered around the deliveries
# of one read (the TaskManager sends the reports of the commands it took in one round trip).
AROUND_READ = "headrace_around_read"
# Transport option: the stream the items no one can take are dead-lettered to (a TaskManager's own).
DEAD_LETTERS = "headrace_dead_letters"
# What a delivery may raise that is Redis going away, not the item's fault (kombu's own list of
# connection errors has KeyError in it, which a malformed item raises).
LOST_CONNECTION = (redis.ConnectionError, redis.TimeoutError, OSError)


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
        # kombu 5's Channel._brpop_read, with the delivery guarded and the backlog read after it.
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
            around = self.connection.client.transport_options.get(AROUND_READ)
            with around() if around is not None else contextlib.nullcontext():
                self._deliver_guarded(item, dest)
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
        of a TaskManager's time. An empty queue costs one RPOP that returns nothing. If the
        worker stops in the middle (a BaseException: Celery's WorkerShutdown), what was popped
        but not delivered goes back to the head of the queue.
        (RPOP with a count needs Redis 6.2 or newer: Debian 12 has 7.0, the compose stack redis:7.)"""
        with self.conn_or_acquire() as client:
            items = client.rpop(key, MORE_PER_READ - 1) or []
        for i, item in enumerate(items):
            try:
                self._deliver_guarded(item, queue)
            except BaseException:
                rest = items[i + 1 :]
                if rest:
                    with self.conn_or_acquire() as client:
                        client.rpush(key, *reversed(rest))  # BRPOP takes from the right
                raise

    def _deliver_guarded(self, item: bytes, queue: str) -> None:
        """Hand one item to the consumer (kombu's parse, then Celery); if that raises, the item is
        dead-lettered and the worker goes on. Only a lost connection and a BaseException (the
        worker stopping) pass."""
        message = None
        try:
            message = loads(bytes_to_str(item))
            self.connection._deliver(message, queue)
        except LOST_CONNECTION:
            raise  # Redis is gone, not the item's fault: Celery's consumer reconnects, as without the guard
        except Exception as exc:
            error = f"delivery failed: {described(exc)}"
            # A traceback only for what is not the usual shape of a malformed item.
            unusual = not isinstance(exc, ValueError | KeyError | TypeError)
            log.error("dead-lettering an item of queue %s (%d bytes): %s", queue, len(item), error, exc_info=unusual)
            self._forget(message)
            self._dead_letter(queue, item, error)

    def _forget(self, message: object) -> None:
        """A message kombu had handed to the consumer before the failure would stay unacknowledged
        in the channel's QoS and count against the prefetch limit for ever: drop it."""
        properties = message.get("properties") if isinstance(message, dict) else None
        tag = properties.get("delivery_tag") if isinstance(properties, dict) else None
        if not isinstance(tag, str):
            return
        try:
            self.qos.get(tag)
        except KeyError:
            return  # kombu never made a message of it, or the consumer settled it
        self.qos.reject(tag, requeue=False)

    def _dead_letter(self, queue: str, item: bytes, error: str) -> None:
        stream = self.connection.client.transport_options.get(DEAD_LETTERS, streams.DLQ_STREAM)
        with self.conn_or_acquire() as client:
            dead_letters.add_safely(
                client, error=error, origin={"queue": queue}, original={"item": item}, stream=stream
            )


def described(exc: Exception) -> str:
    """`KeyError: 'properties'`, `binascii.Error: Incorrect padding`: the exception's type as an
    operator can look it up, and its message."""
    kind = type(exc)
    name = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
    return f"{name}: {exc}"


class Transport(kombu_redis.Transport):
    Channel = Channel
