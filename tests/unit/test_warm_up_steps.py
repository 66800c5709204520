"""A warm-up step a waiting task cuts short (services/taskmanager/runtime/warm_up.py): pure logic,
no Spark."""

from __future__ import annotations

import threading

from services.taskmanager.runtime.warm_up import in_background_unless_cut


def test_a_task_waiting_during_a_step_does_not_wait_for_it():
    release, ran = threading.Event(), threading.Event()

    def step():
        release.wait(30)
        ran.set()

    looks = []
    assert in_background_unless_cut(step, lambda: looks.append(1) or len(looks) >= 2) is False
    assert not ran.is_set()  # still running beside the task
    release.set()
    assert ran.wait(30)


def test_a_step_nobody_cuts_short_runs_to_its_end_and_a_failing_one_is_no_reason_to_stop():
    ran = []
    assert in_background_unless_cut(lambda: ran.append(1), lambda: False) is True
    assert ran == [1]
    assert in_background_unless_cut(lambda: 1 / 0, lambda: False) is True
