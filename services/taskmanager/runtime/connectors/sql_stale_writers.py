"""A replaced attempt's transaction left open in a SQL sink's PostgreSQL, and how a new attempt's
`prepare` gets past it (sql.py).

Every batch share-locks the sink's fence row inside its transaction, and `prepare` waits for that
lock, so that a batch in flight finishes before the sink changes hands. A driver that is frozen
(SIGSTOP, a paused VM, a long swap) inside that transaction keeps its session, and the lock, for as
long as it is frozen: TCP keepalives do not end a session whose host still answers, so the new
attempt would wait without a bound and without a reason.

So each batch names its transaction after the sink and its attempt (`application_name`,
transaction-local), `prepare` waits for the fence lock at most LOCK_WAIT_S at a time, and when the
wait times out it ends the sessions that name an older attempt of the same sink (`pg_terminate_backend`):
their transactions roll back, and the new attempt re-runs those batches after its rewind anyway.
A session that holds the lock without naming an older attempt (an operator's, another program's)
is never ended: `prepare` waits for it, with a waiting reason, and fails after FENCE_WAIT_S naming it.
SQLite has no sessions to end: one writer holds its lock at a time and a dead one releases it.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable

import sqlalchemy as sa

from shared.errors import TaskError

from .sql_retry import Retrier

SESSION_PREFIX = "headrace-sink"
LOCK_WAIT_S = 5.0  # far above a batch's transaction; the time a frozen writer may cost before it is ended
FENCE_WAIT_S = 120.0  # how long prepare waits for a lock held by a session it may not end
LOCK_NOT_AVAILABLE = "55P03"  # PostgreSQL's SQLSTATE for lock_timeout


class SinkFenceLockedError(TaskError, RuntimeError):
    """The sink's fence row stayed locked past FENCE_WAIT_S by sessions that are not an older
    attempt of the sink."""

    def __init__(self, sink_id: str, waited_s: float, holders: str):
        self.sink_id, self.waited_s, self.holders = sink_id, waited_s, holders
        super().__init__(
            f"SQL sink {sink_id}: its fence row stayed locked for {waited_s:.0f} s by {holders}, which is not "
            f"an earlier attempt of this sink; end that session (pg_terminate_backend) or its transaction, "
            f"then the task's restart takes the sink over (docs/runbooks/taskmanager-loss.md)"
        )

    def __reduce__(self):  # picklable despite its own signature (e.g. across processes)
        return (SinkFenceLockedError, (self.sink_id, self.waited_s, self.holders))


def _sink_tag(sink_id: str) -> str:
    # application_name keeps 63 bytes: a sink id (up to 512 characters) is named by its digest.
    return hashlib.sha256(sink_id.encode()).hexdigest()[:16]


def session_name(sink_id: str, attempt: int) -> str:
    return f"{SESSION_PREFIX} {_sink_tag(sink_id)} attempt {attempt}"


def name_transaction(conn: sa.Connection, sink_id: str, attempt: int | None) -> None:
    """Name this transaction after the sink's attempt (PostgreSQL; nothing on SQLite)."""
    if attempt is not None and conn.dialect.name == "postgresql":
        conn.execute(
            sa.text("SELECT set_config('application_name', :name, true)"), {"name": session_name(sink_id, attempt)}
        )


def limit_lock_wait(conn: sa.Connection) -> None:
    """This transaction waits at most LOCK_WAIT_S for each lock (PostgreSQL; SQLite's lock is whole)."""
    if conn.dialect.name == "postgresql":
        conn.execute(sa.text("SELECT set_config('lock_timeout', :ms, true)"), {"ms": f"{int(LOCK_WAIT_S * 1000)}"})


def is_lock_timeout(exc: BaseException) -> bool:
    return getattr(getattr(exc, "orig", None), "sqlstate", None) == LOCK_NOT_AVAILABLE


def end_older_attempts(engine: sa.Engine, sink_id: str, attempt: int) -> list[str]:
    """End the sessions whose open transaction names an older attempt of this sink; what was ended."""
    if engine.dialect.name != "postgresql":
        return []
    prefix = f"{SESSION_PREFIX} {_sink_tag(sink_id)} attempt "
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT pid, application_name FROM pg_stat_activity "
                "WHERE pid <> pg_backend_pid() AND left(application_name, :n) = :prefix"
            ),
            {"n": len(prefix), "prefix": prefix},
        ).all()
    ended = []
    for pid, name in rows:
        older = name[len(prefix) :]
        if older.isdigit() and int(older) < attempt and _terminate(engine, pid):
            ended.append(f"session {pid} ({name})")
    return ended


def _terminate(engine: sa.Engine, pid: int) -> bool:
    """Whether the session was ended; a role that may not end it leaves it to be waited for."""
    try:
        with engine.connect() as conn:
            return bool(conn.execute(sa.text("SELECT pg_terminate_backend(:pid)"), {"pid": pid}).scalar())
    except sa.exc.ProgrammingError:  # InsufficientPrivilege: another role's session
        return False


def lock_holders(engine: sa.Engine, table: str, sink_id: str) -> str:
    """The other sessions holding a lock on `table` (a row lock shows as the table's RowShareLock),
    for an error or a waiting reason. Other sinks' batches share the table but lock only their own
    rows: they are left out."""
    if engine.dialect.name != "postgresql":
        return "another writer"
    other_sinks = f"{SESSION_PREFIX} "
    own = f"{SESSION_PREFIX} {_sink_tag(sink_id)} "
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT DISTINCT a.pid, a.application_name, a.state FROM pg_locks l "
                "JOIN pg_stat_activity a ON a.pid = l.pid "
                "WHERE l.relation = to_regclass(:table) AND l.granted AND l.pid <> pg_backend_pid()"
            ),
            {"table": table},
        ).all()
    shown = [
        f"session {pid} ({name or 'no application_name'}, {state})"
        for pid, name, state in rows
        if not (name or "").startswith(other_sinks) or name.startswith(own)
    ]
    return ", ".join(shown) or "a session that has since let go"


def take_fence(
    engine: sa.Engine, sink_id: str, attempt: int, retrier: Retrier, prepare: Callable[[], None], *, fences_table: str
) -> None:
    """`prepare()` (its transaction under limit_lock_wait), again after each lock timeout: once
    older attempts' sessions were ended, or while someone else's holds the lock on `fences_table`,
    up to FENCE_WAIT_S."""
    started = time.monotonic()
    while True:
        try:
            prepare()
            retrier.set_waiting(None)
            return
        except sa.exc.OperationalError as exc:
            if not is_lock_timeout(exc):
                raise
        ended = end_older_attempts(engine, sink_id, attempt)
        waited = time.monotonic() - started
        if ended:
            print(
                f"SQL sink {sink_id}: ended {', '.join(ended)}, which held its fence row "
                f"(a replaced attempt's transaction left open)",
                flush=True,
            )
            if waited < FENCE_WAIT_S:
                continue
        holders = lock_holders(engine, fences_table, sink_id)
        if waited >= FENCE_WAIT_S:
            retrier.set_waiting(None)
            raise SinkFenceLockedError(sink_id, waited, holders)
        retrier.set_waiting(f"SQL sink {sink_id}: waiting for its fence row, locked by {holders}")
