"""The options of a job's configuration that Headrace reads, checked at submission.

A value a service cannot read must be refused here, with the option, the value and an example
of a good one: once the job exists, it is found minutes later by a TaskManager or the JobManager,
far from the user (a bad `noop.duration` used to leave its attempt DEPLOYING, holding its slots).
Everything here is pure (no catalog, no settings), so it is tested as unit tests.

What is read, and by whom:

  noop.duration                  TaskManager (no-op tasks): seconds (a negative number: until
                                 cancelled), or a duration such as "2 s"
  noop.fail-attempts             TaskManager: attempts numbered below this fail
  noop.fail-message              TaskManager: the failure cause they report
  noop.startup-delay             TaskManager: a no-op task stays INITIALIZING this long
  headrace.task.startup-timeout  TaskManager: a task not RUNNING this long after its driver got
                                 it fails (the pipeline hangs at import or in build())
  headrace.task.memory-limit     TaskManager: a task whose processes hold more memory than this
                                 is killed and fails (services/taskmanager/memory/limit.py)
  slot.request.timeout           JobManager / ResourceManager: waiting longer for slots fails
  restart-strategy.*             dispatcher: Flink's restart options, used when the request
                                 has no `restartStrategy` (see `restart_strategy_from_config`)
  execution.checkpointing.*, state.* (shared/checkpointing.py): JobManager
  spark.sql.shuffle.partitions, pipeline.max-parallelism, maxParallelism: driver / views
  execution.runtime-mode         views: STREAMING or BATCH
  module                         driver: the module of a .zip artifact to import
  sink.max-retry-time            driver (SQL sinks): how long a batch waits for an unreachable
                                 database before the task fails (default 60 s, 0: no wait)
  sink.max-retries               driver (SQL sinks): at most this many retries per step (Flink's
                                 JDBC option name; default: no count limit, only the time)
  sink.delta.optimize.every, .optimize.interval, .vacuum.every, .vacuum.interval,
  .vacuum.retention              driver (Delta sinks): compaction and clean-up of the tables
                                 (N micro-batches, durations; a sink's own options win)
  headrace.redis.keys.read, .write  JobManager: the Redis data keys the job's lineage user may
                                 read, and read and write (shared/redis_key_grants.py)
  headrace.latency-mode          driver / views: true trades throughput for latency (the next
                                 micro-batch at once, LATENCY_STATE_PARTITIONS state partitions
                                 unless the job chooses them; docs/runbooks/
                                 slow-pipeline.md, "Slow to answer")

Durations are read as Flink reads its configuration (shared/durations.py, parse_flink_duration):
"10 s", "500 ms", "2 min", and a string without a unit is milliseconds ("10000" is 10 s); a JSON
number other than 0 is refused with both ways to write it. The noop.* options are Headrace's
test tasks and keep their documented reading: a number is seconds.

Other keys (Spark's own options, user keys read by a pipeline through ctx.config) pass through
unchecked, as Flink passes unknown keys through; only the `noop.` namespace is closed, so a
typo there is reported rather than ignored.

The dispatcher checks with `problems()`; the TaskManager (start-up timeout) and the JobManager
(slot request timeout) read the same options through this module, so a value the dispatcher let
through means the same everywhere.
"""

from __future__ import annotations

import difflib
import math
import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from shared import checkpointing as cp
from shared import durations, kafka_delivery, redis_key_grants, restart_options, sizes
from shared.booleans import parse_boolean

# The readers every option shares, and the restart options, are read here under these names too.
from shared.option_values import (  # noqa: F401
    DURATION_EXPECTED,
    MAX_DURATION_S,
    MAX_INT,
    OptionProblem,
    duration_s,
    integer,
    integer_expected,
    noop_seconds,
    refusal_reason,
)
from shared.restart_options import RESTART_PREFIX, restart_strategy_from_config  # noqa: F401

