"""Restart strategies with Flink's names, parameters and defaults.

Each strategy has Flink's three methods: `notify_failure()` records a failure, `can_restart()`
says whether another attempt is allowed, `backoff_s()` says how long to wait before it.
Parameters come from the submission (`restartStrategy`) or the cluster default, keyed like
Flink's options without the `restart-strategy.<type>.` prefix:

  none / off / disable
  fixed-delay        attempts=1, delay=1 s
  failure-rate       max-failures-per-interval=1, failure-rate-interval=1 min, delay=1 s
  exponential-delay  initial-backoff=1 s, max-backoff=1 min, backoff-multiplier=1.5,
                     reset-backoff-threshold=1 h, jitter-factor=0.1,
                     attempts-before-reset-backoff=unlimited

Durations are read by shared/durations.py (parse_duration): seconds as a number, or strings with a
unit such as "500 ms", "10 s", "2 min", "1 h"; Flink's options in a job's configuration
(restart-strategy.fixed-delay.delay, ...) reach here already read, as Flink reads them
(shared/job_options.py). Type names are Flink's, in any of its spellings (`strategy_type`).
"""

from __future__ import annotations

import random
from collections import deque
from typing import Any, Protocol

from shared import durations
from shared.clock import Clock
from shared.errors import ConfigError


class InvalidRestartStrategy(ConfigError, ValueError):
    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field


class RestartStrategy(Protocol):
    def notify_failure(self) -> None: ...

    def can_restart(self) -> bool: ...

    def backoff_s(self) -> float: ...

    # The counters, as JSON for the catalog: the JobManager stores them in the transaction that
    # records the failure, so a redelivered failure (rolled back the first time) is not counted
    # twice, and a new leader continues the budget where the old one left it.
    def state(self) -> dict: ...

    def load(self, state: dict) -> None: ...


def parse_duration(value: Any, field: str) -> float:
    """Seconds of a duration (shared/durations.py); InvalidRestartStrategy naming `field` if not one."""
    try:
        return durations.parse_duration(value)
    except durations.InvalidDuration as exc:
        raise InvalidRestartStrategy(field, str(exc)) from None


def _int(params: dict, key: str, default: int, field_prefix: str, minimum: int = 0) -> int:
    v = params.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise InvalidRestartStrategy(f"{field_prefix}.{key}", f"expected an integer >= {minimum}, got {v!r}")
    return v


