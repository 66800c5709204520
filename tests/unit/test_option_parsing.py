"""One parser per idea: every reader of a duration or a restart-strategy type (the dispatcher's
REST bodies and job options, the JobManager's restart strategies and checkpoint options, the
TaskManager's no-op tasks) accepts and refuses the same spellings, Flink's own among them. A
duration without a unit is read by where it is written: milliseconds in a job's configuration
options, as Flink reads them; seconds as a number in Headrace's own fields; ambiguous input is
refused with both ways to write it."""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from services.dispatcher import schemas
from services.taskmanager.tasks.noop import InvalidTaskConfig
from shared import checkpointing, durations, job_options, restart

# Flink's TimeUtils.parseDuration labels, with and without a space, in any letter case: the same
# for every reader.
WITH_UNITS = [
    ("500 ms", 0.5),
    ("500ms", 0.5),
    ("500 milli", 0.5),
    ("500 millis", 0.5),
    ("500 millisecond", 0.5),
    ("500 milliseconds", 0.5),
    ("500 MS", 0.5),
    ("10 s", 10.0),
    ("10s", 10.0),
    ("10 sec", 10.0),
    ("10 secs", 10.0),
    ("10 second", 10.0),
    ("10 seconds", 10.0),
    ("10 S", 10.0),
    ("1 min", 60.0),
    ("1min", 60.0),
    ("1 m", 60.0),
    ("1 minute", 60.0),
    ("2 minutes", 120.0),
    ("2 h", 7200.0),
    ("2h", 7200.0),
    ("2 hour", 7200.0),
    ("2 hours", 7200.0),
    ("1 d", 86400.0),
    ("1 day", 86400.0),
    ("3 days", 3 * 86400.0),
    ("1500000 µs", 1.5),
    ("1500000 micros", 1.5),
    ("2000000000 ns", 2.0),
    ("2000000000 nanos", 2.0),
    ("1.5 s", 1.5),
    ("  10 s  ", 10.0),
    ("0 s", 0.0),
    (0, 0.0),
    ("0", 0.0),
]
# Without a unit, each reader follows where the value is written. Headrace's own fields (a REST
# body's restartStrategy, the cluster's restart_strategy, noop.*): a number is seconds.
HEADRACE_ACCEPTED = WITH_UNITS + [(10, 10.0), (2.5, 2.5), (0.0, 0.0)]
# A job's configuration options, as Flink reads its configuration: a string is milliseconds.
FLINK_ACCEPTED = WITH_UNITS + [("10000", 10.0), ("500", 0.5), ("2.5", 0.0025), (" 60000 ", 60.0)]
REFUSED = [
    "ten s",
    "10 fortnights",
    "s",
    "",
    "-1 s",
    -1,
    True,
    None,
    [10],
    {"s": 1},
    math.inf,
    math.nan,
    "10 s 5",
    "1e3 s",
    "9" * 400 + " s",
    "36600 d",
    200 * 365 * 86400 * 1000,
]
# Ambiguous, refused with both ways to write it: a string without a unit where Headrace reads
# numbers as seconds, a JSON number where Flink reads a unit-less value as milliseconds.
HEADRACE_AMBIGUOUS = [("10", 'write 10 (a JSON number of seconds) or "10 s"'), ("2.5", 'or "2.5 s"')]
FLINK_AMBIGUOUS = [(10, 'write "10 s" for seconds, or the string "10" for milliseconds'), (2.5, '"2.5 s"')]


def _headrace_readers():
    """Each reader of one of Headrace's own duration fields, as a function of one value."""
    return {
        "durations": durations.parse_duration,
        "restart": lambda v: restart.parse_duration(v, "delay"),
        "REST body": schemas.parse_duration,
        "no-op options": job_options.noop_seconds,  # what the no-op task reads them with
    }


def _flink_readers():
    """Each reader of a duration option of a job's configuration, as a function of one value."""
    return {
        "durations": durations.parse_flink_duration,
        "job options": job_options.duration_s,
        "checkpoint options": lambda v: checkpointing.checkpoint_config({checkpointing.MIN_PAUSE: v}).min_pause_s,
        "restart options": lambda v: job_options.restart_strategy_from_config(
            {"restart-strategy.type": "fixed-delay", "restart-strategy.fixed-delay.delay": v}
        )["delay"],
    }


@pytest.mark.parametrize("reader", list(_headrace_readers()))
@pytest.mark.parametrize("value, seconds", HEADRACE_ACCEPTED, ids=[repr(v) for v, _ in HEADRACE_ACCEPTED])
def test_headraces_own_fields_read_durations_alike(reader, value, seconds):
    assert _headrace_readers()[reader](value) == pytest.approx(seconds)


@pytest.mark.parametrize("reader", list(_flink_readers()))
@pytest.mark.parametrize("value, seconds", FLINK_ACCEPTED, ids=[repr(v) for v, _ in FLINK_ACCEPTED])
def test_configuration_options_read_durations_as_flink_does(reader, value, seconds):
    assert _flink_readers()[reader](value) == pytest.approx(seconds)