STARTUP_TIMEOUT = "headrace.task.startup-timeout"
MEMORY_LIMIT = "headrace.task.memory-limit"
EXECUTOR_MEMORY = "spark.executor.memory"
SLOT_REQUEST_TIMEOUT = "slot.request.timeout"
NOOP_DURATION = "noop.duration"
NOOP_FAIL_ATTEMPTS = "noop.fail-attempts"
NOOP_FAIL_MESSAGE = "noop.fail-message"
NOOP_STARTUP_DELAY = "noop.startup-delay"
SINK_MAX_RETRY_TIME = "sink.max-retry-time"
SINK_MAX_RETRIES = "sink.max-retries"
LATENCY_MODE = "headrace.latency-mode"
# Fewer state partitions, fewer state store tasks per micro-batch: 0.23 s against 0.26 s with 4
# (docs/benchmarks.md, "Where a small micro-batch's time goes").
LATENCY_STATE_PARTITIONS = 2


def _text(value: Any) -> str:
    if not isinstance(value, str) or "\x00" in value:
        raise ValueError("not a string")
    return value


def _module(value: Any) -> str:
    if isinstance(value, str) and value and all(p.isidentifier() for p in value.split(".")):
        return value
    raise ValueError("not a module name")


def _runtime_mode(value: Any) -> str:
    if isinstance(value, str) and value.strip().upper() in ("STREAMING", "BATCH", "AUTOMATIC"):
        return value.strip().upper()
    raise ValueError("not a runtime mode")


_DURATION = DURATION_EXPECTED
_POSITIVE_DURATION = f"a duration greater than 0 ({_DURATION})"


@dataclass(frozen=True)
class _Rule:
    read: Callable[[Any], Any]
    expected: str | Callable[[Any], str]  # or what to say about this value
    example: Any

    def expected_for(self, value: Any) -> str:
        return self.expected(value) if callable(self.expected) else self.expected


def _integer_rule(minimum: int, example: int) -> _Rule:
    return _Rule(lambda v: integer(v, minimum), lambda v: integer_expected(v, minimum), example)


MEMORY_LIMIT_OFF = ("off", "none", "0", "false")


def memory_limit_bytes(value: Any) -> int | None:
    """headrace.task.memory-limit (and the cluster's driver_memory_limit): bytes, or None for
    one of MEMORY_LIMIT_OFF (no limit). Raises ValueError."""
    if isinstance(value, str) and value.strip().lower() in MEMORY_LIMIT_OFF:
        return None
    return sizes.parse_bytes(value, what=MEMORY_LIMIT)


def spark_executor_memory(value: Any) -> str:
    """spark.executor.memory as Spark reads it (a bare number is mebibytes, Spark's rule for
    this key), spelled the way Spark takes it: "2 gb" -> "2g"."""
    return sizes.spark_spelling(sizes.parse_bytes(value, what=EXECUTOR_MEMORY, default_unit="m"))