def _float(params: dict, key: str, default: float, field_prefix: str, minimum: float) -> float:
    v = params.get(key, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v < minimum:
        raise InvalidRestartStrategy(f"{field_prefix}.{key}", f"expected a number >= {minimum}, got {v!r}")
    return float(v)


class NoRestart:
    def notify_failure(self) -> None:
        pass

    def can_restart(self) -> bool:
        return False

    def backoff_s(self) -> float:
        return 0.0

    def state(self) -> dict:
        return {}

    def load(self, state: dict) -> None:
        pass


class FixedDelay:
    def __init__(self, attempts: int = 1, delay_s: float = 1.0):
        self.attempts, self.delay_s, self.failures = attempts, delay_s, 0

    def notify_failure(self) -> None:
        self.failures += 1

    def can_restart(self) -> bool:
        return self.failures <= self.attempts

    def state(self) -> dict:
        return {"failures": self.failures}

    def load(self, state: dict) -> None:
        self.failures = int(state.get("failures", 0))

    def backoff_s(self) -> float:
        return self.delay_s


class FailureRate:
    def __init__(self, clock: Clock, max_failures: int = 1, interval_s: float = 60.0, delay_s: float = 1.0):
        self.clock, self.max_failures, self.interval_s, self.delay_s = clock, max_failures, interval_s, delay_s
        self._failures: deque[float] = deque()

    def notify_failure(self) -> None:
        self._failures.append(self.clock.now())

    def can_restart(self) -> bool:
        now = self.clock.now()
        while self._failures and now - self._failures[0] > self.interval_s:
            self._failures.popleft()
        return len(self._failures) <= self.max_failures

    def state(self) -> dict:
        return {"failures": list(self._failures)}

    def load(self, state: dict) -> None:
        self._failures = deque(float(t) for t in state.get("failures", ()))

    def backoff_s(self) -> float:
        return self.delay_s


class ExponentialDelay:
    def __init__(
        self,
        clock: Clock,
        initial_s: float = 1.0,
        max_s: float = 60.0,
        multiplier: float = 1.5,
        reset_threshold_s: float = 3600.0,
        jitter: float = 0.1,
        max_attempts: int | None = None,
        rng: random.Random | None = None,
    ):
        self.clock, self.initial_s, self.max_s, self.multiplier = clock, initial_s, max_s, multiplier
        self.reset_threshold_s, self.jitter, self.max_attempts = reset_threshold_s, jitter, max_attempts
        self.rng = rng or random.Random()
        self._current = 0.0
        self._last_failure: float | None = None
        self._attempts = 0

    def notify_failure(self) -> None:
        now = self.clock.now()
        # A job that ran longer than the threshold since its last failure starts over.
        if self._last_failure is not None and now - self._last_failure >= self.reset_threshold_s + self._current:
            self._current, self._attempts = 0.0, 0
        self._current = self.initial_s if self._current == 0 else min(self._current * self.multiplier, self.max_s)
        self._attempts += 1
        self._last_failure = now

    def can_restart(self) -> bool:
        return self.max_attempts is None or self._attempts <= self.max_attempts

    def state(self) -> dict:
        return {"current": self._current, "last_failure": self._last_failure, "attempts": self._attempts}

    def load(self, state: dict) -> None:
        self._current = float(state.get("current", 0.0))
        last = state.get("last_failure")
        self._last_failure = float(last) if last is not None else None
        self._attempts = int(state.get("attempts", 0))

    def backoff_s(self) -> float:
        if self.jitter == 0:
            return self._current
        spread = self._current * self.jitter
        return max(0.0, min(self.max_s, self._current + self.rng.uniform(-spread, spread)))


STRATEGY_TYPES = ("none", "fixed-delay", "failure-rate", "exponential-delay")
# Flink's spellings of `restart-strategy.type` (RestartStrategyOptions), any letter case; "no" and
# "norestart" are Headrace's own, accepted by its REST API and job options since they existed.
TYPE_ALIASES = {
    "off": "none",
    "disable": "none",
    "no": "none",
    "norestart": "none",
    "fixeddelay": "fixed-delay",
    "failurerate": "failure-rate",
    "exponentialdelay": "exponential-delay",
}


def strategy_type(raw: Any) -> str | None:
    """The canonical name of a strategy type as written (`"FixedDelay"` -> "fixed-delay"), or None."""
    if not isinstance(raw, str):
        return None
    name = raw.strip().lower()
    name = TYPE_ALIASES.get(name, name)
    return name if name in STRATEGY_TYPES else None


_KNOWN_KEYS = {
    "none": set(),
    "fixed-delay": {"attempts", "delay"},
    "failure-rate": {"max-failures-per-interval", "failure-rate-interval", "delay"},
    "exponential-delay": {
        "initial-backoff",
        "max-backoff",
        "backoff-multiplier",
        "reset-backoff-threshold",
        "jitter-factor",
        "attempts-before-reset-backoff",
    },
}


def normalise(config: dict[str, Any] | None, *, field: str = "restartStrategy") -> dict[str, Any]:
    """Validate a restart-strategy object; returns it with the canonical type name.
    Raises InvalidRestartStrategy naming the offending field."""
    if config is None:
        return {}
    if not isinstance(config, dict):
        raise InvalidRestartStrategy(field, 'expected an object such as {"type": "fixed-delay", "attempts": 3}')
    kind = strategy_type(config.get("type"))
    if kind is None:
        raise InvalidRestartStrategy(
            f"{field}.type", f"expected one of {', '.join(STRATEGY_TYPES)}, got {config.get('type')!r}"
        )
    unknown = set(config) - _KNOWN_KEYS[kind] - {"type"}
    if unknown:
        known = ", ".join(sorted(_KNOWN_KEYS[kind])) or "none"
        raise InvalidRestartStrategy(f"{field}.{sorted(unknown)[0]}", f"not a parameter of {kind}; known: {known}")
    out = {**config, "type": kind}
    _check_pause(build(out, clock=_NullClock(), field=field), field)  # validates every parameter
    return out


# A restart costs the control plane a slot request, a deploy and a driver, and writes the
# failure and the new attempt to the catalog. A few quick retries are a fair way to ride out a
# flaky start; a job allowed a billion restarts with no delay would crash-loop as fast as the
# cluster can start it, for ever (issue 43.14). So past this many restarts, a pause of at least
# MIN_RESTART_PAUSE_S is required (Flink's own default for checkpointed jobs: unlimited
# attempts, 1 s apart).
MAX_RESTARTS_WITHOUT_PAUSE = 100
MIN_RESTART_PAUSE_S = 1.0


def _check_pause(strategy: "RestartStrategy", field: str) -> None:
    limit, pause = MAX_RESTARTS_WITHOUT_PAUSE, MIN_RESTART_PAUSE_S
    why = (
        f"with more than {limit} restarts allowed, a failing job must wait at least {pause:g} s before "
        f"each (a restart costs a slot request, a deploy and a driver)"
    )
    if isinstance(strategy, FixedDelay) and strategy.attempts > limit and strategy.delay_s < pause:
        raise InvalidRestartStrategy(
            f"{field}.delay", f"{strategy.attempts} attempts {strategy.delay_s:g} s apart: {why}"
        )
    if isinstance(strategy, FailureRate) and strategy.max_failures > limit and strategy.delay_s < pause:
        raise InvalidRestartStrategy(
            f"{field}.delay", f"{strategy.max_failures} failures per interval {strategy.delay_s:g} s apart: {why}"
        )
    if isinstance(strategy, ExponentialDelay) and (strategy.max_attempts is None or strategy.max_attempts > limit):
        backoff = strategy.initial_s
        for _ in range(limit - 1):
            backoff = min(backoff * strategy.multiplier, strategy.max_s)
        if backoff < pause:
            raise InvalidRestartStrategy(
                f"{field}.initial-backoff",
                f"the backoff is still {backoff:g} s after {limit} restarts (initial-backoff "
                f"{strategy.initial_s:g} s, backoff-multiplier {strategy.multiplier:g}, max-backoff "
                f"{strategy.max_s:g} s): {why}",
            )


class _NullClock:
    def now(self) -> float:
        return 0.0


def build(
    config: dict[str, Any], *, clock: Clock, field: str = "restartStrategy", rng: random.Random | None = None
) -> RestartStrategy:
    kind = strategy_type(config.get("type", "none")) or str(config.get("type"))
    p = config
    if kind == "none":
        return NoRestart()
    if kind == "fixed-delay":
        return FixedDelay(_int(p, "attempts", 1, field), parse_duration(p.get("delay", 1.0), f"{field}.delay"))
    if kind == "failure-rate":
        return FailureRate(
            clock,
            _int(p, "max-failures-per-interval", 1, field, 1),
            parse_duration(p.get("failure-rate-interval", 60.0), f"{field}.failure-rate-interval"),
            parse_duration(p.get("delay", 1.0), f"{field}.delay"),
        )
    if kind == "exponential-delay":
        attempts = p.get("attempts-before-reset-backoff")
        return ExponentialDelay(
            clock,
            parse_duration(p.get("initial-backoff", 1.0), f"{field}.initial-backoff"),
            parse_duration(p.get("max-backoff", 60.0), f"{field}.max-backoff"),
            _float(p, "backoff-multiplier", 1.5, field, 1.0),
            parse_duration(p.get("reset-backoff-threshold", 3600.0), f"{field}.reset-backoff-threshold"),
            _float(p, "jitter-factor", 0.1, field, 0.0),
            None if attempts is None else _int(p, "attempts-before-reset-backoff", 0, field, 1),
            rng,
        )
    raise InvalidRestartStrategy(f"{field}.type", f"expected one of {', '.join(STRATEGY_TYPES)}, got {kind!r}")
