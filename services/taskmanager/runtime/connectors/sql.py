"""SQL tables (PostgreSQL, SQLite) as an exactly-once sink; sql_source.py reads them as a bounded
source, sql_tables.py defines the tables the sink writes besides the pipeline's.

Each (micro-)batch is collected to the driver and written in ONE transaction together
with a `(sink_id, batch_id)` marker row in `_headrace_sink_commits`. Spark may re-run the last
micro-batch after a crash; the marker makes the re-run a no-op, and rows are upserted by key
columns so even a sink without the marker would converge. Timestamps are stored as UTC without
time zone.

Attempt fencing (streaming, after `SinkHandle.prepare(attempt, r)`): the row of the sink in
`_headrace_sink_fences` names the attempt holding it. `prepare`, in one transaction with that
row locked, refuses if a newer attempt holds it, takes it over and deletes the markers of
batches > r: those batches belonged to the discarded lineage and the new attempt re-runs them,
possibly with other contents. Every batch re-reads the fence row (FOR SHARE) inside its own
transaction and raises `SinkFencedError` unless it still names its attempt, so a batch of a
replaced attempt never commits, and a prepare waits for a batch in flight to finish (one left
open by a frozen driver is ended: sql_stale_writers.py). Given the
attempt's `SinkOwner`, `prepare` also refuses a sink id that another lineage owns
(`_headrace_sink_owners`, sql_owners.py) before it changes anything.

Undoing the discarded batches' rows:
  * with key columns (upsert), nothing more is needed: the new lineage re-emits every key the
    discarded batches touched, and its upserts overwrite them;
  * without key columns (plain inserts), a table the sink creates gets two bookkeeping columns,
    `_headrace_sink` and `_headrace_batch` (indexed together), and `prepare` deletes that
    sink's rows of batches > r in the same transaction. An existing keyless table without those
    columns cannot be rewound: `prepare` then refuses with an error saying how to fix it
    (instead of duplicating rows), but only when there actually are batches to undo.

Database outages: every step that touches the database (prepare, a batch's check and its
transaction) waits out an unreachable database with bounded retries, which the steps above make
idempotent (sql_retry.py; `sink.max-retry-time`, default 60 s), so an outage shorter than the
bound costs no task restart.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, Callable, Sequence

import pyarrow as pa
import pyarrow.compute as pc
import sqlalchemy as sa
from pyspark.sql import DataFrame
from pyspark.sql import types as T

from . import SinkFencedError, SinkHandle, flatten_structs, sql_owners, sql_stale_writers
from .ownership import SinkOwner
from .sql_engine import sink_engine
from .sql_retry import Retrier, RetryPolicy, describe_database
from .sql_tables import (
    FENCES_TABLE,
    LINEAGE_BATCH,
    LINEAGE_COLUMNS,
    LINEAGE_SINK,
    commits_table,
    create_all,
    fences_table,
    lineage_index_name,
    sa_type,
)


def _insert(engine: sa.Engine, table: sa.Table):
    if engine.dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as postgresql_insert

        return postgresql_insert(table)
    if engine.dialect.name == "sqlite":
        from sqlalchemy.dialects.sqlite import insert as sqlite_insert

        return sqlite_insert(table)
    raise ValueError(f"SQL sink supports PostgreSQL and SQLite, not {engine.dialect.name}")


def warm_drivers() -> None:
    """Import both dialects and the PostgreSQL driver, and compile one upsert of each, without
    connecting anywhere: a warm Spark driver does this so that a task's first batch does not
    (services/taskmanager/runtime/warm_up.py)."""
    import psycopg  # noqa: F401
    from sqlalchemy.dialects import postgresql, sqlite

    table = sa.Table("warm", sa.MetaData(), sa.Column("k", sa.String, primary_key=True), sa.Column("v", sa.BigInteger))
    for dialect, module in ((postgresql.dialect(), postgresql), (sqlite.dialect(), sqlite)):
        stmt = module.insert(table)
        stmt.on_conflict_do_update(index_elements=["k"], set_={"v": stmt.excluded.v}).compile(dialect=dialect)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)


def _plain_rows(table: pa.Table) -> list[dict[str, Any]]:
    # Drop the time zone (values stay UTC): a tz-aware parameter against a `timestamp without
    # time zone` column would be shifted by the DB session's time zone.
    cols = []
    for col in table.columns:
        if pa.types.is_timestamp(col.type) and col.type.tz is not None:
            col = pc.cast(col, pa.timestamp(col.type.unit))
        cols.append(col)
    return pa.table(cols, names=table.column_names).to_pylist()


class SqlTableSink:
    """Writes Arrow batches into `table`, idempotently per `(sink_id, batch_id)`, fenced by
    attempt once `prepare` was called.

    Lives on the driver (foreachBatch runs there), so it may hold an engine.
    """

    def __init__(
        self,
        url: str,
        table: str,
        *,
        sink_id: str,
        key_columns: Sequence[str] = (),
        overwrite: bool = False,
        retry: RetryPolicy | None = None,
        on_wait: Callable[[str | None], None] | None = None,
    ):
        self.url = url
        self.table_name = table
        self.sink_id = sink_id
        self.key_columns = tuple(key_columns)
        self.overwrite = overwrite
        self.attempt: int | None = None  # the fencing attempt, once prepared
        self._engine: sa.Engine | None = None
        self._table: sa.Table | None = None
        self._lineage = False  # the table has the keyless bookkeeping columns
        md = sa.MetaData()
        self._commits = commits_table(md)
        self._fences = fences_table(md)
        self._owners = sql_owners.owners_table(md)
        self._bookkeeping_md = md
        self._bookkeeping_checked = False
        # Every step that touches the database waits out an outage of it (sql_retry.py).
        self.retrier = Retrier(
            retry or RetryPolicy(), sink_id=sink_id, database=describe_database(url), on_wait=on_wait
        )

    @property
    def engine(self) -> sa.Engine:
        if self._engine is None:
            self._engine = sink_engine(self.url)
        return self._engine

    def close(self) -> None:
        if self._engine is not None:
            self._engine.dispose()
            self._engine = None

    def _ensure_bookkeeping(self) -> None:
        if not self._bookkeeping_checked:  # once per sink, not per micro-batch
            create_all(self._bookkeeping_md, self.engine)
            self._bookkeeping_checked = True

    def _ensure_tables(self, schema: T.StructType) -> sa.Table:
        if self._table is not None:
            return self._table
        self._ensure_bookkeeping()
        missing = [k for k in self.key_columns if k not in schema.fieldNames()]
        if missing:
            raise ValueError(f"key columns {missing} are not in the output columns {schema.fieldNames()}")
        md = sa.MetaData()
        columns: list[Any] = [
            sa.Column(
                f.name,
                sa_type(f.dataType),
                primary_key=f.name in self.key_columns,
                nullable=f.name not in self.key_columns,
            )
            for f in schema.fields
        ]
        if not self.key_columns:
            columns += [
                sa.Column(LINEAGE_SINK, sa.String(512)),
                sa.Column(LINEAGE_BATCH, sa.BigInteger),
                sa.Index(lineage_index_name(self.table_name), LINEAGE_SINK, LINEAGE_BATCH),
            ]
        sa.Table(self.table_name, md, *columns)
        create_all(md, self.engine)
        # An existing table wins over the one we would have created: reflect its real columns.
        self._table = sa.Table(self.table_name, sa.MetaData(), autoload_with=self.engine)
        self._lineage = not self.key_columns and all(c in self._table.c for c in LINEAGE_COLUMNS)
        return self._table

    # -- fencing

    def prepare(self, attempt: int, restored_batch_id: int, owner: SinkOwner | None = None) -> None:
        """Take the sink over for `attempt`, restored at Spark batch `restored_batch_id`; undo
        the batches after it (see the module docstring). Raises `SinkOwnedError` if another
        lineage than `owner`'s owns the sink id, `SinkFencedError` if a newer attempt holds it,
        ValueError if a keyless table cannot be rewound."""
        # Set first: after a failed prepare the sink must refuse to write, not write unfenced.
        self.attempt = attempt
        self.retrier.run(f"preparing attempt {attempt}", lambda: self._prepare_once(attempt, restored_batch_id, owner))

    def _prepare_once(self, attempt: int, restored_batch_id: int, owner: SinkOwner | None) -> None:
        """Take the fence: a replaced attempt's transaction left open is ended (sql_stale_writers.py)."""
        sql_stale_writers.take_fence(
            self.engine,
            self.sink_id,
            attempt,
            self.retrier,
            lambda: self._prepare_locked(attempt, restored_batch_id, owner),
            fences_table=FENCES_TABLE,
        )

    def _prepare_locked(self, attempt: int, restored_batch_id: int, owner: SinkOwner | None) -> None:
        self._ensure_bookkeeping()
        fences, commits = self._fences, self._commits
        r = restored_batch_id
        table_exists, lineage = self._reflect_for_rewind()
        with self.engine.begin() as conn:
            sql_stale_writers.limit_lock_wait(conn)
            sql_stale_writers.name_transaction(conn, self.sink_id, attempt)  # a frozen prepare is ended too
            # Insert-if-absent, then lock: two first prepares cannot both see "no fence yet".
            conn.execute(
                _insert(self.engine, fences)
                .values(sink_id=self.sink_id, attempt=attempt, restored_batch_id=r, fenced_at=_now())
                .on_conflict_do_nothing()
            )
            holder = conn.execute(
                sa.select(fences.c.attempt).where(fences.c.sink_id == self.sink_id).with_for_update()
            ).scalar_one()
            if owner is not None:  # before the fence: another lineage's token means nothing here
                sql_owners.claim(
                    conn,
                    self._owners,
                    commits,
                    sink_id=self.sink_id,
                    table=self.table_name,
                    owner=owner,
                    restored_batch_id=r,
                    fences_table=FENCES_TABLE,
                )
            if holder > attempt:
                raise SinkFencedError(self.sink_id, attempt, holder)
            discarded = (
                conn.execute(
                    sa.select(commits.c.batch_id)
                    .where(commits.c.sink_id == self.sink_id, commits.c.batch_id > r)
                    .order_by(commits.c.batch_id)
                )
                .scalars()
                .all()
            )
            if discarded and not self.key_columns:
                if lineage is not None:
                    conn.execute(
                        lineage.delete().where(lineage.c[LINEAGE_SINK] == self.sink_id, lineage.c[LINEAGE_BATCH] > r)
                    )
                elif table_exists:
                    raise ValueError(
                        f"SQL sink {self.sink_id}: attempt {attempt} restarts after batch {r}, but "
                        f"batches {discarded[0]}..{discarded[-1]} of the discarded run are already "
                        f"in table {self.table_name}, which has no key columns and no "
                        f"{LINEAGE_SINK}/{LINEAGE_BATCH} columns, so their rows cannot be told "
                        f"apart and re-running them would duplicate rows. Fix: give the sink "
                        f"key_columns (upsert), or let the sink create the table (it adds those "
                        f"columns), or add them (ALTER TABLE {self.table_name} ADD COLUMN "
                        f"{LINEAGE_SINK} VARCHAR(512); ALTER TABLE {self.table_name} ADD COLUMN "
                        f"{LINEAGE_BATCH} BIGINT) and restart: from then on the sink tags its rows "
                        f"and can undo them, but the rows already written are untagged, so remove "
                        f"those of batches {discarded[0]}..{discarded[-1]} by hand or they stay twice."
                    )
            conn.execute(commits.delete().where(commits.c.sink_id == self.sink_id, commits.c.batch_id > r))
            conn.execute(
                fences.update()
                .where(fences.c.sink_id == self.sink_id)
                .values(attempt=attempt, restored_batch_id=r, fenced_at=_now())
            )

    def _reflect_for_rewind(self) -> tuple[bool, sa.Table | None]:
        """(does the table exist, the table if it has the keyless bookkeeping columns)."""
        if self.key_columns or not sa.inspect(self.engine).has_table(self.table_name):
            return False, None
        table = sa.Table(self.table_name, sa.MetaData(), autoload_with=self.engine)
        return True, table if all(c in table.c for c in LINEAGE_COLUMNS) else None

    def _check_fence(self, conn: sa.Connection, *, lock: bool) -> None:
        """Raise SinkFencedError unless this (prepared) attempt still holds the sink. With
        `lock`, the fence row stays share-locked until the caller's transaction ends, so no
        prepare can take the sink over between this check and the batch's commit."""
        if self.attempt is None:
            return
        query = sa.select(self._fences.c.attempt).where(self._fences.c.sink_id == self.sink_id)
        holder = conn.execute(query.with_for_update(read=True) if lock else query).scalar_one_or_none()
        if holder != self.attempt:
            raise SinkFencedError(self.sink_id, self.attempt, holder)

    # -- writing

    def is_committed(self, batch_id: int) -> bool:
        """Whether the batch id is already committed; raises SinkFencedError if fenced off."""
        return self.retrier.run(f"checking batch {batch_id}", lambda: self._is_committed_once(batch_id))

    def _is_committed_once(self, batch_id: int) -> bool:
        self._ensure_bookkeeping()
        commits = self._commits
        with self.engine.connect() as conn:
            self._check_fence(conn, lock=False)
            hit = conn.execute(
                sa.select(commits.c.batch_id).where(commits.c.sink_id == self.sink_id, commits.c.batch_id == batch_id)
            ).first()
        return hit is not None

    def write_arrow(self, data: pa.Table, batch_id: int, schema: T.StructType) -> bool:
        """Write one batch; False when the batch id was already committed (nothing written).
        Raises SinkFencedError (nothing written) if a newer attempt holds the sink."""
        rows = _plain_rows(data)
        return self.retrier.run(f"writing batch {batch_id}", lambda: self._write_once(rows, batch_id, schema))

    def _write_once(self, rows: list[dict[str, Any]], batch_id: int, schema: T.StructType) -> bool:
        """One try of a batch's transaction: all of it or nothing, so it may be tried again."""
        table = self._ensure_tables(schema)
        commits = self._commits
        if self._lineage:
            for row in rows:
                row[LINEAGE_SINK] = self.sink_id
                row[LINEAGE_BATCH] = batch_id
        with self.engine.begin() as conn:
            sql_stale_writers.name_transaction(conn, self.sink_id, self.attempt)
            self._check_fence(conn, lock=True)
            marker = (
                _insert(self.engine, commits)
                .values(sink_id=self.sink_id, batch_id=batch_id, num_rows=len(rows), committed_at=_now())
                .on_conflict_do_nothing()
                .returning(commits.c.batch_id)
            )
            # The marker insert takes the row lock first, so a concurrent attempt of the same
            # batch waits here and then sees the conflict instead of writing twice. RETURNING,
            # not rowcount: psycopg reports -1 for a conflicting insert.
            if conn.execute(marker).first() is None:
                return False
            if self.overwrite:
                conn.execute(table.delete())
            if rows:
                conn.execute(self._upsert(table), rows)
        return True

    def _upsert(self, table: sa.Table):
        stmt = _insert(self.engine, table)
        if not self.key_columns:
            return stmt
        others = [c.name for c in table.columns if c.name not in self.key_columns]
        if not others:
            return stmt.on_conflict_do_nothing(index_elements=list(self.key_columns))
        return stmt.on_conflict_do_update(
            index_elements=list(self.key_columns), set_={c: getattr(stmt.excluded, c) for c in others}
        )

    def write_batch(self, df: DataFrame, batch_id: int) -> bool:
        """foreachBatch entry point; also used once (batch id 0) for bounded DataFrames."""
        flat = flatten_structs(df)
        if self.is_committed(batch_id):
            # Pitfall: a foreachBatch that does not evaluate its DataFrame fails the query with
            # STATE_STORE_COMMIT_VALIDATION_FAILED, so the skip path still runs it into `noop`.
            flat.write.format("noop").mode("overwrite").save()
            return False
        return self.write_arrow(flat.toArrow(), batch_id, flat.schema)


def sql_sink(
    df: DataFrame,
    url: str,
    table: str,
    *,
    sink_id: str,
    key_columns: Sequence[str] = (),
    output_mode: str = "update",
    overwrite: bool = False,
    trigger: str | None = None,
    name: str | None = None,
    retry: RetryPolicy | None = None,
    on_wait: Callable[[str | None], None] | None = None,
) -> SinkHandle:
    """`retry`: how long a batch waits for an unreachable database (sql_retry.py; default 60 s);
    `on_wait(reason or None)` hears when it starts and stops waiting."""
    sink = SqlTableSink(
        url, table, sink_id=sink_id, key_columns=key_columns, overwrite=overwrite, retry=retry, on_wait=on_wait
    )

    def configure(writer):
        return writer.foreachBatch(lambda batch_df, batch_id: sink.write_batch(batch_df, batch_id))

    def run_batch() -> None:
        try:
            sink.write_batch(df, 0)
        finally:
            sink.close()

    return SinkHandle(
        name=name or f"sql-{table}",
        df=df,
        output_mode=output_mode if df.isStreaming else "append",
        trigger=trigger,
        configure=configure,
        run_batch=run_batch,
        on_prepare=sink.prepare,
    )
