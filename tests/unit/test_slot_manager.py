from services.resourcemanager.slot_manager import SlotManager
from services.resourcemanager.slot_reasons import timeout_reason, waiting_reason
from services.resourcemanager.unsatisfiable import UnsatisfiableRequests, permanent_reason
from shared.clock import FakeClock


def make(clock=None, tms=(("tm-a", 4), ("tm-b", 4))):
    sm = SlotManager(clock or FakeClock())
    for tm, n in tms:
        sm.register(taskmanager_id=tm, queue=f"tm.{tm}", host="h", slots=n, cores=2, memory_bytes=1)
    return sm


def req(sm, rid, slots, timeout=300, job="j"):
    return sm.request(request_id=rid, job_id=job, execution_id=rid, slots=slots, timeout_s=timeout)


def test_allocates_p_slots_on_one_taskmanager_and_spreads():
    sm = make()
    a = req(sm, "r1", 2)
    b = req(sm, "r2", 2)
    assert len(a.indices) == 2 and len(b.indices) == 2
    assert a.taskmanager_id != b.taskmanager_id  # spread over TaskManagers
    assert sm.free_slots() == 4


def test_request_is_idempotent():
    sm = make()
    assert req(sm, "r1", 1) == req(sm, "r1", 1)
    assert sm.free_slots() == 7


def test_queue_in_submission_order_and_release_serves_head_first():
    sm = make(tms=(("tm-a", 2),))
    first = req(sm, "r1", 2)
    assert req(sm, "r2", 2) is None
    assert req(sm, "r3", 1) is None  # must not overtake r2
    assert waiting_reason(sm, "r2") == "waiting for 2 slots; 0 free"
    assert waiting_reason(sm, "r3") == "waiting for 1 slot; 0 free; 1 request ahead"
    sm.release(first.allocation_id)
    served = sm.serve_pending()
    assert [r.request_id for r, _ in served] == ["r2"]
    assert sm.free_slots() == 0


def test_request_bigger_than_any_taskmanager_does_not_block_others():
    sm = make(tms=(("tm-a", 2),))
    assert req(sm, "big", 3) is None
    assert "no TaskManager has 3 slots" in waiting_reason(sm, "big")
    assert req(sm, "small", 1) is not None


def test_timeout_fails_with_what_was_asked_and_what_is_free():
    clock = FakeClock()
    sm = make(clock, tms=(("tm-a", 1),))
    req(sm, "r1", 1)
    assert req(sm, "r2", 1, timeout=5) is None
    clock.advance(4)
    assert sm.expire_pending() == []
    clock.advance(2)
    [r] = sm.expire_pending()
    message = timeout_reason(sm, r)
    assert r.request_id == "r2"
    assert "could not allocate 1 slot" in message and "0 of 1 slots free" in message and "tm-a: 0/1 free" in message
    assert not sm.pending


def test_taskmanager_lost_frees_its_allocations():
    sm = make()
    a = req(sm, "r1", 4)
    lost = sm.remove(a.taskmanager_id)
    assert [x.allocation_id for x in lost] == [a.allocation_id]
    assert sm.release(a.allocation_id) is None
    assert sm.total_slots() == 4 and sm.free_slots() == 4


def test_reregistration_keeps_reported_allocations():
    from services.resourcemanager.slot_manager import Allocation

    sm = SlotManager(FakeClock())
    alloc = Allocation("al1", "tm-a", "tm.tm-a", "job", "ex", "ex", (0, 1))
    sm.register(
        taskmanager_id="tm-a",
        queue="tm.tm-a",
        host="h",
        slots=4,
        cores=2,
        memory_bytes=1,
        occupied={0: alloc, 1: alloc},
    )
    assert sm.free_slots() == 2
    assert sm.allocations_of("tm-a")[0]["job_id"] == "job"
    sm.release("al1")
    assert sm.free_slots() == 4


def test_cancelled_request_leaves_the_queue():
    sm = make(tms=(("tm-a", 1),))
    req(sm, "r1", 1)
    req(sm, "r2", 1)
    assert sm.cancel_request("r2")
    assert not sm.pending


