"""Restart strategies in a job's request (Flink's names, parameters and defaults; durations in
seconds), and the form they are stored in."""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import BeforeValidator, Field, TypeAdapter, model_validator
from pydantic_core import PydanticCustomError

from services.dispatcher.schemas.fields import RESTART_TYPES, IntRange, NumberRange, Seconds, _fail, _repr, _Strict
from shared import restart


class NoRestart(_Strict):
    """Never restart: the first failure fails the job."""

    type: Literal["none"]


class FixedDelay(_Strict):
    """Restart up to `attempts` times, waiting `delay` between attempts."""

    type: Literal["fixed-delay"]
    attempts: Annotated[int, IntRange(0)] = 1
    delay: Seconds = 1.0


class FailureRate(_Strict):
    """Restart unless more than `max-failures-per-interval` failures happen within `failure-rate-interval`."""

    type: Literal["failure-rate"]
    max_failures_per_interval: Annotated[int, IntRange(1)] = Field(1, alias="max-failures-per-interval")
    failure_rate_interval: Seconds = Field(60.0, alias="failure-rate-interval")
    delay: Seconds = 1.0


class ExponentialDelay(_Strict):
    """Back off exponentially between restarts; reset after `reset-backoff-threshold` of smooth running."""

    type: Literal["exponential-delay"]
    initial_backoff: Seconds = Field(1.0, alias="initial-backoff")
    max_backoff: Seconds = Field(60.0, alias="max-backoff")
    backoff_multiplier: Annotated[float, NumberRange(1.0)] = Field(1.5, alias="backoff-multiplier")
    reset_backoff_threshold: Seconds = Field(3600.0, alias="reset-backoff-threshold")
    jitter_factor: Annotated[float, NumberRange(0.0, 1.0)] = Field(0.1, alias="jitter-factor")
    attempts_before_reset_backoff: Annotated[int, IntRange(1)] | None = Field(
        None, alias="attempts-before-reset-backoff", description="default: unlimited"
    )

    @model_validator(mode="after")
    def _backoff_order(self) -> "ExponentialDelay":
        if self.max_backoff < self.initial_backoff:
            raise PydanticCustomError(
                "backoff_order",
                "must not be smaller than initial-backoff ({initial}s), got {got}s",
                {
                    "subfield": "max-backoff",
                    "expected": "max-backoff >= initial-backoff",
                    "initial": self.initial_backoff,
                    "got": self.max_backoff,
                },
            )
        return self


def _restart_type(value: Any) -> Any:
    if isinstance(value, dict) and isinstance(value.get("type"), str):
        return {**value, "type": restart.strategy_type(value["type"]) or value["type"].strip().lower()}
    if isinstance(value, dict) and "type" not in value:
        raise _fail(
            "restart_type", "field required: must be {expected}", "one of " + ", ".join(RESTART_TYPES), subfield="type"
        )
    if not isinstance(value, dict):
        raise _fail(
            "restart_object",
            "must be {expected}, got {got}",
            'a JSON object such as {"type": "fixed-delay", "attempts": 3, "delay": "10 s"}',
            got=_repr(value),
        )
    return value


RestartModel = Union[NoRestart, FixedDelay, FailureRate, ExponentialDelay]
RestartStrategy = Annotated[RestartModel, Field(discriminator="type"), BeforeValidator(_restart_type)]
_RESTART: TypeAdapter[RestartModel] = TypeAdapter(RestartStrategy)


def stored_restart_strategy(strategy: RestartModel) -> dict[str, Any]:
    """A restart strategy as stored in the catalog and read by `shared.restart`: Flink's
    kebab-case names, defaults filled in, durations in seconds. `shared.restart.normalise` has the
    last word (raises InvalidRestartStrategy), so the dispatcher never stores what the
    JobManager would refuse."""
    out = strategy.model_dump(by_alias=True, exclude_none=True)
    return restart.normalise(out)


def normalise_restart_strategy(raw: dict[str, Any]) -> dict[str, Any]:
    """`stored_restart_strategy` of a raw object (the cluster default from settings).
    Raises pydantic.ValidationError or InvalidRestartStrategy."""
    return stored_restart_strategy(_RESTART.validate_python(raw))
