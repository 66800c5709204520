"""Flink's restart options in a job's configuration (restart-strategy.type and
restart-strategy.<type>.<parameter>): checked at submission with the other options
(shared/job_options.py `problems`), and read into the strategy the dispatcher stores when a
request has no `restartStrategy` of its own. Values as shared/restart.py reads them."""

from __future__ import annotations

import math
from typing import Any, Mapping

from shared import restart
from shared.option_values import DURATION_EXPECTED, OptionProblem, duration_s, integer, integer_expected, refusal_reason

RESTART_PREFIX = "restart-strategy."
RESTART_PARAMETERS: dict[str, dict[str, tuple[str, Any]]] = {
    "none": {},
    "fixed-delay": {"attempts": ("count", 3), "delay": ("duration", "10 s")},
    "failure-rate": {
        "max-failures-per-interval": ("count1", 1),
        "failure-rate-interval": ("duration", "1 min"),
        "delay": ("duration", "10 s"),
    },
    "exponential-delay": {
        "initial-backoff": ("duration", "1 s"),
        "max-backoff": ("duration", "1 min"),
        "backoff-multiplier": ("multiplier", 1.5),
        "reset-backoff-threshold": ("duration", "1 h"),
        "jitter-factor": ("fraction", 0.1),
        "attempts-before-reset-backoff": ("count1", 10),
    },
}
_RESTART_TYPE_ALIASES = restart.TYPE_ALIASES


def _restart_value(kind: str, value: Any) -> Any:
    if kind == "duration":
        return duration_s(value)
    if kind in ("count", "count1"):
        return integer(value, 0 if kind == "count" else 1)
    number = float(value) if isinstance(value, (int, float, str)) and not isinstance(value, bool) else math.nan
    if (
        not math.isfinite(number)
        or (kind == "multiplier" and not 1.0 <= number <= 1e6)
        or (kind == "fraction" and not 0.0 <= number <= 1.0)
    ):
        raise ValueError("out of range")
    return number


_RESTART_EXPECTED = {
    "duration": DURATION_EXPECTED,
    "multiplier": "a number >= 1",
    "fraction": "a number between 0 and 1",
}


def _restart_keys(config: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in config.items() if isinstance(k, str) and k.startswith(RESTART_PREFIX)}


def _restart_type(raw: Any) -> str | None:
    return restart.strategy_type(raw)


def problems(config: Mapping[str, Any]) -> list[OptionProblem]:
    keys = _restart_keys(config)
    if not keys:
        return []
    type_key = RESTART_PREFIX + "type"
    types = ", ".join(RESTART_PARAMETERS)
    if type_key not in keys:
        first = next(iter(keys))
        return [
            OptionProblem(
                type_key,
                None,
                f"other restart-strategy options are set ({first}); the type is one of {types}",
                "fixed-delay",
                missing=True,
            )
        ]
    kind = _restart_type(keys[type_key])
    if kind is None:
        return [OptionProblem(type_key, keys[type_key], f"one of {types}", "fixed-delay")]
    found = []
    for key, value in keys.items():
        if key == type_key:
            continue
        rest = key[len(RESTART_PREFIX) :]
        owner, _, param = rest.partition(".")
        owner = _RESTART_TYPE_ALIASES.get(owner, owner)
        if owner not in RESTART_PARAMETERS or param not in RESTART_PARAMETERS[owner]:
            params = ", ".join(f"{RESTART_PREFIX}{kind}.{p}" for p in RESTART_PARAMETERS[kind])
            found.append(
                OptionProblem(
                    key,
                    value,
                    f"the options of {kind} are: {params}" if params else f"{kind} has no options",
                    *_first_param_example(kind),
                )
            )
            continue
        if owner != kind:
            continue  # Flink ignores the parameters of the strategies not chosen
        what, example = RESTART_PARAMETERS[owner][param]
        try:
            _restart_value(what, value)
        except (ValueError, TypeError, OverflowError) as exc:
            expected = (
                integer_expected(value, 0 if what == "count" else 1)
                if what in ("count", "count1")
                else _RESTART_EXPECTED[what]
            )
            found.append(OptionProblem(key, value, expected, example, reason=refusal_reason(exc)))
    return found


def _first_param_example(kind: str) -> tuple[Any, str]:
    """A good value and the option it is for: the chosen strategy's first parameter."""
    params = RESTART_PARAMETERS[kind]
    if not params:
        return kind, RESTART_PREFIX + "type"
    name, (_what, example) = next(iter(params.items()))
    return example, f"{RESTART_PREFIX}{kind}.{name}"


def restart_strategy_from_config(config: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The restart strategy Flink's options in a configuration describe (shared/restart.py's
    form: the type plus its parameters), or None if the configuration names none. Call it on a
    configuration `problems` found nothing wrong with."""
    keys = _restart_keys(config or {})
    kind = _restart_type(keys.get(RESTART_PREFIX + "type"))
    if kind is None:
        return None
    out: dict[str, Any] = {"type": kind}
    for key, value in keys.items():
        owner, _, param = key[len(RESTART_PREFIX) :].partition(".")
        if _RESTART_TYPE_ALIASES.get(owner, owner) == kind and param in RESTART_PARAMETERS[kind]:
            out[param] = _restart_value(RESTART_PARAMETERS[kind][param][0], value)
    return restart.normalise(out)