def test_largest_taskmanager_is_tracked_through_registrations_and_removals():
    sm = make(tms=(("tm-a", 2), ("tm-b", 4), ("tm-c", 4)))
    assert sm.largest_taskmanager() == 4
    sm.remove("tm-b")
    assert sm.largest_taskmanager() == 4  # tm-c still has 4
    sm.register(taskmanager_id="tm-c", queue="tm.tm-c", host="h", slots=1, cores=2, memory_bytes=1)
    assert sm.largest_taskmanager() == 2  # re-registered smaller
    assert req(sm, "r1", 3) is None and "the largest has 2" in waiting_reason(sm, "r1")
    sm.register(taskmanager_id="tm-d", queue="tm.tm-d", host="h", slots=8, cores=2, memory_bytes=1)
    assert sm.largest_taskmanager() == 8
    sm.remove("tm-d")
    sm.remove("tm-a")
    sm.remove("tm-c")
    assert sm.largest_taskmanager() == 0


# --- requests no TaskManager could ever hold (unsatisfiable.py) --------------------------------


def _unsatisfiable(clock, grace_s=10):
    return UnsatisfiableRequests(clock, grace_s=grace_s)


def test_a_request_above_every_taskmanager_fails_only_once_the_cluster_settled():
    clock = FakeClock()
    sm, watch = make(clock, tms=(("tm-a", 2), ("tm-b", 2))), _unsatisfiable(clock)
    assert req(sm, "big", 3) is None and req(sm, "fits", 2) is not None
    clock.advance(9.9)
    assert watch.take(sm) == []  # a larger TaskManager may still register again
    clock.advance(0.1)
    [(request, reason)] = watch.take(sm)
    assert request.request_id == "big" and "big" not in sm.pending
    assert reason.startswith(
        "parallelism 3 needs 3 slots on one TaskManager; the largest registered TaskManager "
        "has 2 (tm-a, tm-b; 2 registered)"
    )
    assert watch.take(sm) == []


def test_a_lost_taskmanager_restarts_the_grace_and_no_taskmanager_is_no_verdict():
    clock = FakeClock()
    sm, watch = make(clock, tms=(("tm-a", 2), ("tm-b", 4))), _unsatisfiable(clock)
    clock.advance(20)
    sm.remove("tm-b")
    watch.taskmanager_left()
    req(sm, "big", 3)
    clock.advance(5)
    assert watch.take(sm) == []
    clock.advance(5)
    assert [r.request_id for r, _ in watch.take(sm)] == ["big"]
    empty = make(clock, tms=())
    req(empty, "any", 1)
    assert watch.take(empty) == [] and "any" in empty.pending


def test_the_reason_names_a_few_taskmanagers_and_counts_the_rest():
    sm = make(tms=tuple((f"tm-{i:02d}", 2) for i in range(8)) + (("tm-small", 1),))
    req(sm, "big", 5)
    reason = permanent_reason(sm.pending["big"], sm, sm.largest_taskmanager())
    assert "has 2 (tm-00, tm-01, tm-02, tm-03, tm-04 and 3 more; 9 registered)" in reason
    assert "resubmit with parallelism 2 or less" in reason and "--slots 5" in reason


# --- warm drivers (issue 23) ---------------------------------------------------------------


def report(allocations=()):
    """The slot report a TaskManager's heartbeat carries: the given allocations, every other slot free."""
    return {i: a for a in allocations for i in a.indices}


def test_prefers_a_taskmanager_with_a_ready_warm_driver_over_more_free_slots():
    # The survivor (tm-a, one task running, a warm driver ready) against a TaskManager restarted
    # after a kill (tm-b: every slot free, its warm-up just begun).
    sm = make()
    running = req(sm, "running", 1)
    survivor = running.taskmanager_id
    restarted = "tm-b" if survivor == "tm-a" else "tm-a"
    sm.report_warm(survivor, ready=1, parallelism=4)
    sm.report_warm(restarted, ready=0, parallelism=4)
    assert req(sm, "restarted-task", 2).taskmanager_id == survivor


def test_a_warm_driver_too_small_for_the_task_does_not_attract_it():
    sm = make()
    sm.report_warm("tm-a", ready=1, parallelism=1)
    req(sm, "r0", 1)  # lands on tm-a (its driver fits), leaving tm-a 3 free, tm-b 4
    sm.report_warm("tm-a", ready=1, parallelism=1)
    assert req(sm, "r1", 2).taskmanager_id == "tm-b"  # p=2 > 1: most free slots, as without warm drivers


