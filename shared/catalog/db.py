from __future__ import annotations

import contextlib
import logging
import os
import re
from pathlib import Path
from typing import Iterator

from sqlalchemy import create_engine, event, text
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, sessionmaker

log = logging.getLogger(__name__)
MIGRATIONS = Path(__file__).parent / "migrations"


def normalise_url(url: str) -> str:
    # psycopg 3 is the driver we install; a plain postgresql:// URL would look for psycopg2.
    if url.startswith("postgresql://") or url.startswith("postgres://"):
        return "postgresql+psycopg://" + url.split("://", 1)[1]
    return url


class Catalog:
    """Owns the engine and the session factory; built in a service's entry point."""

    def __init__(self, url: str):
        self.url = normalise_url(url)
        self.is_sqlite = self.url.startswith("sqlite")
        kwargs: dict = {"future": True}
        if self.is_sqlite:
            path = self.url.split("///", 1)[-1]
            if path and path != ":memory:":
                Path(path).parent.mkdir(parents=True, exist_ok=True)
                # Owner-only from the start (SQLite gives its journals the file's mode): no pipeline,
                # whatever user it runs as, may read the tokens or write the jobs.
                os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
            kwargs["connect_args"] = {"timeout": 30, "check_same_thread": False}
        else:
            # A partitioned server that never answers must not hold a request for the OS's TCP
            # connect timeout (minutes): five seconds, then the caller's retry or 503.
            kwargs.update(pool_pre_ping=True, pool_size=5, max_overflow=10, connect_args={"connect_timeout": 5})
        self.engine: Engine = create_engine(self.url, **kwargs)
        self._session_options: dict[str, str] = {}
        if not self.is_sqlite:
            event.listen(self.engine, "do_connect", self._add_session_options)
        if self.is_sqlite:
            event.listen(self.engine, "connect", _sqlite_pragmas)
            # Take the write lock at BEGIN so two processes never deadlock upgrading read locks.
            event.listen(self.engine, "begin", lambda conn: conn.exec_driver_sql("BEGIN IMMEDIATE"))
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)

    def set_sessions(
        self, *, name: str, lock_timeout_s: float | None = None, statement_timeout_s: float | None = None
    ) -> None:
        """PostgreSQL: every session from now on is named `name` (its application_name, what
        pg_stat_activity shows) and waits at most `lock_timeout_s` for a lock and
        `statement_timeout_s` for a statement; the pool's open sessions are closed, so none keeps
        an older name. Nothing on SQLite, which has neither."""
        if self.is_sqlite:
            return
        options = " ".join(
            f"-c {key}={int(s * 1000)}"
            for key, s in (("lock_timeout", lock_timeout_s), ("statement_timeout", statement_timeout_s))
            if s is not None
        )
        self._session_options = {"application_name": name[:63]} | ({"options": options} if options else {})
        self.engine.dispose()  # sessions checked out now keep their name until they are returned

    def _add_session_options(self, _dialect, _record, _cargs, cparams) -> None:
        for key, value in self._session_options.items():  # the URL's own options stay, ours after them
            cparams[key] = f"{cparams[key]} {value}" if key == "options" and cparams.get(key) else value

    @contextlib.contextmanager
    def session(self) -> Iterator[Session]:
        """One transaction: committed when the block ends, rolled back if it raises."""
        with self._sessions() as s:
            with s.begin():
                yield s

    def migrate(self) -> None:
        """`alembic upgrade head`, serialised across processes on PostgreSQL. A catalog already at
        the head is left alone without importing Alembic: every service migrates at start, and
        Alembic's modules stayed resident in each (8 MB of each service's memory, issue 10)."""
        if self.at_head():
            return
        from alembic import command
        from alembic.config import Config

        cfg = Config()
        cfg.set_main_option("script_location", str(MIGRATIONS))
        cfg.set_main_option("sqlalchemy.url", self.url.replace("%", "%%"))
        with self.engine.connect() as conn:
            if not self.is_sqlite:
                conn.execute(text("SELECT pg_advisory_lock(7243)"))
                conn.commit()
            try:
                cfg.attributes["connection"] = conn
                command.upgrade(cfg, "head")
                conn.commit()
            finally:
                if not self.is_sqlite:
                    conn.execute(text("SELECT pg_advisory_unlock(7243)"))
                    conn.commit()

    def at_head(self) -> bool:
        """Whether the catalog's schema is the newest migration (False when unsure)."""
        try:
            with self.engine.connect() as conn:
                current = conn.execute(text("SELECT version_num FROM alembic_version")).scalars().all()
        except Exception:  # noqa: BLE001 - no table yet, or unreachable: let Alembic decide and say
            return False
        return current == [head_revision()]

    def dispose(self) -> None:
        self.engine.dispose()


_REVISION = re.compile(r"^(down_revision|revision)\s*=\s*['\"]?([\w]+)['\"]?", re.M)


def head_revision(versions: Path = MIGRATIONS / "versions") -> str | None:
    """The revision no other migration builds on, read from the files (Alembic's own
    ScriptDirectory agrees; tests/unit/test_catalog_head.py checks it)."""
    revisions: set[str] = set()
    parents: set[str] = set()
    for path in versions.glob("*.py"):
        for key, value in _REVISION.findall(path.read_text()):
            (revisions if key == "revision" else parents).add(value)
    heads = revisions - parents
    return heads.pop() if len(heads) == 1 else None


def _sqlite_pragmas(dbapi_conn, _record) -> None:
    # WAL lets the dispatcher read while the JobManager writes; the isolation_level=None
    # hands transaction control to the "begin" listener above.
    dbapi_conn.isolation_level = None
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA busy_timeout=30000")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.close()
