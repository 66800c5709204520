"""shared/backoff.py: the one exponential backoff."""

from __future__ import annotations

import pytest

from shared.backoff import exponential


def test_doubles_from_the_first_pause_up_to_the_most():
    assert [exponential(n, first_s=0.5, max_s=5) for n in range(0, 7)] == [0.5, 0.5, 1, 2, 4, 5, 5]
    assert exponential(3, first_s=1, max_s=100, factor=1.5) == 2.25
    assert exponential(10**9, first_s=1, max_s=60) == 60  # no overflow however many tries


def test_nonsense_bounds_are_refused():
    for first, most, factor in ((0, 1, 2), (2, 1, 2), (1, 2, 0.5)):
        with pytest.raises(ValueError):
            exponential(1, first_s=first, max_s=most, factor=factor)


# The formulas the call sites had before shared/backoff.py (commit e262924), each with its own
# numbers, against what they call now: equal for every step they can reach.
def test_the_supervisors_restart_delay_is_its_old_formula():
    from services.cluster.process_supervisor import RestartPolicy

    for policy in (RestartPolicy(), RestartPolicy(initial_s=0.5, max_s=7.0), RestartPolicy(initial_s=3, max_s=3)):
        for quick_exits in range(0, 40):
            old = min(policy.max_s, policy.initial_s * 2 ** max(0, quick_exits - 1))
            assert policy.delay(quick_exits) == old


def test_the_sql_sinks_retry_pause_is_its_old_formula():
    from services.taskmanager.runtime.connectors.sql_retry import RetryPolicy

    for policy in (RetryPolicy(), RetryPolicy(first_backoff_s=0.1, max_backoff_s=1.0)):
        for retry in range(1, 40):  # retries are counted from 1 when the pause is asked for
            assert policy.backoff(retry) == min(policy.max_backoff_s, policy.first_backoff_s * 2 ** (retry - 1))


def test_the_driver_event_and_warm_driver_pauses_are_their_old_formulas():
    for i in range(0, 40):  # driver_process.py: try i (from 0) of handling an event
        assert exponential(i + 1, first_s=0.2, max_s=5.0) == min(5.0, 0.2 * 2**i)
    for failures in range(1, 40):  # warm_pool.py: warm drivers that died in a row (counted first)
        assert exponential(failures + 1, first_s=1.0, max_s=60.0) == min(60.0, 2.0**failures)
