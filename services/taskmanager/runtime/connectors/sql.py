"""SQL tables (PostgreSQL, SQLite) as a bounded source and an exactly-once sink.

Source: the table is read on the driver with SQLAlchemy into Arrow and handed to Spark; meant
for bounded jobs over modest tables, not for bulk extraction.

Sink: each (micro-)batch is collected to the driver and written in ONE transaction together
with a `(sink_id, batch_id)` marker row in `_headrace_sink_commits`. Spark may re-run the last
micro-batch after a crash; the marker makes the re-run a no-op, and rows are upserted by key
columns so even a sink without the marker would converge. Timestamps are stored as UTC without
time zone; naive timestamps read back are taken as UTC.
"""

from __future__ import annotations

import datetime as dt
import decimal
from typing import Any, Sequence

import pyarrow as pa
import pyarrow.compute as pc
import sqlalchemy as sa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from . import SinkHandle, flatten_structs

COMMITS_TABLE = "_headrace_sink_commits"


def make_engine(url: str) -> sa.Engine:
    # psycopg 3 is the installed driver; plain postgresql:// URLs would ask for psycopg2.
    if url.startswith("postgresql://") or url.startswith("postgres://"):
        url = "postgresql+psycopg://" + url.split("://", 1)[1]
    return sa.create_engine(url, pool_pre_ping=True)


# ---------------------------------------------------------------- source

def _arrow_type(col_type: sa.types.TypeEngine) -> pa.DataType:
    if isinstance(col_type, sa.Boolean):
        return pa.bool_()
    if isinstance(col_type, sa.Integer):
        return pa.int64()
    if isinstance(col_type, sa.Numeric) and not isinstance(col_type, sa.Float):
        if col_type.precision and col_type.scale is not None and col_type.precision <= 38:
            return pa.decimal128(col_type.precision, col_type.scale)
        return pa.float64()
    if isinstance(col_type, (sa.Float, sa.REAL)):
        return pa.float64()
    if isinstance(col_type, sa.DateTime):
        return pa.timestamp("us", tz="UTC")
    if isinstance(col_type, sa.Date):
        return pa.date32()
    if isinstance(col_type, sa.LargeBinary):
        return pa.binary()
    return pa.string()


def _to_arrow_value(v: Any, typ: pa.DataType) -> Any:
    if v is None:
        return None
    if pa.types.is_timestamp(typ) and isinstance(v, dt.datetime):
        return v.replace(tzinfo=dt.timezone.utc) if v.tzinfo is None else v
    if pa.types.is_timestamp(typ) and isinstance(v, str):  # SQLite without declared type
        t = dt.datetime.fromisoformat(v)
        return t.replace(tzinfo=dt.timezone.utc) if t.tzinfo is None else t
    if pa.types.is_floating(typ) and isinstance(v, decimal.Decimal):
        return float(v)
    if pa.types.is_string(typ) and not isinstance(v, str):
        return str(v)
    return v


def read_table(url: str, table: str, *, columns: Sequence[str] | None = None) -> pa.Table:
    """The whole table (or the given columns) as an Arrow table with a schema from the DB."""
    engine = make_engine(url)
    try:
        tbl = sa.Table(table, sa.MetaData(), autoload_with=engine)
        cols = [tbl.c[c] for c in columns] if columns else list(tbl.columns)
        schema = pa.schema([(c.name, _arrow_type(c.type)) for c in cols])
        with engine.connect() as conn:
            rows = conn.execute(sa.select(*cols)).all()
    finally:
        engine.dispose()
    data = {
        f.name: pa.array([_to_arrow_value(r[k], f.type) for r in rows], type=f.type)
        for k, f in enumerate(schema)
    }
    return pa.table(data, schema=schema)


def table_exists(url: str, table: str) -> bool:
    engine = make_engine(url)
    try:
        return sa.inspect(engine).has_table(table)
    finally:
        engine.dispose()


def sql_source(spark: SparkSession, url: str, table: str, *, columns: Sequence[str] | None = None) -> DataFrame:
    return spark.createDataFrame(read_table(url, table, columns=columns))


# ---------------------------------------------------------------- sink

def _sa_type(t: T.DataType) -> sa.types.TypeEngine:
    if isinstance(t, T.StringType):
        return sa.Text()
    if isinstance(t, T.LongType):
        return sa.BigInteger()
    if isinstance(t, (T.IntegerType, T.ShortType, T.ByteType)):
        return sa.Integer()
    if isinstance(t, (T.DoubleType, T.FloatType)):
        return sa.Float(precision=53)
    if isinstance(t, T.BooleanType):
        return sa.Boolean()
    if isinstance(t, (T.TimestampType, T.TimestampNTZType)):
        return sa.DateTime()
    if isinstance(t, T.DateType):
        return sa.Date()
    if isinstance(t, T.DecimalType):
        return sa.Numeric(t.precision, t.scale)
    if isinstance(t, T.BinaryType):
        return sa.LargeBinary()
    raise TypeError(f"SQL sink cannot store Spark type {t.simpleString()}")


