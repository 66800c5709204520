"""The transport contract (shared/transport/__init__.py), held by both transports alike: the
Redis-streams one the services run on and the in-memory twin the unit and component tests run on.
A test of the JobManager on the twin is only worth something if the twin keeps the same promises:
delivery, acknowledgement after the unit of work, redelivery, duplicates skipped, dead letters for
what cannot be read or is not signed, and the publisher's epoch on every envelope for the receivers'
fencing."""

from __future__ import annotations

import contextlib
import uuid

import pytest

from shared.message_auth import ClusterAuth, RefusedMessage
from shared.messages import SubmitJob, encode, wrap
from shared.transport.memory import InMemoryTransport
from shared.transport.redis_streams import FIELD, SIGNATURE_FIELD, RedisStreamsTransport


class Bus:
    """One transport under test, with what the contract needs that publish/poll do not say:
    appending an entry as a foreign or broken producer would, and reading the dead letters."""

    def __init__(self, transport, append_raw, dead_errors):
        self.t = transport
        self.append_raw = append_raw  # (stream, raw bytes, signature or None)
        self.dead_errors = dead_errors  # () -> the errors of the dead letters, oldest first

    def drain(self, stream: str, handler, group: str = "g", around_batch=None, polls: int = 4) -> int:
        return sum(
            self.t.poll(stream, group, "c", handler, block_ms=10, around_batch=around_batch) for _ in range(polls)
        )


def _memory_bus(auth: ClusterAuth, epoch: int) -> Bus:
    t = InMemoryTransport(sender="test", epoch=epoch, auth=auth)
    return Bus(t, t.append_raw, lambda: [d["error"] for d in t.dead])


def _redis_bus(url: str, auth: ClusterAuth, epoch: int) -> Bus:
    t = RedisStreamsTransport.from_url(url, sender="test", epoch=epoch, auth=auth)
    start = t.dead_letters(1)
    since = start[0]["id"] if start else "0-0"

    def append_raw(stream: str, raw: bytes, signature: str | None) -> None:
        t.client.xadd(stream, {FIELD: raw, **({SIGNATURE_FIELD: signature} if signature is not None else {})})

    def dead_errors() -> list[str]:
        rows = [d for d in reversed(t.dead_letters(1000)) if _after(d["id"], since)]
        return [d["error"].decode() for d in rows]

    return Bus(t, append_raw, dead_errors)


def _after(entry_id: str, since: str) -> bool:
    return tuple(map(int, entry_id.split("-"))) > tuple(map(int, since.split("-")))


@pytest.fixture(params=["memory", "redis"])
def make_bus(request):
    made: list[Bus] = []

    def make(epoch: int = 0, auth: ClusterAuth | None = None) -> Bus:
        auth = auth or ClusterAuth.ephemeral()
        bus = (
            _memory_bus(auth, epoch)
            if request.param == "memory"
            else _redis_bus(request.getfixturevalue("redis_url"), auth, epoch)
        )
        made.append(bus)
        return bus

    yield make
    for bus in made:
        bus.t.close()


@pytest.fixture
def stream() -> str:
    return f"hr:contract:{uuid.uuid4().hex[:10]}"  # a stream of its own: the Redis server is shared


def test_a_published_body_reaches_the_handler_once_with_its_sender(make_bus, stream):
    bus = make_bus()
    ids = [bus.t.publish(stream, SubmitJob(job_id=f"j{n}")) for n in range(3)]
    seen = []
    assert bus.drain(stream, seen.append) == 3
    assert [e.body.job_id for e in seen] == ["j0", "j1", "j2"]
    assert [e.message_id for e in seen] == ids
    assert {e.sender for e in seen} == {"test"}
    assert bus.drain(stream, seen.append) == 0  # acknowledged: not delivered again


def test_every_consumer_group_gets_every_entry(make_bus, stream):
    bus = make_bus()
    bus.t.publish_many([(stream, SubmitJob(job_id="a")), (stream, SubmitJob(job_id="b"))])
    first, second = [], []
    bus.drain(stream, first.append, group="one")
    bus.drain(stream, second.append, group="two")
    assert [e.body.job_id for e in first] == [e.body.job_id for e in second] == ["a", "b"]


