"""The Redis-streams transport against a real redis-server: what the services rely on."""

from __future__ import annotations

import pytest

from shared import streams
from shared.message_auth import ClusterAuth
from shared.messages import SubmitJob, encode, wrap
from shared.transport.redis_streams import RedisStreamsTransport


@pytest.fixture
def transport(redis_url):
    t = RedisStreamsTransport.from_url(redis_url, sender="test", maxlen=50)
    yield t
    t.close()


def drain(t, handler, stream=streams.JM_STREAM, group="g", consumer="c"):
    total = 0
    for _ in range(5):
        total += t.poll(stream, group, consumer, handler, block_ms=10)
    return total


def test_malformed_entry_goes_to_dead_letters_and_consumer_keeps_going(transport):
    transport.client.xadd(streams.JM_STREAM, {b"m": b"{not json"})
    transport.client.xadd(streams.JM_STREAM, {b"other": b"field"})
    transport.publish(streams.JM_STREAM, SubmitJob(job_id="a"))
    seen = []
    drain(transport, lambda env: seen.append(env.body.job_id))
    assert seen == ["a"]
    dead = transport.dead_letters()
    assert len(dead) == 2 and all(d["stream"] == streams.JM_STREAM.encode() for d in dead)
    assert transport.client.xpending(streams.JM_STREAM, "g")["pending"] == 0


def test_handler_failure_redelivers_then_dead_letters_a_poison_message(transport):
    transport.publish(streams.JM_STREAM, SubmitJob(job_id="poison"))
    transport.publish(streams.JM_STREAM, SubmitJob(job_id="fine"))
    calls = []

    def handler(env):
        calls.append(env.body.job_id)
        if env.body.job_id == "poison":
            raise RuntimeError("cannot handle")

    for _ in range(5):
        try:
            transport.poll(streams.JM_STREAM, "g", "c", handler, block_ms=10)
        except RuntimeError:
            pass
    assert calls.count("poison") == 3  # tried three times, then parked
    assert "fine" in calls
    assert [d["error"] for d in transport.dead_letters()][0].startswith(b"handler failed")
    assert transport.client.xpending(streams.JM_STREAM, "g")["pending"] == 0


def test_unacknowledged_entries_are_redelivered_to_a_restarted_consumer(redis_url):
    auth = ClusterAuth.ephemeral()  # one cluster's keys, held by both incarnations
    first = RedisStreamsTransport.from_url(redis_url, sender="t", auth=auth)
    first.publish(streams.RM_STREAM, SubmitJob(job_id="x"))
    with pytest.raises(RuntimeError):
        first.poll(streams.RM_STREAM, "g", "c", lambda env: (_ for _ in ()).throw(RuntimeError("crash")), block_ms=10)
    restarted = RedisStreamsTransport.from_url(redis_url, sender="t", auth=auth)  # same consumer name, new process
    seen = []
    drain(restarted, lambda env: seen.append(env.body.job_id), stream=streams.RM_STREAM)
    assert seen == ["x"]


def test_same_message_id_is_handled_once(transport):
    env = wrap(SubmitJob(job_id="once"), sender="x")
    fields = {b"m": encode(env), b"s": transport.auth.sign(streams.JM_STREAM, "x", encode(env))}
    transport.client.xadd(streams.JM_STREAM, fields)
    transport.client.xadd(streams.JM_STREAM, fields)  # a producer retried
    seen = []
    drain(transport, lambda e: seen.append(e.body.job_id))
    assert seen == ["once"]


def test_streams_are_capped(transport):
    for i in range(500):
        transport.publish(streams.JM_STREAM, SubmitJob(job_id=str(i)))
    assert transport.client.xlen(streams.JM_STREAM) < 200  # MAXLEN ~50, trimmed by whole nodes


def test_group_is_recreated_after_redis_lost_its_data(transport):
    transport.publish(streams.JM_STREAM, SubmitJob(job_id="before"))
    drain(transport, lambda env: None)
    transport.client.flushall()  # Redis restarted without persistence
    # NOGROUP: the transport recreates its group and reads on.
    assert transport.poll(streams.JM_STREAM, "g", "c", lambda env: None, block_ms=10) == 0
    transport.publish(streams.JM_STREAM, SubmitJob(job_id="after"))
    seen = []
    drain(transport, lambda env: seen.append(env.body.job_id))
    assert seen == ["after"]
