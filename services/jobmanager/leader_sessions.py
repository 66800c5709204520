"""The JobManagers' catalog sessions, named by role, and how a new leader ends those of the leaders
before it (PostgreSQL).

A leader stopped (SIGSTOP, a paused VM, a long swap) inside a unit of work keeps its session, and
the row locks of its open transaction, for as long as it is stopped: TCP keepalives do not end a
session whose host still answers. Its ZooKeeper session expires and a standby wins the election,
but the new leader's first unit of work claims the `leadership` row, takes the outbox over and
recovers the jobs, and would wait for those locks without a bound.

So every JobManager session names its role in `application_name` (`name_sessions`):
`headrace-jobmanager epoch <n> <contender>` while it leads with epoch n, `headrace-jobmanager
standby <contender>` otherwise. A new leader, before its first unit of work, ends every session
that names an older epoch in the catalog's database (`end_older_leaders`, pg_terminate_backend;
another cluster's catalog on the same server is another database): the stale leader's open
transaction rolls back, which the fencing allows (nothing of a deposed leader's unit of work may
commit after the new leader's claim: docs/architecture.md, "JobManager high availability"), and
what it had not committed is decided again from the catalog and the redelivered stream entries.
A standby's sessions, and everyone else's, are never ended. The SQL sink ends a replaced
attempt's sessions the same way (services/taskmanager/runtime/connectors/sql_stale_writers.py).

Every JobManager session also waits at most LOCK_TIMEOUT_S for a lock and STATEMENT_TIMEOUT_S for
a statement: whatever else holds a row (an older leader that woke and froze again, an operator's
open transaction), the unit of work fails with a lock timeout instead of waiting without a bound,
and is tried again after older leaders' sessions were ended once more (`lead` in __main__.py).
SQLite has no sessions to end, which is why `headrace up --ha` runs PostgreSQL
(services/cluster/catalog_server.py).
"""

from __future__ import annotations

import logging

from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from shared.catalog import Catalog

log = logging.getLogger("headrace.jobmanager.sessions")

PREFIX = "headrace-jobmanager"
# Far above any unit of work's own lock waits (a dispatcher's or the ResourceManager's transaction
# takes milliseconds); what a lock held by a stopped process may cost before the unit is retried.
LOCK_TIMEOUT_S = 5.0
# No statement of the JobManager's runs for long; a bound, so none waits for ever.
STATEMENT_TIMEOUT_S = 60.0
# pg_terminate_backend waits this long for the session to be gone, and with it its locks.
TERMINATE_WAIT_MS = 2000
LOCK_NOT_AVAILABLE = "55P03"  # PostgreSQL's SQLSTATE for lock_timeout


def session_name(contender: str, epoch: int | None) -> str:
    return f"{PREFIX} {'standby' if epoch is None else f'epoch {epoch}'} {contender}"


def name_sessions(catalog: Catalog, contender: str, epoch: int | None = None) -> None:
    """This process's catalog sessions from now on: named for its role (`epoch` while it leads),
    with the lock and statement timeouts."""
    catalog.set_sessions(
        name=session_name(contender, epoch), lock_timeout_s=LOCK_TIMEOUT_S, statement_timeout_s=STATEMENT_TIMEOUT_S
    )


def end_older_leaders(catalog: Catalog, epoch: int) -> list[str]:
    """End the sessions named for a leader epoch older than `epoch`; what was ended. A catalog
    that cannot be asked is logged and left: the leader's first unit of work then fails, is
    retried, and this is tried again."""
    if catalog.is_sqlite:
        return []
    prefix = f"{PREFIX} epoch "
    ended: list[str] = []
    try:
        with catalog.engine.connect() as conn:
            rows = conn.execute(
                text(
                    "SELECT pid, application_name, state FROM pg_stat_activity WHERE pid <> pg_backend_pid() "
                    "AND datname = current_database() AND left(application_name, :n) = :prefix"
                ),
                {"n": len(prefix), "prefix": prefix},
            ).all()
            waits = (conn.dialect.server_version_info or (0,)) >= (14,)
            for pid, name, state in rows:
                older = name[len(prefix) :].split(" ", 1)[0]
                if not older.isdigit() or int(older) >= epoch:
                    continue
                # PostgreSQL 14 and later wait for the session to be gone, and its locks with it.
                call = "SELECT pg_terminate_backend(:pid, :ms)" if waits else "SELECT pg_terminate_backend(:pid)"
                if conn.execute(text(call), {"pid": pid, "ms": TERMINATE_WAIT_MS}).scalar():
                    ended.append(f"session {pid} ({name}, {state})")
            conn.commit()
    except DBAPIError as exc:
        log.warning(
            "could not end the catalog sessions of earlier leaders (%s); retried after a lock timeout",
            str(exc).splitlines()[0],
        )
        return ended
    if ended:
        log.warning(
            "ended %d catalog session(s) of earlier leaders, whose open transactions could hold rows this "
            "leader needs: %s",
            len(ended),
            "; ".join(ended),
        )
    return ended


def is_lock_timeout(exc: BaseException) -> bool:
    return getattr(getattr(exc, "orig", None), "sqlstate", None) == LOCK_NOT_AVAILABLE