def _commits_table(md: sa.MetaData) -> sa.Table:
    return sa.Table(
        COMMITS_TABLE, md,
        sa.Column("sink_id", sa.String(512), primary_key=True),
        sa.Column("batch_id", sa.BigInteger, primary_key=True),
        sa.Column("num_rows", sa.BigInteger, nullable=False),
        sa.Column("committed_at", sa.DateTime, nullable=False),
    )


def _insert(engine: sa.Engine, table: sa.Table):
    if engine.dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    elif engine.dialect.name == "sqlite":
        from sqlalchemy.dialects.sqlite import insert
    else:
        raise ValueError(f"SQL sink supports PostgreSQL and SQLite, not {engine.dialect.name}")
    return insert(table)


def _plain_rows(table: pa.Table) -> list[dict[str, Any]]:
    # Drop the time zone (values stay UTC): a tz-aware parameter against a `timestamp without
    # time zone` column would be shifted by the DB session's time zone.
    cols = []
    for name, col in zip(table.column_names, table.columns):
        if pa.types.is_timestamp(col.type) and col.type.tz is not None:
            col = pc.cast(col, pa.timestamp(col.type.unit))
        cols.append(col)
    return pa.table(cols, names=table.column_names).to_pylist()


class SqlTableSink:
    """Writes Arrow batches into `table`, idempotently per `(sink_id, batch_id)`.

    Lives on the driver (foreachBatch runs there), so it may hold an engine.
    """

    def __init__(self, url: str, table: str, *, sink_id: str, key_columns: Sequence[str] = (),
                 overwrite: bool = False):
        self.url = url
        self.table_name = table
        self.sink_id = sink_id
        self.key_columns = tuple(key_columns)
        self.overwrite = overwrite
        self._engine: sa.Engine | None = None
        self._table: sa.Table | None = None
        self._commits: sa.Table | None = None
        self._commits_checked = False

    @property
    def engine(self) -> sa.Engine:
        if self._engine is None:
            self._engine = make_engine(self.url)
        return self._engine

    def close(self) -> None:
        if self._engine is not None:
            self._engine.dispose()
            self._engine = None

    def _ensure_tables(self, schema: T.StructType) -> tuple[sa.Table, sa.Table]:
        if self._table is not None and self._commits is not None:
            return self._table, self._commits
        md = sa.MetaData()
        commits = _commits_table(md)
        missing = [k for k in self.key_columns if k not in schema.fieldNames()]
        if missing:
            raise ValueError(f"key columns {missing} are not in the output columns {schema.fieldNames()}")
        sa.Table(
            self.table_name, md,
            *[sa.Column(f.name, _sa_type(f.dataType), primary_key=f.name in self.key_columns,
                        nullable=f.name not in self.key_columns)
              for f in schema.fields],
        )
        _create_all(md, self.engine)
        # An existing table wins over the one we would have created: reflect its real columns.
        self._table = sa.Table(self.table_name, sa.MetaData(), autoload_with=self.engine)
        self._commits = commits
        return self._table, self._commits

    def is_committed(self, batch_id: int) -> bool:
        md = sa.MetaData()
        commits = _commits_table(md)
        if not self._commits_checked:  # once per sink, not per micro-batch
            _create_all(md, self.engine)
            self._commits_checked = True
        with self.engine.connect() as conn:
            hit = conn.execute(
                sa.select(commits.c.batch_id).where(commits.c.sink_id == self.sink_id,
                                                    commits.c.batch_id == batch_id)
            ).first()
        return hit is not None

    def write_arrow(self, data: pa.Table, batch_id: int, schema: T.StructType) -> bool:
        """Write one batch; False when the batch id was already committed (nothing written)."""
        table, commits = self._ensure_tables(schema)
        rows = _plain_rows(data)
        with self.engine.begin() as conn:
            marker = _insert(self.engine, commits).values(
                sink_id=self.sink_id, batch_id=batch_id, num_rows=len(rows),
                committed_at=dt.datetime.now(dt.timezone.utc).replace(tzinfo=None),
            ).on_conflict_do_nothing().returning(commits.c.batch_id)
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
            index_elements=list(self.key_columns),
            set_={c: getattr(stmt.excluded, c) for c in others},
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
) -> SinkHandle:
    sink = SqlTableSink(url, table, sink_id=sink_id, key_columns=key_columns, overwrite=overwrite)

    def configure(writer):
        return writer.foreachBatch(lambda batch_df, batch_id: sink.write_batch(batch_df, batch_id))

    def run_batch() -> None:
        try:
            sink.write_batch(df, 0)
        finally:
            sink.close()

    return SinkHandle(name=name or f"sql-{table}", df=df,
                      output_mode=output_mode if df.isStreaming else "append",
                      trigger=trigger, configure=configure, run_batch=run_batch)


def _create_all(md: sa.MetaData, engine) -> None:
    """CREATE what is missing, tolerating a concurrent creator: two tasks (or two attempts of
    one, during a failover) may check for the same absent table at the same moment, and the
    loser's CREATE fails with "already exists" although the outcome is what it wanted."""
    try:
        md.create_all(engine, checkfirst=True)
    except sa.exc.DBAPIError:
        existing = set(sa.inspect(engine).get_table_names())
        if not all(t.name in existing for t in md.sorted_tables):
            raise
