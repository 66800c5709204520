"""The SQLAlchemy engines of the SQL connectors (sql.py, sql_source.py): the PostgreSQL driver,
timeouts that let a sink notice a database that stopped answering, and SQLite's locking for the
sink."""

from __future__ import annotations

import sqlalchemy as sa

# libpq's connection parameters for a server that stops answering without closing its
# connections (a partition, a frozen host): without them a connect waits for the OS's TCP
# timeout (minutes) and a statement on a dead connection forever, so a sink could never count
# its outage against its retry bound (sql_retry.py). A URL's own values win.
PG_TIMEOUTS = {
    "connect_timeout": 10,
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
}


def make_engine(url: str) -> sa.Engine:
    # psycopg 3 is the installed driver; plain postgresql:// URLs would ask for psycopg2.
    if url.startswith("postgresql://") or url.startswith("postgres://"):
        url = "postgresql+psycopg://" + url.split("://", 1)[1]
    parsed = sa.engine.make_url(url)
    if parsed.get_backend_name() == "postgresql":
        timeouts = {k: v for k, v in PG_TIMEOUTS.items() if k not in parsed.query}
        return sa.create_engine(parsed, pool_pre_ping=True, connect_args=timeouts)
    return sa.create_engine(parsed, pool_pre_ping=True)


def sink_engine(url: str) -> sa.Engine:
    engine = make_engine(url)
    if engine.dialect.name == "sqlite":
        # Every sink transaction takes SQLite's write lock at BEGIN: a prepare and a batch then
        # run one after the other, like the row locks do on PostgreSQL, and a transaction that
        # reads first never has to upgrade its lock (an upgrade between two writers fails at
        # once with "database is locked" instead of waiting).
        @sa.event.listens_for(engine, "connect")
        def _driver_does_not_begin(dbapi_conn, _record):
            dbapi_conn.isolation_level = None

        @sa.event.listens_for(engine, "begin")
        def _begin_immediate(conn):
            conn.exec_driver_sql("BEGIN IMMEDIATE")

    return engine
