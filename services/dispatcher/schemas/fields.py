"""The parts every request body and response of the REST API is made of: field validators
(each raises a PydanticCustomError whose context says what is expected), the field types built on
them, the strict request base (unknown keys refused with the accepted ones listed) and the
response base."""

from __future__ import annotations

import difflib
import math
import re
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
    WithJsonSchema,
    model_validator,
)
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema, PydanticCustomError, core_schema

from shared import durations, restart
from shared.job_options import MAX_INT

RESTART_TYPES = restart.STRATEGY_TYPES  # ("none", "fixed-delay", "failure-rate", "exponential-delay")
KINDS = ("pyspark", "noop")
MAX_PARALLELISM = MAX_INT


def _repr(value: Any) -> str:
    """The offending value as echoed in a message: a hostile request may send megabytes."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _fail(kind: str, message: str, expected: str, **ctx: Any) -> PydanticCustomError:
    return PydanticCustomError(kind, message, {"expected": expected, **ctx})


def _bounds(schema: dict[str, Any], minimum: float | None, maximum: float | None) -> dict[str, Any]:
    if minimum is not None:
        schema["minimum"] = minimum
    if maximum is not None:
        schema["maximum"] = maximum
    return schema


def _as_int(value: Any, minimum: int, maximum: int | None = MAX_INT) -> int:
    ok = not isinstance(value, bool) and (
        isinstance(value, int)
        or (isinstance(value, float) and value.is_integer())
        # Digits bounded: int() of a longer string raises (CPython refuses > 4300 digits).
        or (isinstance(value, str) and re.fullmatch(r"\s*-?\d{1,30}\s*", value) is not None)
    )
    if ok and maximum is not None and int(value) > maximum:
        # The upper bound is named only when it is what was crossed: it is rarely the mistake.
        raise _fail(
            "integer", "must be an {expected}, got {got}", f"integer between {minimum} and {maximum}", got=_repr(value)
        )
    if not ok or int(value) < minimum:
        raise _fail("integer", "must be an {expected}, got {got}", f"integer >= {minimum}", got=_repr(value))
    return int(value)


@dataclass(frozen=True)
class IntRange:
    """Field metadata, `Annotated[int, IntRange(1)]`: an integer in [minimum, maximum] (also
    "3" and 3.0), refused with a message that names the range."""

    minimum: int
    maximum: int | None = MAX_INT

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        return core_schema.no_info_before_validator_function(
            lambda v: _as_int(v, self.minimum, self.maximum), handler(source)
        )

    def __get_pydantic_json_schema__(self, schema: CoreSchema, handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        return _bounds({"type": "integer"}, self.minimum, self.maximum)


def _as_number(value: Any, minimum: float, maximum: float | None, expected: str) -> float:
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            pass
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value < minimum
        or (maximum is not None and value > maximum)
    ):
        raise _fail("number", "must be a {expected}, got {got}", expected, got=_repr(value))
    return float(value)


@dataclass(frozen=True)
class NumberRange:
    """Field metadata, `Annotated[float, NumberRange(0.0, 1.0)]`: a finite number in [minimum,
    maximum] (also "0.5"), refused with a message that names the range."""

    minimum: float
    maximum: float | None = None

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        expected = (
            f"number >= {self.minimum}" if self.maximum is None else f"number between {self.minimum} and {self.maximum}"
        )
        return core_schema.no_info_before_validator_function(
            lambda v: _as_number(v, self.minimum, self.maximum, expected), handler(source)
        )

    def __get_pydantic_json_schema__(self, schema: CoreSchema, handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        return _bounds({"type": "number"}, self.minimum, self.maximum)


_DURATION_EXPECTED = f"{durations.EXPECTED}, at most 100 years"


def parse_duration(value: Any) -> float:
    """Seconds from a number of seconds or a duration string with a unit ("10 s", "500 ms"):
    shared/durations.py's reading of Headrace's own fields, with the error pydantic reports."""
    try:
        return durations.parse_duration(value)
    except durations.InvalidDuration as exc:
        hint = {"hint": exc.hint} if exc.hint else {}
        raise _fail("duration", "must be {expected}, got {got}", _DURATION_EXPECTED, got=_repr(value), **hint) from None


Seconds = Annotated[
    float,
    BeforeValidator(parse_duration),
    WithJsonSchema(
        {
            "anyOf": [{"type": "number", "minimum": 0}, {"type": "string", "examples": ["10 s", "500 ms", "2 min"]}],
            "description": "seconds as a number, or a duration string with a unit (a string without one is refused: "
            "Flink would read it as milliseconds)",
        }
    ),
]


PositiveInt = Annotated[int, IntRange(1)]
Parallelism = Annotated[int, IntRange(1, MAX_PARALLELISM)]


def _job_id(value: Any) -> str:
    if isinstance(value, str) and re.fullmatch(r"[0-9a-fA-F]{32}", value):
        return value.lower()
    raise _fail(
        "job_id",
        "must be {expected}, got {got}",
        "32 hexadecimal characters (a Flink JobID)",
        got=_repr(value),
        hint="leave jobId out to have one generated",
    )


def _kind(value: Any) -> str:
    if value in KINDS:
        return value
    raise _fail("kind", "must be {expected}, got {got}", "'pyspark' or 'noop'", got=_repr(value))


def _job_name(value: Any) -> str:
    # Control characters: PostgreSQL refuses NUL in text (a 500), and none belongs in a name.
    if isinstance(value, str) and value.strip() and len(value) <= 255 and not any(ord(c) < 32 for c in value):
        return value.strip()
    raise _fail(
        "job_name",
        "must be {expected}, got {got}",
        "a non-empty string of at most 255 characters, without control characters",
        got=_repr(value),
    )


JobIdStr = Annotated[str, BeforeValidator(_job_id), WithJsonSchema({"type": "string", "pattern": "^[0-9a-fA-F]{32}$"})]
Kind = Annotated[Literal["pyspark", "noop"], BeforeValidator(_kind)]
JobName = Annotated[str, BeforeValidator(_job_name)]


class _Strict(BaseModel):
    """Unknown keys are refused with the list of accepted ones (a typo is never silently ignored)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    @model_validator(mode="before")
    @classmethod
    def _known_fields(cls, data: Any) -> Any:
        if isinstance(data, dict):
            accepted = [f.alias or name for name, f in cls.model_fields.items()]
            known = set(accepted) | set(cls.model_fields)
            for key in data:
                if key not in known:
                    close = difflib.get_close_matches(str(key), accepted, n=1, cutoff=0.6)
                    hint = (f"did you mean {close[0]!r}? " if close else "") + "accepted: " + ", ".join(accepted)
                    raise PydanticCustomError(
                        "unknown_field",
                        "unknown field",
                        {"subfield": str(key), "expected": "one of: " + ", ".join(accepted), "hint": hint},
                    )
        return data


class _Out(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="allow")
