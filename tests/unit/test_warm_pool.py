"""Warm pool sizing and shutdown, with stand-in drivers (no JVM)."""

from __future__ import annotations

import threading
import time

from services.taskmanager.drivers.warm_pool import RETRY_S, WarmPool
from services.taskmanager.drivers.warmup_tokens import REPLACING, SPARE, URGENT, WarmupTokens
from tests.waiting import wait_for


class _Driver:
    def __init__(self, parallelism, for_task=False):
        self.parallelism, self.id, self.pid = parallelism, f"d{id(self)}", None
        self.for_task = for_task
        self.ready, self.execution_id, self.exited = threading.Event(), None, False
        self.session_up = threading.Event()
        self.started_at, self.killed = time.monotonic(), False
        self.log_path = f"driver-{self.id}.log"

    def alive(self):
        return not self.killed

    def kill(self):
        self.killed = True

    def raise_priority(self):
        self.raised, self.niced = True, False


def _pool(started, tokens=None, size=2, parallelism=1, serves_smaller=False):
    def factory(p, for_task=False):
        d = _Driver(p, for_task)
        started.append(d)
        return d

    return WarmPool(
        size=size,
        parallelism=parallelism,
        factory=factory,
        tokens=tokens or WarmupTokens.unlimited(),
        serves_smaller=serves_smaller,
    )


def test_keeps_no_more_drivers_than_free_slots_can_use():
    started = []
    pool = _pool(started)
    pool.replenish(free_slots=4)
    assert len(started) == 2
    pool.replenish(free_slots=1)
    assert [d.killed for d in started].count(True) == 1


def test_a_warm_up_trimmed_for_want_of_slots_is_no_start_failure():
    # Regression: in the compose stack a task took one of two slots, the pool ended its local[2]
    # warm-up still starting, and its exit was logged as a driver that "died before it was ready",
    # with a pause before the next warm-up.
    started = []
    pool = _pool(started, parallelism=2, size=1)
    pool.replenish(free_slots=2)
    pool.replenish(free_slots=1)
    trimmed = started[0]
    assert trimmed.killed
    trimmed.exited = True
    pool.forget(trimmed)
    pool.replenish(free_slots=2)
    assert len(started) == 2  # started again at once: no pause
    failing = started[1]
    failing.exited, failing.killed = True, True  # this one died on its own
    pool.forget(failing)
    pool.replenish(free_slots=2)
    assert len(started) == 2  # a real start failure still earns its pause


def test_a_pool_that_shut_down_starts_nothing():
    # Regression: killing a task driver at shutdown reported a free slot, and the pool started
    # a fresh JVM that outlived the TaskManager by seconds.
    started = []
    pool = _pool(started)
    pool.replenish(free_slots=2)
    pool.shutdown()
    assert all(d.killed for d in started)
    pool.replenish(free_slots=2)
    assert len(started) == 2


def test_warm_ups_on_one_machine_take_turns(tmp_path):
    # Two TaskManagers' pools share one token: the second warms up only once the first
    # driver is ready, not at the same time (on 2 cores both took 3-8 times longer).
    tokens = WarmupTokens(tmp_path, 1)
    first, second = [], []
    a, b = _pool(first, tokens, size=1), _pool(second, tokens, size=1)
    a.replenish(free_slots=1)
    b.replenish(free_slots=1)
    assert len(first) == 1 and second == []
    assert b.status()["waiting"] == 1
    first[0].ready.set()
    wait_for("the second warm-up to start", lambda: len(second), 5, poll_s=0.02, until=lambda n: n == 1)
    a.shutdown()
    b.shutdown()


