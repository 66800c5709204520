import random

import pytest

from shared import restart
from shared.clock import FakeClock


def test_none_never_restarts():
    s = restart.build({"type": "none"}, clock=FakeClock())
    s.notify_failure()
    assert not s.can_restart()


def test_fixed_delay_allows_exactly_attempts_restarts():
    s = restart.build({"type": "fixed-delay", "attempts": 3, "delay": "2 s"}, clock=FakeClock())
    allowed = []
    for _ in range(4):
        s.notify_failure()
        allowed.append(s.can_restart())
    assert allowed == [True, True, True, False]
    assert s.backoff_s() == 2.0


def test_fixed_delay_flink_defaults():
    s = restart.build({"type": "fixed-delay"}, clock=FakeClock())
    s.notify_failure()
    assert s.can_restart() and s.backoff_s() == 1.0
    s.notify_failure()
    assert not s.can_restart()


def test_failure_rate_counts_only_failures_inside_the_interval():
    clock = FakeClock()
    s = restart.build(
        {"type": "failure-rate", "max-failures-per-interval": 2, "failure-rate-interval": "1 min", "delay": 0.5},
        clock=clock,
    )
    s.notify_failure()
    clock.advance(10)
    s.notify_failure()
    assert s.can_restart()
    clock.advance(10)
    s.notify_failure()  # three within 60 s: over the rate
    assert not s.can_restart()


def test_failure_rate_forgets_old_failures():
    clock = FakeClock()
    s = restart.build(
        {"type": "failure-rate", "max-failures-per-interval": 1, "failure-rate-interval": 60}, clock=clock
    )
    s.notify_failure()
    clock.advance(61)
    s.notify_failure()
    assert s.can_restart()


def test_exponential_delay_grows_caps_and_resets():
    clock = FakeClock()
    s = restart.ExponentialDelay(clock, initial_s=1, max_s=5, multiplier=2, reset_threshold_s=100, jitter=0)
    delays = []
    for _ in range(5):
        s.notify_failure()
        delays.append(s.backoff_s())
        clock.advance(1)
    assert delays == [1, 2, 4, 5, 5]
    clock.advance(200)  # ran well for longer than the threshold
    s.notify_failure()
    assert s.backoff_s() == 1


def test_exponential_delay_jitter_stays_within_factor():
    s = restart.ExponentialDelay(FakeClock(), initial_s=10, max_s=60, multiplier=2, jitter=0.1, rng=random.Random(7))
    s.notify_failure()
    samples = {s.backoff_s() for _ in range(50)}
    assert all(9.0 <= d <= 11.0 for d in samples) and len(samples) > 1


def test_exponential_delay_attempts_limit():
    s = restart.build({"type": "exponential-delay", "attempts-before-reset-backoff": 2}, clock=FakeClock())
    results = []
    for _ in range(3):
        s.notify_failure()
        results.append(s.can_restart())
    assert results == [True, True, False]


@pytest.mark.parametrize(
    "config, field",
    [
        ({"type": "sometimes"}, "restartStrategy.type"),
        ({"type": "fixed-delay", "attempts": -1}, "restartStrategy.attempts"),
        ({"type": "fixed-delay", "delay": "soon"}, "restartStrategy.delay"),
        ({"type": "fixed-delay", "tries": 3}, "restartStrategy.tries"),
        ({"type": "exponential-delay", "backoff-multiplier": 0.5}, "restartStrategy.backoff-multiplier"),
    ],
)
def test_invalid_config_names_the_field(config, field):
    with pytest.raises(restart.InvalidRestartStrategy) as exc:
        restart.normalise(config)
    assert exc.value.field == field


def test_durations():
    assert restart.parse_duration("500 ms", "f") == 0.5
    assert restart.parse_duration("2 min", "f") == 120
    assert restart.parse_duration(3, "f") == 3.0
    assert restart.normalise({"type": "fixeddelay", "attempts": 2})["type"] == "fixed-delay"
