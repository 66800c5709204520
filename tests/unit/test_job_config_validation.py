"""The rules for the job options Headrace reads (services/dispatcher/job_config.py), the run
request's numeric bounds, and the TaskManager's reading of the start-up timeout: pure
functions, no catalog, no server."""

from __future__ import annotations

import json
import math

import pytest
from pydantic import ValidationError

from services.dispatcher.guards import limits
from services.dispatcher.schemas import MAX_PARALLELISM, JarRunRequest
from services.taskmanager.tasks import startup
from services.taskmanager.tasks.noop import InvalidTaskConfig, NoopRunner
from shared import job_options as job_config
from shared.settings import Settings


def _only(config: dict) -> job_config.OptionProblem:
    found = job_config.problems(config)
    assert len(found) == 1, found
    return found[0]


@pytest.mark.parametrize(
    "option, value",
    [
        ("noop.duration", "abc"),
        ("noop.duration", [1]),
        ("noop.duration", math.inf),
        ("noop.fail-attempts", "two"),
        ("noop.fail-attempts", -1),
        ("noop.fail-attempts", 2**63),
        ("noop.fail-message", 42),
        ("noop.startup-delay", "-1 s"),
        ("headrace.task.startup-timeout", "abc"),
        ("headrace.task.startup-timeout", 0),
        ("headrace.task.startup-timeout", "9" * 400 + " s"),
        ("slot.request.timeout", "soon"),
        ("slot.request.timeout", -5),
        ("slot.request.timeout", "1e300 s"),
        ("execution.checkpointing.interval", "often"),
        ("execution.checkpointing.interval", "50 ms"),
        ("execution.checkpointing.timeout", 0),
        ("execution.checkpointing.min-pause", "a while"),
        ("execution.checkpointing.max-concurrent-checkpoints", 0),
        ("execution.checkpointing.tolerable-failed-checkpoints", "x"),
        ("state.checkpoints.num-retained", 10**30),
        ("execution.checkpointing.externalized-checkpoint-retention", "KEEP"),
        ("state.savepoints.dir", "s3://bucket/savepoints"),
        ("execution.savepoint.ignore-unclaimed-state", "maybe"),
        ("execution.savepoint-restore-mode", "STEAL"),
        ("spark.sql.shuffle.partitions", 0),
        ("spark.sql.shuffle.partitions", 2**40),
        ("pipeline.max-parallelism", "many"),
        ("execution.runtime-mode", "REALTIME"),
        ("module", "not a module"),
    ],
)
def test_a_bad_value_names_the_option_the_value_and_a_good_example(option, value):
    problem = _only({option: value})
    assert problem.option == option
    assert problem.message.startswith(("must be ", "scheme ")), problem.message
    shown = repr(value) if len(repr(value)) <= 80 else repr(value)[:77]
    assert shown in problem.message, problem.message
    # The example is a JSON object that would set the option, and is itself accepted.
    example = json.loads(problem.message.rsplit("for example ", 1)[1])
    assert list(example) == [option]
    assert job_config.problems(example) == [], example


@pytest.mark.parametrize(
    "config",
    [
        {},
        {"noop.duration": 2.5, "noop.fail-attempts": "2", "noop.fail-message": "boom", "noop.startup-delay": "2 s"},
        {"noop.duration": -1},
        {"noop.duration": "-1"},
        {"noop.duration": "500 ms"},
        {"headrace.task.startup-timeout": "2 min", "slot.request.timeout": "30 s"},
        {"headrace.task.startup-timeout": "120000", "slot.request.timeout": "30000"},  # milliseconds, as in Flink
        {
            "execution.checkpointing.interval": "10 s",
            "execution.checkpointing.timeout": "10 min",
            "execution.checkpointing.min-pause": 0,
            "execution.checkpointing.max-concurrent-checkpoints": "1",
            "execution.checkpointing.tolerable-failed-checkpoints": 0,
            "state.checkpoints.num-retained": 3,
            "execution.checkpointing.externalized-checkpoint-retention": "DELETE_ON_CANCELLATION",
            "state.savepoints.dir": "file:///shared/savepoints",
            "execution.savepoint.ignore-unclaimed-state": "true",
            "execution.savepoint-restore-mode": "CLAIM",
        },
        {"execution.checkpointing.interval": "0"},
        {"spark.sql.shuffle.partitions": "8", "pipeline.max-parallelism": 128, "execution.runtime-mode": "batch"},
        {"module": "mypackage.main"},
        # Keys Headrace does not read pass through, as Flink passes them through.
        {"spark.executor.memory": "2g", "my.pipeline.threshold": "abc", "headrace.something-else": 1},
    ],
)
def test_readable_values_pass(config):
    assert job_config.problems(config) == []