RULES: dict[str, _Rule] = {
    NOOP_DURATION: _Rule(
        lambda v: noop_seconds(v, allow_negative=True),
        'seconds as a number (negative: run until cancelled), or a duration string such as "10 s", "500 ms" or "2 min"',
        2.5,
    ),
    NOOP_FAIL_ATTEMPTS: _integer_rule(0, 2),
    NOOP_FAIL_MESSAGE: _Rule(_text, "a string", "simulated failure"),
    NOOP_STARTUP_DELAY: _Rule(noop_seconds, f"a duration of at least 0 ({durations.EXPECTED})", "2 s"),
    STARTUP_TIMEOUT: _Rule(lambda v: duration_s(v, positive=True), _POSITIVE_DURATION, "2 min"),
    MEMORY_LIMIT: _Rule(
        memory_limit_bytes, 'a size such as "3g", "2500m" or "4 gb" (Flink\'s spellings), or "off"', "4g"
    ),
    SLOT_REQUEST_TIMEOUT: _Rule(lambda v: duration_s(v, positive=True), _POSITIVE_DURATION, "5 min"),
    "spark.sql.shuffle.partitions": _integer_rule(1, 8),
    # Read by a TaskManager whose tasks run on a Spark standalone cluster (executor size).
    "spark.executor.cores": _integer_rule(1, 2),
    EXECUTOR_MEMORY: _Rule(spark_executor_memory, "a size such as 512m, 1g or 4g (a bare number: mebibytes)", "2g"),
    "pipeline.max-parallelism": _integer_rule(1, 128),
    "maxParallelism": _integer_rule(1, 128),
    "execution.runtime-mode": _Rule(_runtime_mode, "STREAMING, BATCH or AUTOMATIC", "STREAMING"),
    "module": _Rule(_module, "the dotted name of a module inside the .zip", "mypipeline.main"),
    SINK_MAX_RETRY_TIME: _Rule(duration_s, f"a duration of at least 0 ({_DURATION})", "60 s"),
    SINK_MAX_RETRIES: _integer_rule(0, 3),
    LATENCY_MODE: _Rule(parse_boolean, "true or false", True),
    kafka_delivery.TRANSACTION_TIMEOUT_OPTION: _Rule(
        lambda v: duration_s(v, positive=True), _POSITIVE_DURATION, "10 min"
    ),
    kafka_delivery.REAL_TIME_OPTION: _Rule(kafka_delivery.real_time_seconds, "a duration of at least 1 s", "5 s"),
    **{
        option: _Rule(redis_key_grants.parse_patterns, redis_key_grants.EXPECTED, redis_key_grants.EXAMPLE)
        for option in redis_key_grants.OPTIONS
    },
    # Every Delta sink's upkeep (services/taskmanager/runtime/connectors/delta_maintenance.py).
    "sink.delta.optimize.every": _integer_rule(0, 100),
    "sink.delta.vacuum.every": _integer_rule(0, 1000),
    **{
        f"sink.delta.{name}": _Rule(duration_s, f"a duration of at least 0 ({_DURATION})", example)
        for name, example in (("optimize.interval", "30 min"), ("vacuum.interval", "1 d"), ("vacuum.retention", "7 d"))
    },
}

# Checkpoint options are read by shared/checkpointing.py; these are good values to show.
CHECKPOINT_EXAMPLES: dict[str, Any] = {
    cp.INTERVAL: "10 s",
    cp.TIMEOUT: "10 min",
    cp.MIN_PAUSE: "500 ms",
    cp.MAX_CONCURRENT: 1,
    cp.TOLERABLE: 3,
    cp.NUM_RETAINED: 3,
    cp.RETENTION: "RETAIN_ON_CANCELLATION",
    cp.SAVEPOINT_DIR: "/shared/savepoints",
    cp.RESTORE_PATH: "/shared/savepoints/savepoint-1a2b3c",
    cp.ALLOW_NON_RESTORED: True,
    cp.RESTORE_MODE: "NO_CLAIM",
}
_CHECKPOINT_DURATIONS = (cp.INTERVAL, cp.TIMEOUT, cp.MIN_PAUSE)
_CHECKPOINT_COUNTS = (cp.MAX_CONCURRENT, cp.TOLERABLE, cp.NUM_RETAINED)

# --- the checks --------------------------------------------------------------------------------


def problems(config: Mapping[str, Any] | None) -> list[OptionProblem]:
    """Every option of `config` Headrace would fail to read, in the configuration's order."""
    found: list[OptionProblem] = []
    config = config or {}
    for key, value in config.items():
        if not isinstance(key, str):
            continue
        if not _json_safe(value):
            # Python's JSON reader takes NaN and Infinity; PostgreSQL's json type refuses them.
            found.append(OptionProblem(key, value, "a JSON value (NaN and Infinity are not JSON numbers)", 0))
            continue
        rule = RULES.get(key)
        if rule is not None:
            try:
                rule.read(value)
            except (ValueError, TypeError, OverflowError) as exc:
                found.append(
                    OptionProblem(key, value, rule.expected_for(value), rule.example, reason=refusal_reason(exc))
                )
        elif key.startswith("noop."):
            found.append(_unknown_noop_option(key, value))
        elif key in cp.KEYS:
            problem = _checkpoint_problem(key, value)
            if problem is not None:
                found.append(problem)
    found.extend(restart_options.problems(config))
    return found


