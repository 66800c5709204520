"""Redis-streams transport: consumer groups, ack after success, dedup by message id, DLQ.

Every entry is signed (shared/message_auth.py): `m` holds the envelope's exact bytes and `s`
their HMAC under the sender's key; an entry that is unsigned, badly signed or against the sender
rules is dead-lettered before any handler sees it, and so is one a handler refuses with
`RefusedMessage`.

A Redis that restarted without its data has lost every stream with its consumer groups: the
next read of a group answers NOGROUP. `poll` then creates the group again (from "0", so what
producers sent since the restart is read) and carries on in the same call.

A consumer may read several streams in one blocking call (`poll(..., also=...)`: the services'
own stream and one per TaskManager, shared/streams.py); their entries are handled as one batch in
the order Redis took them (entry ids come from one clock). A producer may be given a `route`:
the stream it names -> the stream it writes (a TaskManager writes its reports to streams of its own).
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any, Callable, Mapping, Sequence, cast

import redis

from shared import streams
from shared.message_auth import DEDUP_WINDOW_S, SIGNATURE_FIELD, ClusterAuth, RefusedMessage
from shared.messages import Envelope, UndecodableMessage, decode, encode, wrap
from shared.transport import dead_letters
from shared.transport.base import Handler

log = logging.getLogger(__name__)

FIELD = b"m"
# Handled ids are kept in one hash per hour; checking this many (the current one and those
# before it) remembers every id for at least DEDUP_WINDOW_S, the age past which the sender
# checks refuse a message (shared/message_auth.py staleness).
DONE_HOURS = DEDUP_WINDOW_S // 3600 + 1
DONE_TTL_S = DONE_HOURS * 3600
MAX_HANDLER_FAILURES = 3


def _no_unit_of_work(_envelopes):
    return contextlib.nullcontext()


class RedisStreamsTransport:
    def __init__(
        self,
        client: redis.Redis,
        *,
        sender: str,
        epoch: int = 0,
        maxlen: int = 100_000,
        auth: ClusterAuth | None = None,
        route: Mapping[str, str] | None = None,
    ):
        self.client = client
        self.sender = sender
        self.route = dict(route or {})
        # Called with (stream, message type) for each entry refused by the sender checks: the
        # services count them (headrace_messages_refused_total).
        self.on_refused: Callable[[str, str], None] | None = None
        # Without keys of its own, a transport signs under a secret nobody else has: what it
        # sends is dead-lettered elsewhere rather than trusted (ClusterAuth.ephemeral).
        self.auth = auth or ClusterAuth.ephemeral()
        self.epoch = epoch
        self.maxlen = maxlen
        self._groups: set[tuple[str, str]] = set()
        # Our own pending entries are re-read once after start: they were delivered to a previous
        # incarnation of this consumer that died before acknowledging them.
        self._drained_pending: set[tuple[str, str, str]] = set()
        self._failures: dict[tuple[str, bytes], int] = {}

    @property
    def redis_client(self) -> redis.Redis:
        return self.client

    @classmethod
    def from_url(cls, url: str, *, sender: str, epoch: int = 0, maxlen: int = 100_000, auth: ClusterAuth | None = None):
        return cls(redis.Redis.from_url(url), sender=sender, epoch=epoch, maxlen=maxlen, auth=auth)

    def signed(self, stream: str, body, *, epoch: int | None, sender: str | None) -> tuple[str, dict]:
        """(message id, the entry's fields): the envelope's bytes and their signature."""
        sender = sender or self.auth.sender_for(body, self.sender)
        env = wrap(body, sender=sender, epoch=self.epoch if epoch is None else epoch)
        raw = encode(env)
        return env.message_id, {FIELD: raw, SIGNATURE_FIELD: self.auth.sign(stream, sender, raw)}

    def publish(self, stream: str, body, *, epoch: int | None = None, sender: str | None = None) -> str:
        """`sender`: speak as another sender this transport's keys can sign for (tests, benchmarks)."""
        stream = self.route.get(stream, stream)
        message_id, fields = self.signed(stream, body, epoch=epoch, sender=sender)
        self.client.xadd(stream, fields, maxlen=streams.maxlen_for(stream, self.maxlen), approximate=True)
        return message_id

    def publish_many(
        self, items: list[tuple[str, object]], *, epoch: int | None = None, sender: str | None = None
    ) -> None:
        pipe = self.client.pipeline(transaction=False)
        for named, body in items:
            stream = self.route.get(named, named)
            _, fields = self.signed(stream, body, epoch=epoch, sender=sender)
            pipe.xadd(stream, fields, maxlen=streams.maxlen_for(stream, self.maxlen), approximate=True)
        pipe.execute()

    def ensure_group(self, stream: str, group: str) -> None:
        if (stream, group) in self._groups:
            return
        try:
            # "0": a group created after producers started still sees what they already sent.
            self.client.xgroup_create(stream, group, id="0", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        self._groups.add((stream, group))

    def poll(
        self,
        stream: str,
        group: str,
        consumer: str,
        handler: Handler,
        *,
        count: int = 256,
        block_ms: int = 1000,
        around_batch=None,
        also: Sequence[str] = (),
    ) -> int:
        """Read `stream` and the `also` streams (up to `count` entries of each) in one call."""
        names = list(dict.fromkeys([stream, *also]))
        kw = dict(count=count, block_ms=block_ms, around_batch=around_batch)
        for name in names:
            self.ensure_group(name, group)
        try:
            return self._poll(names, group, consumer, handler, **kw)
        except redis.ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
        # Redis restarted empty: the groups went with the streams, and our pending entries with
        # them. Create them again and read in this same call (a second NOGROUP is an error).
        log.warning(
            "consumer group %s of %s is gone (Redis lost its data?); creating it again", group, ", ".join(names)
        )
        for name in names:
            self._groups.discard((name, group))
            self._drained_pending.discard((name, group, consumer))
            self.ensure_group(name, group)
        self._failures.clear()
        return self._poll(names, group, consumer, handler, **kw)

    def _poll(self, names: list[str], group, consumer, handler, *, count, block_ms, around_batch) -> int:
        undrained = [n for n in names if (n, group, consumer) not in self._drained_pending]
        items: list[Item] = []
        if undrained:
            items = _items(self.client.xreadgroup(group, consumer, dict.fromkeys(undrained, "0"), count=count))
            read = {stream for stream, _, _ in items}
            self._drained_pending.update((n, group, consumer) for n in undrained if n not in read)
        if not items:
            items = _items(
                self.client.xreadgroup(group, consumer, dict.fromkeys(names, ">"), count=count, block=block_ms or None)
            )
        if not items:
            return 0
        items.sort(key=lambda item: _order(item[1]))
        try:
            return self._deliver(group, items, handler, around_batch or _no_unit_of_work)
        except Exception:
            # Re-read our pending entries next time, so the failed one is retried.
            self._drained_pending.difference_update((n, group, consumer) for n in names)
            raise

    def _deliver(self, group: str, items: list[Item], handler: Handler, around_batch) -> int:
        decoded: list[tuple[str, bytes, Envelope]] = []
        dead: list[tuple[str, bytes, Mapping[Any, dead_letters.Value], str]] = []
        for stream, entry_id, fields in items:
            raw = (fields or {}).get(FIELD)
            try:
                if raw is None:
                    raise UndecodableMessage(f"entry has no '{FIELD.decode()}' field")
                env = decode(raw)
            except UndecodableMessage as exc:
                dead.append((stream, entry_id, fields or {}, str(exc)))
                continue
            refused = self.auth.check(stream, env, raw, fields.get(SIGNATURE_FIELD) if fields else None)
            if refused is not None:
                dead.append((stream, entry_id, fields or {}, refused))
                self._count_refusal(stream, env.body.type)
            else:
                decoded.append((stream, entry_id, env))
        if dead:
            pipe = self.client.pipeline(transaction=False)
            for stream, entry_id, original, error in dead:
                log.warning("dead-lettering entry %s of %s: %s", entry_id, stream, error)
                dead_letters.add(
                    pipe,
                    error=error,
                    origin={"stream": stream, "entry_id": entry_id, "group": group},
                    original=original,
                )
                pipe.xack(stream, group, entry_id)
            pipe.execute()
        if not decoded:
            return 0
        hour = int(time.time() // 3600)
        ids = [env.message_id for _, _, env in decoded]
        check = self.client.pipeline(transaction=False)
        for back in range(DONE_HOURS):
            check.hmget(streams.done_hash(group, hour - back), ids)
        seen = [any(marks) for marks in zip(*check.execute(), strict=True)]
        handled = 0
        done: dict[str, None] = {}  # ordered set of message ids handled in this batch
        pipe = self.client.pipeline(transaction=False)
        # Acks are sent only after the whole batch (and the caller's unit of work around it)
        # succeeded; if anything raises, every entry of the batch stays pending and is
        # redelivered, which idempotent handlers tolerate.
        with around_batch([env for _, _, env in decoded]):
            for (stream, entry_id, env), handled_before in zip(decoded, seen, strict=True):
                if handled_before or env.message_id in done:
                    continue  # handled before, or earlier in this very batch (a producer retried)
                try:
                    handler(env)
                except RefusedMessage as exc:
                    log.warning(
                        "dead-lettering %s %s of %s from %s: %s", env.body.type, entry_id, stream, env.sender, exc
                    )
                    dead_letters.add(
                        pipe,
                        error=str(exc),
                        original={"m": encode(env)},
                        origin={"stream": stream, "entry_id": entry_id, "group": group},
                    )
                    self._count_refusal(stream, env.body.type)
                except Exception as exc:
                    n = self._failures[(stream, entry_id)] = self._failures.get((stream, entry_id), 0) + 1
                    if n < MAX_HANDLER_FAILURES:
                        raise
                    # A poison message: park it where an operator can see it, move on.
                    log.exception("handler failed %d times on %s; dead-lettering", n, entry_id)
                    dead_letters.add(
                        pipe,
                        error=f"handler failed: {exc!r}",
                        origin={"stream": stream, "entry_id": entry_id, "group": group},
                        original={"m": encode(env)},
                    )
                self._failures.pop((stream, entry_id), None)
                handled += 1
                done[env.message_id] = None
        if done:
            key = streams.done_hash(group, hour)
            pipe.hset(key, mapping=dict.fromkeys(done, 1))
            pipe.expire(key, DONE_TTL_S)
        for stream in dict.fromkeys(stream for stream, _, _ in decoded):
            pipe.xack(stream, group, *[entry_id for s, entry_id, _ in decoded if s == stream])
        pipe.execute()
        return handled

    def _count_refusal(self, stream: str, message_type: str) -> None:
        if self.on_refused is not None:
            self.on_refused(stream, message_type)

    def dead_letters(self, count: int = 100) -> list[dict]:
        # redis-py types an answer for every client mode; this client's are bytes.
        rows = cast("list[tuple[bytes, dict[bytes, bytes]]]", self.client.xrevrange(streams.DLQ_STREAM, count=count))
        return [{k.decode(): v for k, v in f.items()} | {"id": i.decode()} for i, f in rows]

    def close(self) -> None:
        self.client.close()


def wait_for_redis(url: str, timeout_s: float = 30.0, client_name: str | None = None) -> redis.Redis:
    client = redis.Redis.from_url(url, client_name=client_name)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            client.ping()
            return client
        except redis.ConnectionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


# One entry read (as this client reads it: bytes; the fields of a deleted entry are None) and the
# stream it came from.
Item = tuple[str, bytes, "dict[bytes, bytes] | None"]


def _items(response: Any) -> list[Item]:
    """XREADGROUP's answer, [[stream, [(id, fields), ...]], ...], as (stream, id, fields)."""
    out: list[Item] = []
    for raw_stream, entries in response or ():
        stream = raw_stream.decode() if isinstance(raw_stream, bytes) else str(raw_stream)
        out.extend((stream, entry_id, fields) for entry_id, fields in entries)
    return out


def _order(entry_id: bytes | str) -> tuple[int, int]:
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    ms, _, seq = text.partition("-")
    return int(ms), int(seq or 0)