def test_every_problem_is_reported_not_only_the_first():
    found = job_config.problems({"noop.duration": "abc", "slot.request.timeout": "x", "noop.fail-attempts": 1})
    assert [p.option for p in found] == ["noop.duration", "slot.request.timeout"]


def test_a_misspelled_noop_option_is_refused_with_the_right_name():
    problem = _only({"noop.durations": 2})
    assert problem.option == "noop.durations"
    assert "noop.duration" in problem.message and "did you mean" in problem.message
    assert json.loads(problem.message.rsplit("for example ", 1)[1]) == {"noop.duration": 2.5}


@pytest.mark.parametrize(
    "config, stored",
    [
        (
            {
                "restart-strategy.type": "fixed-delay",
                "restart-strategy.fixed-delay.attempts": "5",
                "restart-strategy.fixed-delay.delay": "10 s",
            },
            {"type": "fixed-delay", "attempts": 5, "delay": 10.0},
        ),
        ({"restart-strategy.type": "none"}, {"type": "none"}),
        (
            {
                "restart-strategy.type": "failurerate",
                "restart-strategy.failure-rate.max-failures-per-interval": 2,
                "restart-strategy.failure-rate.failure-rate-interval": "1 min",
            },
            {"type": "failure-rate", "max-failures-per-interval": 2, "failure-rate-interval": 60.0},
        ),
        (
            {
                "restart-strategy.type": "exponential-delay",
                "restart-strategy.exponential-delay.backoff-multiplier": "2",
                "restart-strategy.exponential-delay.jitter-factor": 0,
            },
            {"type": "exponential-delay", "backoff-multiplier": 2.0, "jitter-factor": 0.0},
        ),
        # Parameters of strategies not chosen are ignored, as in Flink.
        ({"restart-strategy.type": "none", "restart-strategy.fixed-delay.attempts": 3}, {"type": "none"}),
    ],
)
def test_flink_restart_options_in_the_configuration(config, stored):
    assert job_config.problems(config) == []
    assert job_config.restart_strategy_from_config(config) == stored


@pytest.mark.parametrize(
    "config, option",
    [
        ({"restart-strategy.type": "sometimes"}, "restart-strategy.type"),
        ({"restart-strategy.fixed-delay.attempts": 3}, "restart-strategy.type"),
        (
            {"restart-strategy.type": "fixed-delay", "restart-strategy.fixed-delay.attempts": "x"},
            "restart-strategy.fixed-delay.attempts",
        ),
        (
            {"restart-strategy.type": "fixed-delay", "restart-strategy.fixed-delay.delay": "forever"},
            "restart-strategy.fixed-delay.delay",
        ),
        (
            {"restart-strategy.type": "fixed-delay", "restart-strategy.fixed-delay.atempts": 3},
            "restart-strategy.fixed-delay.atempts",
        ),
        (
            {"restart-strategy.type": "exponential-delay", "restart-strategy.exponential-delay.jitter-factor": 2},
            "restart-strategy.exponential-delay.jitter-factor",
        ),
    ],
)
def test_bad_restart_options_in_the_configuration(config, option):
    problem = _only(config)
    assert problem.option == option
    example = json.loads(problem.message.rsplit("for example ", 1)[1])
    assert list(example)[0].startswith("restart-strategy.")


def test_no_restart_options_means_the_request_or_cluster_default_decides():
    assert job_config.restart_strategy_from_config({"noop.duration": 1}) is None


@pytest.mark.parametrize(
    "body",
    [
        {"parallelism": 2**63},
        {"parallelism": 2**63 - 1},
        {"parallelism": MAX_PARALLELISM + 1},
        {"parallelism": 0},
        {"parallelism": -3},
        {"parallelism": 1e300},
        {"parallelism": "9" * 40},
        {"parallelism": True},
        {"restartStrategy": {"type": "fixed-delay", "attempts": 2**63}},
        {"restartStrategy": {"type": "fixed-delay", "delay": 1e300}},
        {"restartStrategy": {"type": "exponential-delay", "max-backoff": "9" * 400 + " s"}},
        {"restartStrategy": {"type": "failure-rate", "max-failures-per-interval": 2**31}},
        {"jobName": "a\x00b"},
    ],
)
def test_run_request_numbers_that_would_overflow_are_validation_errors(body):
    with pytest.raises(ValidationError) as info:
        JarRunRequest.model_validate(body)
    assert len(repr(info.value)) < 2000  # a hostile value is echoed shortened