def test_the_envelope_carries_the_publishers_epoch_for_the_receivers_fencing(make_bus, stream):
    bus = make_bus(epoch=7)
    bus.t.publish(stream, SubmitJob(job_id="leader"))
    bus.t.publish(stream, SubmitJob(job_id="explicit"), epoch=9)
    seen = []
    bus.drain(stream, seen.append)
    assert [(e.body.job_id, e.epoch) for e in seen] == [("leader", 7), ("explicit", 9)]


def test_an_entry_is_acknowledged_only_after_the_unit_of_work_around_its_batch(make_bus, stream):
    bus = make_bus()
    bus.t.publish(stream, SubmitJob(job_id="a"))
    bus.t.publish(stream, SubmitJob(job_id="b"))
    handled = []

    @contextlib.contextmanager
    def failing_commit(envelopes):
        yield
        raise RuntimeError("the catalog transaction failed")

    with pytest.raises(RuntimeError, match="catalog transaction"):
        bus.t.poll(stream, "g", "c", handled.append, block_ms=10, around_batch=failing_commit)
    assert [e.body.job_id for e in handled] == ["a", "b"]  # the handlers ran, the batch did not count
    again = []
    assert bus.drain(stream, again.append) == 2
    assert [e.body.job_id for e in again] == ["a", "b"]


def test_an_entry_whose_handler_raised_is_delivered_again(make_bus, stream):
    bus = make_bus()
    bus.t.publish(stream, SubmitJob(job_id="flaky"))
    calls = []

    def handler(env):
        calls.append(env.body.job_id)
        if len(calls) == 1:
            raise RuntimeError("a transient failure")

    with pytest.raises(RuntimeError, match="transient"):
        bus.t.poll(stream, "g", "c", handler, block_ms=10)
    assert bus.drain(stream, handler) == 1
    assert calls == ["flaky", "flaky"]


def test_a_message_id_already_handled_by_the_group_is_not_handled_again(make_bus, stream):
    """A producer that retried a publish (or a leader re-sending after failover) appends the same
    envelope twice: the group handles it once."""
    bus = make_bus()
    env = wrap(SubmitJob(job_id="once"), sender="test", epoch=0)
    raw = encode(env)
    signature = bus.t.auth.sign(stream, "test", raw)
    bus.append_raw(stream, raw, signature)
    seen = []
    bus.drain(stream, seen.append)
    bus.append_raw(stream, raw, signature)
    bus.drain(stream, seen.append)
    assert [e.message_id for e in seen] == [env.message_id]


@pytest.mark.parametrize("raw", [b"{not json", b'{"v": 1}'])
def test_an_entry_that_does_not_decode_is_dead_lettered_and_the_consumer_goes_on(make_bus, stream, raw):
    bus = make_bus()
    bus.append_raw(stream, raw, None)
    bus.t.publish(stream, SubmitJob(job_id="after"))
    seen = []
    bus.drain(stream, seen.append)
    assert [e.body.job_id for e in seen] == ["after"]
    assert len(bus.dead_errors()) == 1


def test_unsigned_and_foreign_signed_entries_are_dead_lettered_unhandled(make_bus, stream):
    bus = make_bus()
    unsigned = encode(wrap(SubmitJob(job_id="unsigned"), sender="test", epoch=0))
    bus.append_raw(stream, unsigned, None)
    forged = encode(wrap(SubmitJob(job_id="forged"), sender="test", epoch=0))
    bus.append_raw(stream, forged, ClusterAuth.ephemeral().sign(stream, "test", forged))  # another secret
    bus.t.publish(stream, SubmitJob(job_id="ours"))
    seen = []
    bus.drain(stream, seen.append)
    assert [e.body.job_id for e in seen] == ["ours"]
    errors = bus.dead_errors()
    assert len(errors) == 2, errors
    assert "unsigned" in errors[0].lower()


def test_an_entry_the_handler_refuses_is_dead_lettered_not_retried(make_bus, stream):
    bus = make_bus()
    bus.t.publish(stream, SubmitJob(job_id="refused"))
    bus.t.publish(stream, SubmitJob(job_id="fine"))
    calls = []

    def handler(env):
        calls.append(env.body.job_id)
        if env.body.job_id == "refused":
            raise RefusedMessage("not for this receiver")

    bus.drain(stream, handler)
    assert calls == ["refused", "fine"]
    assert bus.dead_errors() == ["not for this receiver"]
