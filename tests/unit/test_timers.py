"""The JobManager's delayed actions (services/jobmanager/timers.py) on a fake clock: due in time
order, ties in the order they were set, nothing before its time."""

from __future__ import annotations

from services.jobmanager.timers import Timers
from shared.clock import FakeClock


def test_actions_run_when_due_in_time_order_and_ties_in_the_order_set():
    clock = FakeClock()
    timers, ran = Timers(clock), []
    timers.call_later(2.0, lambda: ran.append("late"))
    timers.call_later(1.0, lambda: ran.append("first tie"))
    timers.call_later(1.0, lambda: ran.append("second tie"))
    assert timers.run_due() == 0 and timers.next_due_in() == 1.0
    clock.advance(1.0)
    assert timers.run_due() == 2
    assert ran == ["first tie", "second tie"]
    assert len(timers) == 1 and timers.next_due_in() == 1.0
    clock.advance(5.0)
    assert timers.next_due_in() == 0.0  # overdue reads as due now, never negative
    assert timers.run_due() == 1 and ran[-1] == "late"
    assert timers.next_due_in() is None and len(timers) == 0


def test_pop_due_hands_out_one_action_at_a_time_and_none_before_its_time():
    clock = FakeClock()
    timers = Timers(clock)
    timers.call_later(0.5, lambda: "a")
    timers.call_later(0.5, lambda: "b")
    assert timers.pop_due() is None
    clock.advance(0.5)
    assert [timers.pop_due()(), timers.pop_due()()] == ["a", "b"]
    assert timers.pop_due() is None


def test_an_action_may_set_a_timer_that_waits_for_its_own_time():
    clock = FakeClock()
    timers, ran = Timers(clock), []
    timers.call_later(0, lambda: timers.call_later(3, lambda: ran.append("retry")))
    assert timers.run_due() == 1 and ran == []
    clock.advance(3)
    assert timers.run_due() == 1 and ran == ["retry"]