def test_run_request_accepts_the_largest_parallelism():
    assert JarRunRequest.model_validate({"parallelism": MAX_PARALLELISM}).parallelism == MAX_PARALLELISM


# --- the TaskManager's side ---------------------------------------------------------------------


def test_startup_timeout_job_option_wins_and_unreadable_falls_back():
    assert startup.startup_timeout_s({"headrace.task.startup-timeout": "2 min"}, 300) == 120
    assert startup.startup_timeout_s({}, 300) == 300
    assert startup.startup_timeout_s({"headrace.task.startup-timeout": "abc"}, 300) == 300
    assert startup.startup_timeout_s({"headrace.task.startup-timeout": 0}, 300) == 300


def test_cluster_startup_timeout_from_the_settings(monkeypatch):
    assert Settings().task_startup_timeout_s == startup.DEFAULT_STARTUP_TIMEOUT_S
    monkeypatch.setenv("HEADRACE_TASK_STARTUP_TIMEOUT_S", "90")
    assert Settings().task_startup_timeout_s == 90
    monkeypatch.setenv("HEADRACE_TASK_STARTUP_TIMEOUT_S", "soon")
    with pytest.raises(ValueError, match="task_startup_timeout_s"):
        Settings()


def test_startup_timeout_cause_says_how_long_where_and_what_to_change():
    cause = startup.startup_timeout_cause(120, "building the pipeline (in build(ctx))", "File x.py, line 3")
    assert cause.startswith("the pipeline did not start within 120 s: it was still building the pipeline")
    assert "headrace.task.startup-timeout" in cause and cause.endswith("File x.py, line 3")


class _Spec:
    def __init__(self, config):
        self.config, self.attempt = config, 0


class _Task:
    def __init__(self, config):
        self.spec, self.cancel_requested = _Spec(config), False


@pytest.mark.parametrize(
    "config, option",
    [
        ({"noop.duration": "abc"}, "noop.duration"),
        ({"noop.fail-attempts": "two"}, "noop.fail-attempts"),
        ({"noop.startup-delay": "later"}, "noop.startup-delay"),
    ],
)
def test_a_noop_task_refuses_an_unreadable_option_before_reporting(config, option):
    runner = NoopRunner()
    reports = []
    try:
        with pytest.raises(InvalidTaskConfig, match=option):
            runner.start(_Task(config), lambda *a: reports.append(a))
    finally:
        runner.shutdown()
    assert reports == []


@pytest.mark.parametrize(
    "raw, size",
    [("104857600", 100 * 1024**2), ("100 MB", 100 * 1024**2), ("1g", 1024**3), ("512k", 512 * 1024), (2048, 2048)],
)
def test_upload_limit_sizes(raw, size):
    assert limits.upload_limit(Settings(max_upload_bytes=raw)) == size


@pytest.mark.parametrize("raw", ["", "0", "-5", "lots", "5 PB"])
def test_upload_limit_refuses_what_it_cannot_read(raw):
    with pytest.raises(ValueError, match="HEADRACE_MAX_UPLOAD_BYTES"):
        limits.upload_limit(Settings(max_upload_bytes=raw))


def test_upload_limit_default_and_environment(monkeypatch):
    monkeypatch.delenv("HEADRACE_MAX_UPLOAD_BYTES", raising=False)
    assert limits.upload_limit(Settings()) == limits.DEFAULT_MAX_UPLOAD_BYTES
    monkeypatch.setenv("HEADRACE_MAX_UPLOAD_BYTES", "1 MB")
    assert limits.upload_limit(Settings()) == 1024**2


def test_nan_and_infinity_anywhere_in_the_configuration_are_refused():
    # Python's JSON reader accepts them; PostgreSQL's json type does not (a 500 at the insert).
    found = job_config.problems({"ok": 1.5, "x": math.nan, "nested": {"y": [math.inf]}})
    assert [p.option for p in found] == ["x", "nested"]
    assert "NaN and Infinity are not JSON numbers" in found[0].message
