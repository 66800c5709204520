"""One parser per idea: every reader of a duration or a restart-strategy type (the dispatcher's
REST bodies and job options, the JobManager's restart strategies and checkpoint options, the
TaskManager's no-op tasks) accepts and refuses the same spellings, Flink's own among them."""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from services.dispatcher import schemas
from services.taskmanager import noop_task
from services.taskmanager.noop_task import InvalidTaskConfig
from shared import checkpointing, durations, job_options, restart

# Flink's TimeUtils.parseDuration labels, with and without a space, in any letter case.
ACCEPTED = [
    ("500 ms", 0.5), ("500ms", 0.5), ("500 milli", 0.5), ("500 millis", 0.5),
    ("500 millisecond", 0.5), ("500 milliseconds", 0.5), ("500 MS", 0.5),
    ("10 s", 10.0), ("10s", 10.0), ("10 sec", 10.0), ("10 secs", 10.0), ("10 second", 10.0),
    ("10 seconds", 10.0), ("10 S", 10.0),
    ("1 min", 60.0), ("1min", 60.0), ("1 m", 60.0), ("1 minute", 60.0), ("2 minutes", 120.0),
    ("2 h", 7200.0), ("2h", 7200.0), ("2 hour", 7200.0), ("2 hours", 7200.0),
    ("1 d", 86400.0), ("1 day", 86400.0), ("3 days", 3 * 86400.0),
    ("1500000 µs", 1.5), ("1500000 micros", 1.5), ("2000000000 ns", 2.0), ("2000000000 nanos", 2.0),
    # Headrace's own: numbers are seconds, also written as strings; fractions are allowed.
    (10, 10.0), (2.5, 2.5), (0, 0.0), ("10", 10.0), ("2.5", 2.5), ("1.5 s", 1.5), ("  10 s  ", 10.0),
]
REFUSED = ["ten s", "10 fortnights", "s", "", "-1 s", -1, True, None, [10], {"s": 1}, math.inf, math.nan,
           "10 s 5", "1e3 s", "9" * 400 + " s", 200 * 365 * 86400]


def _readers():
    """Each reader of a duration, as a function of one value that raises on a refusal."""
    return {
        "durations": durations.parse_duration,
        "restart": lambda v: restart.parse_duration(v, "delay"),
        "job options": job_options.duration_s,
        "REST body": schemas.parse_duration,
        # Its reader of one value: checkpoint_config adds each option's own bounds (timeout > 0).
        "checkpoint options": lambda v: checkpointing._duration(v, checkpointing.MIN_PAUSE),
        "no-op task": lambda v: noop_task._seconds({"noop.startup-delay": v}, "noop.startup-delay", 0.0),
    }


@pytest.mark.parametrize("reader", list(_readers()))
@pytest.mark.parametrize("value, seconds", ACCEPTED, ids=[repr(v) for v, _ in ACCEPTED])
def test_every_reader_accepts_the_same_durations(reader, value, seconds):
    assert _readers()[reader](value) == pytest.approx(seconds)


@pytest.mark.parametrize("reader", list(_readers()))
@pytest.mark.parametrize("value", REFUSED, ids=[repr(v)[:20] for v in REFUSED])
def test_every_reader_refuses_the_same_durations(reader, value):
    with pytest.raises((ValueError, ValidationError, InvalidTaskConfig)):
        _readers()[reader](value)


def test_a_refused_duration_is_a_value_error_naming_what_is_expected():
    with pytest.raises(ValueError) as exc:
        durations.parse_duration("10 fortnights")
    assert "10 s" in str(exc.value) and "'10 fortnights'" in str(exc.value)


# Flink's spellings of restart-strategy.type (RestartStrategyOptions), and Headrace's "no"/"norestart".
TYPES = [
    ("none", "none"), ("off", "none"), ("disable", "none"), ("no", "none"), ("norestart", "none"),
    ("fixed-delay", "fixed-delay"), ("fixeddelay", "fixed-delay"), ("FixedDelay", "fixed-delay"),
    ("failure-rate", "failure-rate"), ("failurerate", "failure-rate"),
    ("exponential-delay", "exponential-delay"), ("exponentialdelay", "exponential-delay"),
    (" Fixed-Delay ", "fixed-delay"),
]
REFUSED_TYPES = ["sometimes", "fixed_delay", "fixed delay", "", "exponential"]


@pytest.mark.parametrize("raw, kind", TYPES)
def test_every_reader_accepts_the_same_strategy_types(raw, kind):
    assert restart.strategy_type(raw) == kind
    assert restart.normalise({"type": raw})["type"] == kind
    assert schemas.normalise_restart_strategy({"type": raw})["type"] == kind
    assert job_options.problems({"restart-strategy.type": raw}) == []
    assert job_options.restart_strategy_from_config({"restart-strategy.type": raw})["type"] == kind


@pytest.mark.parametrize("raw", REFUSED_TYPES)
def test_every_reader_refuses_the_same_strategy_types(raw):
    assert restart.strategy_type(raw) is None
    with pytest.raises(restart.InvalidRestartStrategy):
        restart.normalise({"type": raw})
    with pytest.raises(ValidationError):
        schemas.normalise_restart_strategy({"type": raw})
    [problem] = job_options.problems({"restart-strategy.type": raw})
    assert problem.option == "restart-strategy.type"


@pytest.mark.parametrize("value", ["500 milliseconds", "10", "2 minutes", 3])
def test_a_restart_delay_means_the_same_in_a_body_and_in_the_options(value):
    body = schemas.normalise_restart_strategy({"type": "fixed-delay", "delay": value})
    options = job_options.restart_strategy_from_config(
        {"restart-strategy.type": "fixed-delay", "restart-strategy.fixed-delay.delay": value})
    assert body["delay"] == options["delay"] == durations.parse_duration(value)


def test_the_bounds_are_defined_once():
    assert schemas.MAX_INT is job_options.MAX_INT
    assert job_options.MAX_DURATION_S is durations.MAX_DURATION_S
    assert schemas.RESTART_TYPES is restart.STRATEGY_TYPES
