"""The tables of the SQL sink (sql.py), beside its owners' (sql_owners.py).

`_headrace_sink_commits` holds a marker row per committed (sink id, batch id), `_headrace_sink_fences`
a row per sink id naming the attempt that holds it. A table the sink creates gets a column per
output column (`sa_type`: Spark's type to SQL's) with the key columns as its primary key; a keyless
one also gets the lineage columns `_headrace_sink` and `_headrace_batch`, indexed together, so that
a rewind can delete a discarded batch's rows. `create_all` creates what is missing while another
writer may be creating the same tables.
"""

from __future__ import annotations

import hashlib

import sqlalchemy as sa
from pyspark.sql import types as T

COMMITS_TABLE = "_headrace_sink_commits"
FENCES_TABLE = "_headrace_sink_fences"
LINEAGE_SINK = "_headrace_sink"
LINEAGE_BATCH = "_headrace_batch"
LINEAGE_COLUMNS = (LINEAGE_SINK, LINEAGE_BATCH)


def sa_type(t: T.DataType) -> sa.types.TypeEngine:
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


def commits_table(md: sa.MetaData) -> sa.Table:
    return sa.Table(
        COMMITS_TABLE,
        md,
        sa.Column("sink_id", sa.String(512), primary_key=True),
        sa.Column("batch_id", sa.BigInteger, primary_key=True),
        sa.Column("num_rows", sa.BigInteger, nullable=False),
        sa.Column("committed_at", sa.DateTime, nullable=False),
    )


def fences_table(md: sa.MetaData) -> sa.Table:
    return sa.Table(
        FENCES_TABLE,
        md,
        sa.Column("sink_id", sa.String(512), primary_key=True),
        sa.Column("attempt", sa.BigInteger, nullable=False),
        sa.Column("restored_batch_id", sa.BigInteger, nullable=False),
        sa.Column("fenced_at", sa.DateTime, nullable=False),
    )


def lineage_index_name(table: str) -> str:
    # PostgreSQL truncates identifiers at 63 bytes; a digest keeps long table names distinct.
    return f"ix_headrace_lineage_{hashlib.sha1(table.encode()).hexdigest()[:16]}"


def create_all(md: sa.MetaData, engine) -> None:
    """CREATE what is missing, tolerating a concurrent creator: two tasks (or two attempts of
    one, during a failover) may check for the same absent table at the same moment, and the
    loser's CREATE fails with "already exists" although the outcome is what it wanted."""
    try:
        md.create_all(engine, checkfirst=True)
    except sa.exc.DBAPIError:
        existing = set(sa.inspect(engine).get_table_names())
        if not all(t.name in existing for t in md.sorted_tables):
            raise
