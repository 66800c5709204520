"""services/resourcemanager/liveness.py: a missing named connection is a death only when it was
seen connected to the same run of the Redis server (a restart drops every connection)."""

from __future__ import annotations

from services.resourcemanager.liveness import ConnectionLiveness


class FakeRedis:
    """What the liveness check reads: INFO server's run_id and the normal clients' names."""

    def __init__(self):
        self.run_id, self.names = "run-1", set()

    def pipeline(self, transaction: bool = False):
        return FakePipeline(self)


class FakePipeline:
    def __init__(self, server: FakeRedis):
        self.server, self.calls = server, []

    def info(self, section):
        self.calls.append(lambda: {"run_id": self.server.run_id})

    def client_list(self, _type):
        self.calls.append(lambda: [{"name": n} for n in sorted(self.server.names)])

    def execute(self):
        return [call() for call in self.calls]


def test_a_connection_gone_for_two_looks_is_a_death():
    redis = FakeRedis()
    redis.names = {"hr-tm-1", "hr-tm-2"}
    live = ConnectionLiveness(redis)
    assert live.dead({"hr-tm-1", "hr-tm-2"}) == set()
    redis.names = {"hr-tm-2"}
    assert live.dead({"hr-tm-1", "hr-tm-2"}) == set()
    assert live.dead({"hr-tm-1", "hr-tm-2"}) == {"hr-tm-1"}


def test_a_connection_back_before_the_second_look_is_no_death():
    redis = FakeRedis()
    redis.names = {"hr-tm-1"}
    live = ConnectionLiveness(redis)
    live.dead({"hr-tm-1"})
    redis.names = set()
    assert live.dead({"hr-tm-1"}) == set()
    redis.names = {"hr-tm-1"}
    assert live.dead({"hr-tm-1"}) == set()
    redis.names = set()
    assert live.dead({"hr-tm-1"}) == set()  # the count started again


def test_after_a_redis_restart_no_connection_is_missed_until_it_reconnects():
    redis = FakeRedis()
    redis.names = {"hr-tm-1", "hr-tm-2"}
    live = ConnectionLiveness(redis)
    live.dead({"hr-tm-1", "hr-tm-2"})
    redis.run_id, redis.names = "run-2", set()  # restarted: every connection dropped
    for _ in range(5):
        assert live.dead({"hr-tm-1", "hr-tm-2"}) == set()
    redis.names = {"hr-tm-1", "hr-tm-2"}  # both reconnected at their next heartbeat
    assert live.dead({"hr-tm-1", "hr-tm-2"}) == set()
    redis.names = {"hr-tm-2"}  # and now one dies for real
    live.dead({"hr-tm-1", "hr-tm-2"})
    assert live.dead({"hr-tm-1", "hr-tm-2"}) == {"hr-tm-1"}


def test_a_name_missing_at_the_first_look_is_left_to_the_heartbeats():
    redis = FakeRedis()
    live = ConnectionLiveness(redis)
    for _ in range(3):
        assert live.dead({"hr-tm-9"}) == set()