def test_equal_warm_drivers_spread_as_before():
    sm = make()
    for tm in ("tm-a", "tm-b"):
        sm.report_warm(tm, ready=2, parallelism=4)
    a = req(sm, "r1", 1)
    b = req(sm, "r2", 1)
    assert a.taskmanager_id != b.taskmanager_id
    sm2 = make()  # no warm drivers anywhere: spread too
    assert req(sm2, "r1", 1).taskmanager_id != req(sm2, "r2", 1).taskmanager_id


def test_a_burst_does_not_pile_onto_one_warm_driver():
    sm = make(tms=(("tm-a", 2), ("tm-b", 4)))
    sm.report_warm("tm-a", ready=1, parallelism=2)
    assert req(sm, "r1", 1).taskmanager_id == "tm-a"  # its warm driver beats tm-b's 4 free slots
    # tm-a's only driver counts as taken until a report says otherwise: the next task of the
    # burst goes by free slots, not onto tm-a to wait for a cold driver.
    assert req(sm, "r2", 1).taskmanager_id == "tm-b"
    # A heartbeat sent before the DeployTask reached tm-a still says ready=1: not believed while
    # the allocation is in flight (no report lists it yet).
    sm.reconcile("tm-a", report(), grace_s=10)
    sm.report_warm("tm-a", ready=1, parallelism=2)
    assert req(sm, "r3", 1).taskmanager_id == "tm-b"


def test_two_ready_drivers_take_two_tasks_of_a_burst():
    sm = make(tms=(("tm-a", 2), ("tm-b", 4)))
    sm.report_warm("tm-a", ready=2, parallelism=2)
    assert [req(sm, r, 1).taskmanager_id for r in ("r1", "r2", "r3")] == ["tm-a", "tm-a", "tm-b"]


def test_the_next_report_after_the_deploy_is_the_truth_again():
    sm = make(tms=(("tm-a", 4), ("tm-b", 4)))
    sm.report_warm("tm-a", ready=1, parallelism=4)
    first = req(sm, "r1", 1)
    assert first.taskmanager_id == "tm-a"
    # tm-a lists the allocation and has warmed a replacement: ready again, chosen again.
    sm.reconcile("tm-a", report([first]), grace_s=10)
    sm.report_warm("tm-a", ready=1, parallelism=4)
    second = req(sm, "r2", 1)
    assert second.taskmanager_id == "tm-a"
    # ...and once it reports none ready, tm-b (more free slots) wins.
    sm.reconcile("tm-a", report([first, second]), grace_s=10)
    sm.report_warm("tm-a", ready=0, parallelism=4)
    assert req(sm, "r3", 1).taskmanager_id == "tm-b"


def test_a_taskmanager_lost_or_registered_again_leaves_no_stale_warm_entry():
    sm = make()
    sm.report_warm("tm-a", ready=1, parallelism=4)
    sm.remove("tm-a")
    assert req(sm, "r1", 1).taskmanager_id == "tm-b"
    sm.register(taskmanager_id="tm-a", queue="tm.tm-a", host="h", slots=4, cores=2, memory_bytes=1)
    sm.report_warm("tm-b", ready=1, parallelism=4)
    # tm-a came back with every slot free and no warm driver: tm-b (3 free, one ready) wins.
    assert req(sm, "r2", 1).taskmanager_id == "tm-b"


def test_a_driver_warming_up_attracts_a_task_when_none_is_ready():
    # A cluster's second upgrade came while both TaskManagers' warm drivers were still warming
    # up; the task went to the one whose driver was still starting its JVM and waited 30-40 s.
    sm = make(tms=(("tm-a", 4), ("tm-b", 2)))
    sm.report_warm("tm-b", ready=0, parallelism=4, warming=1)
    assert req(sm, "r1", 1).taskmanager_id == "tm-b"  # before tm-a's 4 free slots
    # tm-b's warming driver counts as taken until a report lists the allocation: spread again.
    assert req(sm, "r2", 1).taskmanager_id == "tm-a"


def test_a_ready_driver_beats_a_warming_one():
    sm = make(tms=(("tm-a", 4), ("tm-b", 4)))
    sm.report_warm("tm-a", ready=0, parallelism=4, warming=1)
    sm.report_warm("tm-b", ready=1, parallelism=4)
    assert req(sm, "r1", 1).taskmanager_id == "tm-b"
    assert req(sm, "r2", 1).taskmanager_id == "tm-a"
