"""A stopped leader's open transaction on a PostgreSQL catalog (services/jobmanager/
leader_sessions.py), played with real sessions: the old leader's unit of work holds the
`leadership` row under lock and never ends, as a JobManager stopped between its leadership check
and its commit does. The next leader's claim waits no longer than the lock timeout; once it has
ended the older epoch's sessions, its claim goes through at once. Sessions of a standby, of a newer
epoch and of another database are left alone."""

from __future__ import annotations

import time

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from services.jobmanager import leader_sessions
from shared.catalog import Catalog
from shared.catalog import repository as repo
from tests.servers import fresh_pg_database


def catalog_of(url: str, contender: str, epoch: int | None) -> Catalog:
    catalog = Catalog(url)
    leader_sessions.name_sessions(catalog, contender, epoch)
    return catalog


def test_the_next_leader_ends_a_stopped_leaders_transaction_instead_of_waiting_for_it(migrated_pg_url):
    old = catalog_of(migrated_pg_url, "jobmanager@a:1", 7)
    with old.session() as s:
        repo.claim_leadership(s, 7, "jobmanager@a:1")
    stopped = old.engine.connect()  # its unit of work: checked, never committed
    stopped.begin()
    repo.check_leadership(Session(bind=stopped), 7)
    new = catalog_of(migrated_pg_url, "jobmanager@b:2", 8)
    standby = catalog_of(migrated_pg_url, "jobmanager@c:3", None).engine.connect()
    newer = catalog_of(migrated_pg_url, "jobmanager@d:4", 9).engine.connect()
    for conn in (standby, newer):
        conn.execute(sa.text("SELECT 1"))
    try:
        # Without ending it, the claim waits for the lock at most the lock timeout, and says why.
        t0 = time.monotonic()
        with pytest.raises(sa.exc.OperationalError) as waited:
            with new.session() as s:
                repo.claim_leadership(s, 8, "jobmanager@b:2")
        assert leader_sessions.is_lock_timeout(waited.value)
        assert leader_sessions.LOCK_TIMEOUT_S - 0.5 < time.monotonic() - t0 < leader_sessions.LOCK_TIMEOUT_S + 5

        ended = leader_sessions.end_older_leaders(new, 8)
        assert len(ended) == 1 and "headrace-jobmanager epoch 7 jobmanager@a:1" in ended[0], ended
        t0 = time.monotonic()
        with new.session() as s:
            repo.claim_leadership(s, 8, "jobmanager@b:2")
        assert time.monotonic() - t0 < 1.0
        with new.session() as s:
            assert repo.leadership_epoch(s) == 8
        with pytest.raises(sa.exc.OperationalError):  # the stopped leader's session is gone, uncommitted
            stopped.execute(sa.text("SELECT 1"))
        for conn in (standby, newer):  # not an older leader's
            assert conn.execute(sa.text("SELECT 1")).scalar() == 1
    finally:
        for conn in (stopped, standby, newer):
            conn.invalidate()
        for catalog in (old, new):
            catalog.dispose()


def test_an_older_epochs_session_of_another_database_is_left_alone(migrated_pg_url):
    with fresh_pg_database() as other_url:
        other = catalog_of(other_url, "jobmanager@elsewhere:1", 1).engine.connect()
        other.execute(sa.text("SELECT 1"))
        new = catalog_of(migrated_pg_url, "jobmanager@b:2", 5)
        try:
            assert leader_sessions.end_older_leaders(new, 5) == []
            assert other.execute(sa.text("SELECT 1")).scalar() == 1
        finally:
            other.close()
            new.dispose()


def test_sessions_carry_their_role_and_timeouts(migrated_pg_url):
    catalog = catalog_of(migrated_pg_url, "jobmanager@a:1", None)
    try:
        query = sa.text(
            "SELECT application_name, current_setting('lock_timeout'), "
            "current_setting('statement_timeout') FROM pg_stat_activity WHERE pid = pg_backend_pid()"
        )
        with catalog.session() as s:
            assert s.execute(query).one() == ("headrace-jobmanager standby jobmanager@a:1", "5s", "1min")
        leader_sessions.name_sessions(catalog, "jobmanager@a:1", 12)
        with catalog.session() as s:
            assert s.execute(query).one()[0] == "headrace-jobmanager epoch 12 jobmanager@a:1"
    finally:
        catalog.dispose()