@pytest.mark.parametrize("reader", list(_headrace_readers()))
@pytest.mark.parametrize(
    "value",
    REFUSED + [v for v, _ in HEADRACE_AMBIGUOUS],
    ids=[repr(v)[:20] for v in REFUSED + [v for v, _ in HEADRACE_AMBIGUOUS]],
)
def test_headraces_own_fields_refuse_the_same_durations(reader, value):
    with pytest.raises((ValueError, ValidationError, InvalidTaskConfig)):
        _headrace_readers()[reader](value)


@pytest.mark.parametrize("reader", list(_flink_readers()))
@pytest.mark.parametrize(
    "value",
    REFUSED + [v for v, _ in FLINK_AMBIGUOUS],
    ids=[repr(v)[:20] for v in REFUSED + [v for v, _ in FLINK_AMBIGUOUS]],
)
def test_configuration_options_refuse_the_same_durations(reader, value):
    if value is None and reader == "checkpoint options":
        pytest.skip("a checkpoint option set to null is absent: the default applies")
    with pytest.raises((ValueError, ValidationError)):
        _flink_readers()[reader](value)


@pytest.mark.parametrize("value, says", HEADRACE_AMBIGUOUS)
def test_a_unitless_string_in_headraces_fields_is_refused_saying_how_to_write_it(value, says):
    with pytest.raises(durations.InvalidDuration) as exc:
        durations.parse_duration(value)
    assert says in str(exc.value) and "Flink would read" in str(exc.value)
    with pytest.raises(ValidationError) as body:
        schemas.normalise_restart_strategy({"type": "fixed-delay", "delay": value})
    assert says in body.value.errors()[0]["ctx"]["hint"]


@pytest.mark.parametrize("value, says", FLINK_AMBIGUOUS)
def test_a_json_number_in_a_configuration_option_is_refused_saying_how_to_write_it(value, says):
    for option in (job_options.SLOT_REQUEST_TIMEOUT, checkpointing.INTERVAL, "restart-strategy.fixed-delay.delay"):
        config = {option: value, "restart-strategy.type": "fixed-delay"}
        [problem] = job_options.problems(config)
        assert problem.option == option and says in problem.message, problem.message


def test_a_refused_duration_is_a_value_error_naming_what_is_expected():
    with pytest.raises(ValueError) as exc:
        durations.parse_duration("10 fortnights")
    assert "10 s" in str(exc.value) and "'10 fortnights'" in str(exc.value)


def test_a_checkpoint_interval_of_a_few_milliseconds_is_still_refused():
    # "10" is 10 ms as Flink reads it: below the 100 ms floor, refused rather than run.
    [problem] = job_options.problems({checkpointing.INTERVAL: "10"})
    assert "at least 100 ms" in problem.message


# Flink's spellings of restart-strategy.type (RestartStrategyOptions), and Headrace's "no"/"norestart".
TYPES = [
    ("none", "none"),
    ("off", "none"),
    ("disable", "none"),
    ("no", "none"),
    ("norestart", "none"),
    ("fixed-delay", "fixed-delay"),
    ("fixeddelay", "fixed-delay"),
    ("FixedDelay", "fixed-delay"),
    ("failure-rate", "failure-rate"),
    ("failurerate", "failure-rate"),
    ("exponential-delay", "exponential-delay"),
    ("exponentialdelay", "exponential-delay"),
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


@pytest.mark.parametrize("value", ["500 milliseconds", "10 s", "2 minutes", "0"])
def test_a_restart_delay_with_a_unit_means_the_same_in_a_body_and_in_the_options(value):
    body = schemas.normalise_restart_strategy({"type": "fixed-delay", "delay": value})
    options = job_options.restart_strategy_from_config(
        {"restart-strategy.type": "fixed-delay", "restart-strategy.fixed-delay.delay": value}
    )
    assert body["delay"] == options["delay"] == durations.parse_duration(value)


def test_a_unitless_restart_delay_is_seconds_in_a_body_and_milliseconds_in_the_options():
    assert schemas.normalise_restart_strategy({"type": "fixed-delay", "delay": 3})["delay"] == 3.0
    assert (
        job_options.restart_strategy_from_config(
            {"restart-strategy.type": "fixed-delay", "restart-strategy.fixed-delay.delay": "3000"}
        )["delay"]
        == 3.0
    )


def test_the_bounds_are_defined_once():
    assert schemas.MAX_INT is job_options.MAX_INT
    assert job_options.MAX_DURATION_S is durations.MAX_DURATION_S
    assert schemas.RESTART_TYPES is restart.STRATEGY_TYPES


@pytest.mark.parametrize(
    "seconds, text",
    [
        (10.0, "10 s"),
        (600.0, "10 min"),
        (0.5, "500 ms"),
        (3600.0, "1 h"),
        (86400.0, "1 d"),
        (1.5, "1500 ms"),
        (0.0, "0 ms"),
    ],
)
def test_a_duration_is_written_as_flink_writes_it_and_reads_back_the_same(seconds, text):
    assert durations.flink_text(seconds) == text
    assert durations.parse_flink_duration(text) == pytest.approx(seconds)