def test_a_task_never_waits_for_a_token(tmp_path):
    # All tokens are held by another pool's warm-up: a task on a pool with nothing started
    # gets its own driver at once, and the pool's replacement waits for its turn.
    tokens = WarmupTokens(tmp_path, 1)
    other, mine = [], []
    busy, pool = _pool(other, tokens, size=1), _pool(mine, tokens, size=1)
    busy.replenish(free_slots=1)
    pool.replenish(free_slots=1)
    assert mine == []
    d = pool.take(1)
    assert d is not None and mine == [d]
    assert d.for_task, "a driver a task waits for must skip the warm-up query"
    # The other warm-up ends and frees the token: still no warm-up here beside the task's start.
    busy.shutdown()
    pool.replenish(free_slots=1)
    time.sleep(0.6)
    assert len(mine) == 1
    d.ready.set()
    wait_for("the replacement to start", lambda: len(mine), 5, poll_s=0.02, until=lambda n: n == 2)
    assert not mine[1].for_task  # a driver kept in reserve warms up
    pool.shutdown()


def test_a_task_takes_the_warm_up_that_is_already_running(tmp_path):
    tokens = WarmupTokens(tmp_path, 1)
    started = []
    pool = _pool(started, tokens, size=1)
    pool.replenish(free_slots=2)
    assert pool.take(1) is started[0]
    # Its replacement waits until the taken driver, still warming, is ready.
    pool.replenish(free_slots=1)
    assert len(started) == 1
    started[0].ready.set()
    wait_for("the replacement to start", lambda: len(started), 5, poll_s=0.02, until=lambda n: n == 2)
    pool.shutdown()


def test_a_task_takes_a_driver_warming_up_before_one_whose_session_is_not_up():
    started = []
    pool = _pool(started, size=2)
    pool.replenish(free_slots=2)
    older, warming = started
    warming.session_up.set()
    assert pool.status()["warming"] == 1 and pool.status()["ready"] == 0
    assert pool.take(1) is warming
    assert pool.status()["warming"] == 0
    pool.shutdown()


