"""The restart policy and the supervisor's bookkeeping, on a fake cluster and a fake clock."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.cluster.process_supervisor import ChildRecord, RestartPolicy, Supervisor
from services.cluster.redis_auth import outside
from shared.clock import FakeClock


class FakeCluster:
    def __init__(self):
        self.pids = {"taskmanager-1": 10, "redis": 20}
        self.codes: dict[str, int | None] = {"taskmanager-1": None, "redis": None}
        self.restarted: list[str] = []
        self.changes = 0

    def live_children(self):
        return {n: (self.pids[n], self.codes[n], Path(f"/logs/{n}.log")) for n in self.pids}

    def restart(self, name):
        self.restarted.append(name)
        self.pids[name] += 1
        self.codes[name] = None

    def supervision_changed(self):
        self.changes += 1


def test_backoff_doubles_from_one_second_to_thirty_and_resets_after_a_minute_of_running():
    p = RestartPolicy()
    assert [p.delay(n) for n in range(1, 8)] == [1, 2, 4, 8, 16, 30, 30]
    assert p.quick_exits(previous=5, ran_s=59) == 6
    assert p.quick_exits(previous=5, ran_s=60) == 1
    with pytest.raises(ValueError):
        RestartPolicy(initial_s=0)


def make(notes):
    cluster, clock = FakeCluster(), FakeClock(start=100.0)
    sup = Supervisor(cluster, clock=clock.now, notify=notes.append)
    for name in cluster.pids:
        sup.records[name] = ChildRecord(started_at=clock.now())
    return cluster, clock, sup


def test_an_exit_is_reported_with_its_code_and_log_and_restarted_after_the_backoff():
    notes: list[str] = []
    cluster, clock, sup = make(notes)
    clock.advance(120)  # ran well for two minutes
    cluster.codes["taskmanager-1"] = -9
    sup.check()
    assert cluster.restarted == []
    assert notes == [
        "supervisor: taskmanager-1 (pid 10) was killed by SIGKILL; restarting in 1 s (restart 1); "
        "see /logs/taskmanager-1.log"
    ]
    clock.advance(0.5)
    sup.check()
    assert cluster.restarted == []
    clock.advance(0.6)
    sup.check()
    assert cluster.restarted == ["taskmanager-1"]
    assert sup.view()["taskmanager-1"] | {"last_exit_at": None} == {
        "restarts": 1,
        "last_exit": -9,
        "last_exit_at": None,
        "crash_loop": False,
    }


def test_a_crash_loop_backs_off_and_says_so():
    notes: list[str] = []
    cluster, clock, sup = make(notes)
    delays = []
    for _ in range(7):
        cluster.codes["redis"] = 1
        sup.check()
        delay = sup.records["redis"].restart_at - clock.now()
        delays.append(delay)
        clock.advance(delay)
        sup.check()
        clock.advance(2)  # dies two seconds after each start
    assert delays == [1, 2, 4, 8, 16, 30, 30]
    assert "crash loop: 3 exits within 60 s of a start" in notes[4]
    view = sup.view()["redis"]
    assert view["restarts"] == 7 and view["last_exit"] == 1 and view["crash_loop"]
    assert cluster.restarted == ["redis"] * 7


def test_a_stopped_supervisor_restarts_nothing():
    cluster, clock, sup = make([])
    sup.stop()
    cluster.codes["redis"] = 0
    clock.advance(100)
    sup.check()
    assert cluster.restarted == []


def test_outside_matches_exactly_the_keys_without_the_prefixes():
    import fnmatch

    patterns = outside(("hr:", "tm.", "unacked"))

    def allowed(key):
        # Redis globs: `[^x]` negates like fnmatch's `[!x]`.
        return any(fnmatch.fnmatchcase(key, p.replace("[^", "[!")) for p in patterns)

    for key in (
        "clicks",
        "h",
        "hr",
        "hrx",
        "hr-stream",
        "t",
        "tm",
        "tmx",
        "tm-1",
        "un",
        "unack",
        "headrace:sink:a",
        "x:hr:y",
        "unac",
    ):
        assert allowed(key), key
    for key in ("hr:", "hr:stream:jm", "tm.tm-1", "unacked", "unacked_index"):
        assert not allowed(key), key
