"""services/resourcemanager/liveness.py: a missing named connection is a death only when it was
seen connected to the same run of the Redis server (a restart drops every connection)."""

from __future__ import annotations

from redis.exceptions import NoPermissionError

from services.resourcemanager.liveness import ConnectionLiveness


class FakeRedis:
    """What the liveness check reads: INFO server's run_id and the normal clients' names."""

    def __init__(self, info_allowed: bool = True):
        self.run_id, self.names, self.info_allowed = "run-1", set(), info_allowed

    def pipeline(self, transaction: bool = False):
        return FakePipeline(self)


class FakePipeline:
    def __init__(self, server: FakeRedis):
        self.server, self.calls = server, []

    def info(self, section):
        refused = NoPermissionError("this user has no permissions to run the 'info' command")
        self.calls.append(lambda: {"run_id": self.server.run_id} if self.server.info_allowed else refused)

    def client_list(self, _type):
        self.calls.append(lambda: [{"name": n} for n in sorted(self.server.names)])

    def execute(self, raise_on_error: bool = True):
        results = [call() for call in self.calls]
        if raise_on_error:
            for r in results:
                if isinstance(r, Exception):
                    raise r
        return results


def test_a_connection_gone_for_two_looks_is_a_death():
    redis = FakeRedis()
    redis.names = {"hr-tm-1", "hr-tm-2"}
    live = ConnectionLiveness(redis)
    assert live.dead({"hr-tm-1", "hr-tm-2"}) == set()
    redis.names = {"hr-tm-2"}
    assert live.dead({"hr-tm-1", "hr-tm-2"}) == set()
    assert live.dead({"hr-tm-1", "hr-tm-2"}) == {"hr-tm-1"}


def test_a_missing_connection_is_suspected_until_it_is_back_or_declared_dead():
    redis = FakeRedis()
    redis.names = {"hr-tm-1"}
    live = ConnectionLiveness(redis)
    live.dead({"hr-tm-1"})
    assert not live.suspected()
    redis.names = set()
    live.dead({"hr-tm-1"})
    assert live.suspected()  # the ResourceManager looks again after 0.1 s instead of 0.5 s
    redis.names = {"hr-tm-1"}
    live.dead({"hr-tm-1"})
    assert not live.suspected()
    redis.names = set()
    live.dead({"hr-tm-1"})
    assert live.dead({"hr-tm-1"}) == {"hr-tm-1"}
    assert not live.suspected()


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


def test_without_info_in_its_acl_a_missing_name_still_counts_and_it_says_so_once(caplog):
    redis = FakeRedis(info_allowed=False)
    live = ConnectionLiveness(redis)
    assert live.dead({"hr-tm-1"}) == set()  # missing at the first look, as a death was before
    assert live.dead({"hr-tm-1"}) == {"hr-tm-1"}
    [warning] = caplog.records  # once, not at every look
    assert "redis-auth deploy" in warning.getMessage()