def test_a_dead_process_gives_its_token_back(tmp_path):
    import subprocess
    import sys

    code = (
        "import fcntl,os,sys,time; fd=os.open(sys.argv[1],os.O_RDWR|os.O_CREAT); "
        "fcntl.flock(fd,fcntl.LOCK_EX); print('held',flush=True); time.sleep(60)"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", code, str(tmp_path / "token-0.lock")], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        tokens = WarmupTokens(tmp_path, 1)
        assert tokens.try_acquire() is None
        holder.kill()
        holder.wait(5)
        token = tokens.try_acquire()
        assert token is not None
        token.release()
    finally:
        holder.kill()
        holder.wait(5)


def test_a_local_warm_driver_serves_a_task_of_lower_parallelism_and_gets_its_priority_back():
    started = []
    pool = _pool(started, size=1, parallelism=2, serves_smaller=True)
    pool.replenish(free_slots=1)  # one free slot is enough for a driver that serves p=1 too
    assert len(started) == 1 and started[0].parallelism == 2
    started[0].ready.set()
    taken = pool.take(1)
    assert taken is started[0] and getattr(taken, "raised", False)
    # A task larger than every warm driver gets a driver of its own.
    bigger = pool.take(3)
    assert bigger.parallelism == 3 and bigger.for_task


def test_an_exact_fit_is_taken_before_a_larger_driver():
    started = []
    pool = _pool(started, size=2, parallelism=2, serves_smaller=True)
    pool.replenish(free_slots=2)
    exact = pool.factory(1)
    exact.ready.set()
    pool._drivers.append(exact)
    for d in started:
        d.ready.set()
    assert pool.take(1) is exact


def test_a_standalone_driver_serves_only_its_own_parallelism():
    started = []
    pool = _pool(started, size=1, parallelism=2, serves_smaller=False)
    pool.replenish(free_slots=1)
    assert started == []  # one free slot cannot hold a p=2 task
    pool.replenish(free_slots=2)
    started[0].ready.set()
    own = pool.take(1)
    assert own is not started[0] and own.parallelism == 1


def test_a_starved_low_priority_warm_up_gets_its_priority_back_instead_of_being_discarded():
    started = []
    pool = _pool(started, size=1)
    pool.ready_timeout_s = 0.05
    pool.replenish(free_slots=1)
    d = started[0]
    d.niced = True
    time.sleep(0.1)
    pool.replenish(free_slots=1)
    assert getattr(d, "raised", False) and not d.killed and len(started) == 1
    time.sleep(0.1)  # still not ready a full timeout after that: stuck after all
    d.niced = False
    pool.replenish(free_slots=1)
    assert d.killed


def test_a_taskmanager_without_any_driver_gets_the_next_token_before_one_replacing_its_tasks_driver(tmp_path):
    # One token, held by a third pool's warm-up. Waiting: `replacing` (it handed its only driver
    # to a task) asked first, `urgent` (no driver at all, no task: a failover would land there)
    # asked second. The freed token goes to `urgent`, then the next one to `replacing`.
    tokens = WarmupTokens(tmp_path, 1)
    holder, replacing_started, urgent_started = [], [], []
    holder_pool = _pool(holder, tokens, size=1)
    replacing = _pool(replacing_started, tokens, size=1)
    urgent = _pool(urgent_started, tokens, size=1)
    holder_pool.replenish(free_slots=1)
    task_driver = replacing.take(1)  # no token free: the task's own driver starts at once anyway
    task_driver.ready.set()
    replacing.replenish(free_slots=1)
    urgent.replenish(free_slots=1)
    assert replacing.rank() == REPLACING and urgent.rank() == URGENT
    assert replacing.status()["rank"] == "replacing" and urgent.status()["rank"] == "urgent"
    assert urgent.status()["urgent"], "a TaskManager with no driver and no task waits to warm up urgently"
    assert len(replacing_started) == 1 and urgent_started == []
    holder[0].ready.set()  # its warm-up ends: the token is free
    wait_for("the urgent warm-up to get the token", lambda: len(urgent_started), 5, poll_s=0.02, until=lambda n: n == 1)
    time.sleep(3 * RETRY_S)
    assert len(replacing_started) == 1, "a replacement took the token from a TaskManager with no driver"
    urgent_started[0].ready.set()
    wait_for("the replacement to get its turn", lambda: len(replacing_started), 5, poll_s=0.02, until=lambda n: n == 2)
    # The pool drops its claim just after the start it records (a busy machine shows the gap).
    wait_for(
        "no claim to outlive its warm-up's start",
        lambda: list(tmp_path.glob("waiting-rank-*")),
        5,
        poll_s=0.02,
        until=lambda claims: claims == [],
    )
    for p in (holder_pool, replacing, urgent):
        p.shutdown()


def test_an_urgent_warm_up_runs_at_full_priority_and_a_replacement_beside_a_task_does_not():
    started = []
    pool = _pool(started, size=1)
    pool.replenish(free_slots=2)
    assert getattr(started[0], "raised", False), "a TaskManager's only prospect warmed up niced"
    assert pool.status()["urgent"]  # what keeps the dispatcher's spare planner niced (shared/warm_pools.py)
    started[0].session_up.set()  # a task would take it now, and cut its warm-up short
    assert not pool.status()["urgent"]
    started[0].ready.set()
    task = pool.take(1)
    pool.replenish(free_slots=1)
    replacement = started[1]
    assert not getattr(replacement, "raised", False), "a replacement beside its task warmed up at full priority"
    replacement.niced = True
    assert not pool.status()["urgent"]
    task.killed = True  # the task ended: the replacement is now all this TaskManager has coming
    pool.replenish(free_slots=2)
    assert getattr(replacement, "raised", False) and pool.status()["urgent"]
    pool.shutdown()


def test_a_claim_left_by_a_dead_process_holds_nobody_back(tmp_path):
    import subprocess
    import sys

    code = (
        "import fcntl,os,sys,time; fd=os.open(sys.argv[1],os.O_RDWR|os.O_CREAT); "
        "fcntl.flock(fd,fcntl.LOCK_EX); print('held',flush=True); time.sleep(60)"
    )
    claim = tmp_path / "waiting-rank-0-99999-1.lock"
    holder = subprocess.Popen([sys.executable, "-c", code, str(claim)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        tokens = WarmupTokens(tmp_path, 1)
        assert tokens.outranked(REPLACING) and not tokens.outranked(URGENT)
        assert tokens.try_acquire(REPLACING) is None
        holder.kill()
        holder.wait(5)
        token = tokens.try_acquire(REPLACING)
        assert token is not None and not claim.exists()
        token.release()
    finally:
        holder.kill()
        holder.wait(5)


def test_a_niced_warm_up_gives_its_token_to_an_urgent_one_and_warms_on(tmp_path):
    # One token, taken by a replacement warming up niced beside its pool's task (starved by a
    # busy task, it could hold it for minutes). A TaskManager with no driver at all starts
    # waiting: it gets the token at once, and the replacement is not killed.
    tokens = WarmupTokens(tmp_path, 1)
    replacing_started, urgent_started = [], []
    replacing, urgent = _pool(replacing_started, tokens, size=1), _pool(urgent_started, tokens, size=1)
    task_driver = replacing.take(1)
    task_driver.ready.set()
    replacing.replenish(free_slots=1)
    wait_for("the replacement to start", lambda: len(replacing_started), 5, poll_s=0.02, until=lambda n: n == 2)
    assert replacing.rank() == SPARE
    replacing_started[1].niced = True
    urgent.replenish(free_slots=1)
    wait_for(
        "the urgent warm-up to get the niced one's token",
        lambda: len(urgent_started),
        5,
        poll_s=0.02,
        until=lambda n: n == 1,
    )
    assert not replacing_started[1].killed and replacing.status()["starting"] == 1
    for p in (replacing, urgent):
        p.shutdown()


def test_a_pool_of_exact_fits_takes_the_shape_of_the_tasks_that_may_fail_over_to_it():
    # Compose: tm-2 of 2 slots kept a warm driver of 2 while the task on tm-1 ran at 1; its
    # failover started a cold driver (issue 42.8). Retargeted, it warms one of 1 instead.
    started = []
    pool = _pool(started, size=1, parallelism=2)
    pool.replenish(free_slots=2)
    [of_two] = started
    of_two.ready.set()
    pool.retarget(1)
    assert of_two.killed and [d.parallelism for d in started] == [2, 1]
    started[1].ready.set()
    taken = pool.take(1)
    assert taken is started[1] and not taken.for_task
    pool.retarget(1)  # no change: nothing ended, nothing started
    assert len(started) == 2
    # One slot free: none of 2 fits it, one of 1 does.
    narrow = []
    one_free = _pool(narrow, size=1, parallelism=2)
    one_free.replenish(free_slots=1)
    assert narrow == []
    one_free.retarget(1)
    assert [d.parallelism for d in narrow] == [1]
    # A pool whose drivers serve smaller tasks keeps them.
    smaller = []
    local = _pool(smaller, size=1, parallelism=2, serves_smaller=True)
    local.replenish(free_slots=2)
    local.retarget(1)
    assert [d.killed for d in smaller] == [False] and local.parallelism == 2


def test_the_standby_size_is_the_most_common_task_size_elsewhere_that_fits():
    from shared.standby_shape import standby_parallelism, task_slots

    class Alloc:
        def __init__(self, tm, n):
            self.taskmanager_id, self.indices = tm, tuple(range(n))

    published = task_slots([Alloc("tm-1", 1), Alloc("tm-1", 2), Alloc("tm-3", 1), Alloc("tm-2", 2)])
    assert published == {"tm-1": [2, 1], "tm-3": [1], "tm-2": [2]}
    assert standby_parallelism(published, "tm-2", slots=2) == 1  # 1 twice elsewhere, 2 once
    assert standby_parallelism(published, "tm-3", slots=2) == 2  # a tie: the larger
    assert standby_parallelism(published, "tm-2", slots=1) == 1  # 2 does not fit here
    assert standby_parallelism({"tm-2": [2]}, "tm-2", slots=2) is None  # only its own tasks
    assert standby_parallelism({"tm-1": ["x", 0, 9]}, "tm-2", slots=4) is None  # nothing readable fits
    assert standby_parallelism({"tm-1": 2, "tm-3": "12", "tm-4": [1]}, "tm-2", slots=4) == 1  # not lists: skipped
