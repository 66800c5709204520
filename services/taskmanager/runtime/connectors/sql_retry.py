"""A SQL sink riding out an outage of its database: bounded retries of an idempotent step.

Without this, every outage of a sink's PostgreSQL failed the micro-batch and cost a task
restart. Flink's JDBC sink retries a failed flush (`sink.max-retries`, default 3, with a
growing pause); here the bound that matters is time, because what a batch waits for is the
database coming back: a batch whose database is unreachable is tried again with backoff
(0.5 s doubling to 5 s) until it succeeds or the database has been unreachable for
`sink.max-retry-time` (default 60 s), or `sink.max-retries` retries were made (no count limit
unless set). Past the bound the batch fails with `SinkDatabaseUnreachable`, which names the
database and the time waited, and the task fails and restarts as before.

Only "unreachable" errors are retried (see `is_unreachable`): connection refused or reset, the
server shutting down or starting up, a connection the driver found broken. A constraint, type
or syntax error, a fenced or foreign-owned sink fail at once, as before.

Retrying is safe because every step retried is idempotent on its own: a batch's upsert and its
commit marker are one transaction, so after a commit whose outcome is unknown (the connection
broke during COMMIT) the retry either finds the marker (the batch landed: nothing is written
again) or writes the whole batch; and each retry re-checks the attempt's fence inside its own
transaction, so an attempt replaced during the outage still cannot write. The time bound
restarts after every step that reached the database: it measures one continuous outage.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import sqlalchemy as sa

from shared import backoff, durations
from shared.errors import TaskError
from shared.job_options import SINK_MAX_RETRIES as MAX_RETRIES
from shared.job_options import SINK_MAX_RETRY_TIME as MAX_RETRY_TIME
from shared.job_options import duration_s, integer

log = logging.getLogger(__name__)

DEFAULT_MAX_RETRY_TIME_S = 60.0
FIRST_BACKOFF_S = 0.5
MAX_BACKOFF_S = 5.0  # how late the sink may notice that its database is back
REPORT_EVERY_S = 10.0  # a WARNING line at the first failure, then at most this often

# PostgreSQL SQLSTATEs that mean the server is going away or not yet there: 57P01 admin_shutdown
# (a fast shutdown cut the session), 57P02 crash_shutdown, 57P03 cannot_connect_now (starting
# up, shutting down, in recovery); class 08 is "connection exception".
_SERVER_AWAY = {"57P01", "57P02", "57P03"}

T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    """How long a SQL sink step may wait for its database: `max_retry_time_s` of one
    continuous outage (0: fail at the first error, as before), and at most `max_retries`
    retries per step (None: no count limit)."""

    max_retry_time_s: float = DEFAULT_MAX_RETRY_TIME_S
    max_retries: int | None = None
    first_backoff_s: float = FIRST_BACKOFF_S
    max_backoff_s: float = MAX_BACKOFF_S

    @classmethod
    def from_options(
        cls, config: Mapping[str, Any] | None = None, *, max_retry_time: Any = None, max_retries: Any = None
    ) -> "RetryPolicy":
        """The sink's own values, else the job options `sink.max-retry-time` and
        `sink.max-retries`, else the defaults. The job options are read as the dispatcher checks
        them (shared/job_options.py: a string without a unit is milliseconds, as in Flink), so a
        value refused there is refused here the same way; the sink's own `max_retry_time` is a
        Python argument, whose number is seconds (shared/durations.py, parse_duration)."""
        config = config or {}
        time_value = max_retry_time if max_retry_time is not None else config.get(MAX_RETRY_TIME)
        count_value = max_retries if max_retries is not None else config.get(MAX_RETRIES)
        read_time = durations.parse_duration if max_retry_time is not None else duration_s
        try:
            seconds = DEFAULT_MAX_RETRY_TIME_S if time_value is None else read_time(time_value)
            count = None if count_value is None else integer(count_value, 0)
        except ValueError as exc:
            raise ValueError(
                f'SQL sink retry options: {MAX_RETRY_TIME} must be a duration such as "60 s" and '
                f"{MAX_RETRIES} a count >= 0, got {time_value!r} and {count_value!r} ({exc})"
            ) from exc
        return cls(max_retry_time_s=seconds, max_retries=count)

    def backoff(self, retry: int) -> float:
        """The pause before retry number `retry` (1, 2, ...)."""
        return backoff.exponential(retry, first_s=self.first_backoff_s, max_s=self.max_backoff_s)


def is_unreachable(exc: BaseException) -> bool:
    """Whether `exc` says the database could not be reached (worth waiting for), rather than
    that it refused what was asked (a constraint, a type, the SQL itself: retrying cannot help)."""
    if isinstance(exc, sa.exc.DBAPIError):
        if exc.connection_invalidated:  # the dialect recognised a broken connection
            return True
        exc = exc.orig if exc.orig is not None else exc
    try:
        import psycopg
    except ImportError:  # no PostgreSQL driver: no PostgreSQL sink either
        return False
    if not isinstance(exc, psycopg.OperationalError):
        return False
    state = getattr(exc, "sqlstate", None)
    # No SQLSTATE: the failure came from the client side (refused, reset, timed out, closed),
    # before or instead of any answer from the server.
    return state is None or state.startswith("08") or state in _SERVER_AWAY


def describe_database(url: str) -> str:
    """The database as an operator names it, without credentials: host:port/name."""
    try:
        u = sa.engine.make_url(url)
    except sa.exc.ArgumentError:
        return "(an unparsable database URL)"
    if u.get_backend_name() == "sqlite":
        return f"sqlite:{u.database or ':memory:'}"
    port = u.port or (5432 if u.get_backend_name().startswith("postgres") else None)
    return f"{u.get_backend_name()}://{u.host or 'localhost'}{f':{port}' if port else ''}/{u.database or ''}"


class SinkDatabaseUnreachable(TaskError, RuntimeError):
    """A SQL sink's database stayed unreachable past the sink's retry bound."""

    def __init__(self, sink_id: str, database: str, step: str, waited_s: float, retries: int, cause: str):
        self.sink_id, self.database, self.step = sink_id, database, step
        self.waited_s, self.retries, self.cause = waited_s, retries, cause
        super().__init__(
            f"SQL sink {sink_id}: database {database} unreachable for {waited_s:.1f} s while {step} "
            f"({retries} retries; bound: {MAX_RETRY_TIME} / {MAX_RETRIES}); last error: {cause}. "
            f"Nothing of this batch was committed twice or lost: the task fails and its restart "
            f"re-runs the batch once the database answers (docs/runbooks/catalog-outage.md, "
            f'"SQL sinks").'
        )

    def __reduce__(self):  # picklable despite its own signature (e.g. across processes)
        return (
            SinkDatabaseUnreachable,
            (self.sink_id, self.database, self.step, self.waited_s, self.retries, self.cause),
        )


def _first_line(exc: BaseException) -> str:
    text = str(getattr(exc, "orig", None) or exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


class Retrier:
    """Runs sink steps under a RetryPolicy. `on_wait(reason or None)` hears when the sink starts
    waiting for its database (a reason, once per outage) and when it stops (None): the driver
    sends it on as the attempt's waiting reason (shared/task_protocol.py `Waiting`)."""

    def __init__(
        self,
        policy: RetryPolicy,
        *,
        sink_id: str,
        database: str,
        on_wait: Callable[[str | None], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ):
        self.policy, self.sink_id, self.database = policy, sink_id, database
        self.on_wait = on_wait
        self.clock, self.sleep = clock, sleep
        self.waiting_reason: str | None = None  # set while a step waits for the database
        self.outages = 0  # steps that had to wait, since the sink started (a figure for tests and logs)

    def run(self, step: str, fn: Callable[[], T]) -> T:
        """`fn()`, retried while it fails with an unreachable database and the bound allows.
        `fn` must be idempotent (see the module docstring)."""
        started: float | None = None
        reported = 0.0
        retries = 0
        while True:
            try:
                result = fn()
            except Exception as exc:
                if not is_unreachable(exc):
                    raise
                now = self.clock()
                if started is None:
                    started, self.outages = now, self.outages + 1
                waited = now - started
                remaining = self.policy.max_retry_time_s - waited
                if remaining <= 0 or (self.policy.max_retries is not None and retries >= self.policy.max_retries):
                    self.set_waiting(None)
                    raise SinkDatabaseUnreachable(
                        self.sink_id, self.database, step, waited, retries, _first_line(exc)
                    ) from exc
                retries += 1
                if retries == 1 or now - reported >= REPORT_EVERY_S:
                    reported = now
                    log.warning(
                        "SQL sink %s: database %s unreachable while %s (%s); waiting %.0f s more "
                        "for it (%s %.0f s), retry %d",
                        self.sink_id,
                        self.database,
                        step,
                        _first_line(exc),
                        remaining,
                        MAX_RETRY_TIME,
                        self.policy.max_retry_time_s,
                        retries,
                    )
                if retries == 1:
                    since = time.strftime("%H:%M:%S", time.gmtime())
                    self.set_waiting(
                        f"SQL sink {self.sink_id}: waiting for database {self.database}, "
                        f"unreachable since {since} UTC (the task fails after "
                        f"{self.policy.max_retry_time_s:.0f} s, {MAX_RETRY_TIME})"
                    )
                self.sleep(min(self.policy.backoff(retries), remaining))
                continue
            if started is not None:
                log.warning(
                    "SQL sink %s: database %s answers again after %.1f s; %s went on (%d retries)",
                    self.sink_id,
                    self.database,
                    self.clock() - started,
                    step,
                    retries,
                )
                self.set_waiting(None)
            return result

    def set_waiting(self, reason: str | None) -> None:
        """Report that the sink waits (a reason) or no longer does (None); also for waits of
        its own, like the fence lock's (sql_stale_writers.py)."""
        if reason == self.waiting_reason:
            return
        self.waiting_reason = reason
        if self.on_wait is not None:
            try:
                self.on_wait(reason)
            except Exception:  # a status for operators, never worth failing the batch
                log.exception("SQL sink %s: could not report its waiting state", self.sink_id)
