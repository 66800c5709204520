"""A standby's check that the leading JobManager's process is gone (services/jobmanager/
leader_liveness.py), against a real redis-server: the leader's named connection closing is the
sign, but only for a leader seen before, only after it stayed away for `absent_for_s`, and never
while Redis itself cannot be asked."""

from __future__ import annotations

import redis

from services.jobmanager.leader_liveness import LeaderConnection
from shared import streams
from shared.clock import FakeClock


def leader_connection(url: str, leader_id: str) -> redis.Redis:
    client = redis.Redis.from_url(url)
    client.client_setname(streams.jm_liveness_name(leader_id))
    return client


def test_a_leader_whose_connection_closed_is_dead_only_after_it_stayed_away(redis_url):
    clock = FakeClock()
    standby = LeaderConnection(redis.Redis.from_url(redis_url), absent_for_s=0.75, clock=clock.now)
    leader = leader_connection(redis_url, "jobmanager@host:101")
    assert not standby.dead("jobmanager@host:101")
    leader.close()
    assert not standby.dead("jobmanager@host:101")  # gone for 0 s: a reconnect may be under way
    clock.advance(0.5)
    assert not standby.dead("jobmanager@host:101")
    clock.advance(0.3)
    assert standby.dead("jobmanager@host:101")


def test_a_leader_that_reconnects_in_time_is_alive(redis_url):
    clock = FakeClock()
    standby = LeaderConnection(redis.Redis.from_url(redis_url), absent_for_s=0.75, clock=clock.now)
    leader = leader_connection(redis_url, "jobmanager@host:102")
    assert not standby.dead("jobmanager@host:102")
    leader.close()
    assert not standby.dead("jobmanager@host:102")
    clock.advance(0.5)
    back = leader_connection(redis_url, "jobmanager@host:102")
    assert not standby.dead("jobmanager@host:102")
    clock.advance(0.5)
    assert not standby.dead("jobmanager@host:102")  # its absence began again from nothing
    back.close()


def test_a_leader_never_seen_connected_is_never_declared_dead(redis_url):
    """An older JobManager that does not name its connections is left to ZooKeeper."""
    clock = FakeClock()
    standby = LeaderConnection(redis.Redis.from_url(redis_url), absent_for_s=0.75, clock=clock.now)
    for _ in range(3):
        assert not standby.dead("jobmanager@host:103")
        clock.advance(10)


def test_nothing_is_dead_while_redis_cannot_be_asked(redis_url):
    clock = FakeClock()
    client = redis.Redis.from_url(redis_url)
    standby = LeaderConnection(client, absent_for_s=0.75, clock=clock.now)
    leader = leader_connection(redis_url, "jobmanager@host:104")
    assert not standby.dead("jobmanager@host:104")
    leader.close()
    assert not standby.dead("jobmanager@host:104")
    clock.advance(0.5)
    standby.client = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2)  # unreachable
    assert not standby.dead("jobmanager@host:104")
    standby.client = client
    assert not standby.dead("jobmanager@host:104")  # the absence is counted afresh after the outage
    clock.advance(0.5)
    assert not standby.dead("jobmanager@host:104")
    clock.advance(0.3)
    assert standby.dead("jobmanager@host:104")
