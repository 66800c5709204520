"""The SQL sink's retry rules (connectors/sql_retry.py): which errors mean "database unreachable",
the bounds in time and count, and the error past them. The real outage is in
tests/integration/test_sql_sink_outage.py."""

from __future__ import annotations

import pickle

import psycopg
import pytest
import sqlalchemy as sa

from services.taskmanager.runtime.connectors.sql_retry import (
    Retrier,
    RetryPolicy,
    SinkDatabaseUnreachable,
    describe_database,
    is_unreachable,
)
from shared import job_options


def _wrapped(orig: Exception, invalidated: bool = False) -> sa.exc.DBAPIError:
    return sa.exc.OperationalError.instance("INSERT ...", {}, orig, psycopg.Error, connection_invalidated=invalidated)


@pytest.mark.parametrize(
    "exc",
    [
        _wrapped(psycopg.OperationalError("connection failed: Connection refused")),
        _wrapped(psycopg.errors.AdminShutdown("terminating connection due to administrator command")),
        _wrapped(psycopg.errors.CannotConnectNow("the database system is starting up")),
        _wrapped(psycopg.errors.CrashShutdown("crash")),
        _wrapped(psycopg.DatabaseError("server closed the connection unexpectedly"), invalidated=True),
        psycopg.OperationalError("consuming input failed: server closed the connection unexpectedly"),
    ],
)
def test_errors_that_mean_the_database_is_away_are_retried(exc):
    assert is_unreachable(exc)


@pytest.mark.parametrize(
    "exc",
    [
        sa.exc.IntegrityError.instance(
            "INSERT ...", {}, psycopg.errors.UniqueViolation("duplicate key"), psycopg.Error
        ),
        sa.exc.ProgrammingError.instance("SELECT", {}, psycopg.errors.SyntaxError("syntax error"), psycopg.Error),
        _wrapped(psycopg.errors.DiskFull("could not extend file")),
        _wrapped(psycopg.errors.SerializationFailure("could not serialize access")),
        ValueError("key columns ['x'] are not in the output columns"),
        sa.exc.OperationalError.instance("INSERT", {}, Exception("database is locked"), Exception),  # SQLite
    ],
)
def test_errors_that_retrying_cannot_help_fail_at_once(exc):
    assert not is_unreachable(exc)


class FakeTime:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.now += s


REFUSED = _wrapped(psycopg.OperationalError("connection failed: Connection refused"))


def _retrier(policy: RetryPolicy, fake: FakeTime, waits: list | None = None) -> Retrier:
    return Retrier(
        policy,
        sink_id="lin:t",
        database="postgresql://db:5432/out",
        clock=fake.clock,
        sleep=fake.sleep,
        on_wait=None if waits is None else waits.append,
    )


def test_a_step_is_retried_with_backoff_until_the_database_answers():
    fake, waits = FakeTime(), []
    failures = iter([REFUSED] * 6)

    def step():
        exc = next(failures, None)
        if exc is not None:
            raise exc
        return "done"

    retrier = _retrier(RetryPolicy(max_retry_time_s=60), fake, waits)
    assert retrier.run("writing batch 3", step) == "done"
    assert fake.sleeps == [0.5, 1.0, 2.0, 4.0, 5.0, 5.0]
    assert retrier.waiting_reason is None and retrier.outages == 1
    assert len(waits) == 2 and "waiting for database postgresql://db:5432/out" in waits[0] and waits[1] is None


def test_past_the_time_bound_the_step_fails_naming_the_database_and_the_time_waited():
    fake = FakeTime()

    def step():
        raise REFUSED

    with pytest.raises(SinkDatabaseUnreachable) as info:
        _retrier(RetryPolicy(max_retry_time_s=12), fake).run("writing batch 7", step)
    err = info.value
    assert err.waited_s == pytest.approx(12.0) and sum(fake.sleeps) == pytest.approx(12.0)
    text = str(err)
    assert "postgresql://db:5432/out" in text and "12.0 s" in text and "writing batch 7" in text
    assert "Connection refused" in text and "sink.max-retry-time" in text
    again = pickle.loads(pickle.dumps(err))  # travels from Spark's callback thread as any error
    assert str(again) == text


def test_the_count_bound_and_a_zero_time_bound_fail_sooner():
    fake = FakeTime()

    def step():
        raise REFUSED

    with pytest.raises(SinkDatabaseUnreachable) as info:
        _retrier(RetryPolicy(max_retry_time_s=60, max_retries=3), fake).run("checking batch 1", step)
    assert info.value.retries == 3 and fake.sleeps == [0.5, 1.0, 2.0]
    fake = FakeTime()
    with pytest.raises(SinkDatabaseUnreachable):
        _retrier(RetryPolicy(max_retry_time_s=0), fake).run("checking batch 1", step)
    assert fake.sleeps == []


def test_other_errors_are_not_retried():
    fake = FakeTime()
    calls = []

    def step():
        calls.append(1)
        raise ValueError("bad column")

    with pytest.raises(ValueError):
        _retrier(RetryPolicy(), fake).run("writing batch 1", step)
    assert calls == [1] and fake.sleeps == []


def test_the_bound_measures_one_continuous_outage():
    fake = FakeTime()
    retrier = _retrier(RetryPolicy(max_retry_time_s=10), fake)
    for _ in range(3):  # three outages of about 8 s each, each step succeeding in between
        failures = iter([REFUSED] * 4)

        def step(failures=failures):
            exc = next(failures, None)
            if exc is not None:
                raise exc

        retrier.run("writing a batch", step)
    assert retrier.outages == 3 and fake.now == pytest.approx(3 * 7.5)


def test_options_sink_values_win_over_job_options_and_bad_values_are_refused():
    assert RetryPolicy.from_options({}) == RetryPolicy(max_retry_time_s=60.0, max_retries=None)
    config = {"sink.max-retry-time": "2 min", "sink.max-retries": "5"}
    assert RetryPolicy.from_options(config) == RetryPolicy(max_retry_time_s=120.0, max_retries=5)
    assert RetryPolicy.from_options(config, max_retry_time=30, max_retries=0) == RetryPolicy(30.0, 0)
    with pytest.raises(ValueError, match="sink.max-retry-time"):
        RetryPolicy.from_options({"sink.max-retry-time": "soon"})
    # The dispatcher refuses the same values at submission.
    assert [p.option for p in job_options.problems({"sink.max-retry-time": "soon", "sink.max-retries": -1})] == [
        "sink.max-retry-time",
        "sink.max-retries",
    ]
    assert job_options.problems(config) == []


def test_the_database_is_named_without_credentials():
    assert describe_database("postgresql://u:secret@db.example:6543/out") == "postgresql://db.example:6543/out"
    assert describe_database("postgresql+psycopg://u@db/out") == "postgresql://db:5432/out"
    assert describe_database("sqlite:////data/out.db") == "sqlite:/data/out.db"