def _json_safe(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(_json_safe(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return all(_json_safe(v) for v in value)
    return True


def _unknown_noop_option(key: str, value: Any) -> OptionProblem:
    noop_options = [k for k in RULES if k.startswith("noop.")]
    close = difflib.get_close_matches(key, noop_options, n=1, cutoff=0.8)
    if close:
        return OptionProblem(
            key, value, f"did you mean {close[0]!r}?", RULES[close[0]].example, example_option=close[0]
        )
    return OptionProblem(
        key,
        value,
        f"one of the no-op task's options: {', '.join(noop_options)}",
        RULES[NOOP_DURATION].example,
        example_option=NOOP_DURATION,
    )


def _checkpoint_problem(key: str, value: Any) -> OptionProblem | None:
    example = CHECKPOINT_EXAMPLES.get(key, "")
    if key in _CHECKPOINT_DURATIONS and value is not None:
        if key == cp.INTERVAL and str(value).strip().lower() in ("", "0", "none", "disabled", "off"):
            return None
        try:
            duration_s(value)
        except ValueError as exc:
            return OptionProblem(key, value, _DURATION, example, reason=refusal_reason(exc))
    if key in _CHECKPOINT_COUNTS and value is not None:
        minimum = 0 if key == cp.TOLERABLE else 1
        try:
            integer(value, minimum)
        except ValueError:
            return OptionProblem(key, value, integer_expected(value, minimum), example)
    try:
        cp.checkpoint_config({key: value})
    except cp.InvalidCheckpointConfig as exc:
        text = re.sub(r",? got .*$", "", exc.message)
        if text.startswith(("expected ", "must be ")):
            return OptionProblem(key, value, text.removeprefix("expected ").removeprefix("must be "), example)
        return OptionProblem(key, value, text, example, reason=text)
    return None


def startup_timeout_s(config: Mapping[str, Any] | None, default_s: float) -> float:
    """`headrace.task.startup-timeout` of a job, or the cluster's default if it sets none (or,
    for a job stored before this check existed, one that cannot be read)."""
    raw = (config or {}).get(STARTUP_TIMEOUT)
    if raw is None:
        return default_s
    try:
        return duration_s(raw, positive=True)
    except ValueError:
        return default_s


STATE_PARTITION_KEYS = ("spark.sql.shuffle.partitions", "pipeline.max-parallelism", "maxParallelism")


def latency_mode(config: Mapping[str, Any] | None) -> bool:
    """Whether a job runs in the latency mode (headrace.latency-mode); a value the dispatcher
    would have refused reads as off."""
    try:
        return parse_boolean((config or {}).get(LATENCY_MODE, False))
    except ValueError:
        return False


def explicit_state_partitions(config: Mapping[str, Any] | None) -> int | None:
    """The state partition count a job's configuration sets (Spark's shuffle partitions, or
    Flink's name for the same bound, pipeline.max-parallelism), or None. A restore that finds
    another count pinned in its snapshot is refused (shared/restore_compat.py)."""
    config = config or {}
    for key in STATE_PARTITION_KEYS:
        try:
            value = int(str(config[key]).strip())
        except (KeyError, TypeError, ValueError):
            continue
        if value > 0:
            return value
    return None


def chosen_state_partitions(config: Mapping[str, Any] | None) -> int | None:
    """The state partition count a job's first start uses unless the cluster's default: the one
    it sets, else in the latency mode LATENCY_STATE_PARTITIONS. The driver applies it as
    spark.sql.shuffle.partitions; a restored query keeps the count its checkpoint pinned (the
    latency mode's choice is no reason to refuse a restore, an explicit one is)."""
    chosen = explicit_state_partitions(config)
    if chosen is None and latency_mode(config):
        return LATENCY_STATE_PARTITIONS
    return chosen


def state_partitions(config: Mapping[str, Any] | None, default: int) -> int:
    """A job's state partition count: what it chooses, else the cluster's `default`. A stateful
    stage cannot use more cores than this, whatever its parallelism."""
    return chosen_state_partitions(config) or default
