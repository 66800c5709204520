"""SQL tables (PostgreSQL, SQLite) as a bounded source.

The table is read on the driver with SQLAlchemy into Arrow and handed to Spark; meant for bounded
jobs over modest tables, not for bulk extraction. The SQL sink's bookkeeping columns
(`_headrace_sink`, `_headrace_batch`: sql_tables.py) are left out unless asked for by name.
Naive timestamps read back are taken as UTC, as the sink (sql.py) stores them.
"""

from __future__ import annotations

import datetime as dt
import decimal
from typing import Any, Sequence

import pyarrow as pa
import sqlalchemy as sa
from pyspark.sql import DataFrame, SparkSession

from .sql_engine import make_engine
from .sql_tables import LINEAGE_COLUMNS


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
        cols = [tbl.c[c] for c in columns] if columns else [c for c in tbl.columns if c.name not in LINEAGE_COLUMNS]
        schema = pa.schema([(c.name, _arrow_type(c.type)) for c in cols])
        with engine.connect() as conn:
            rows = conn.execute(sa.select(*cols)).all()
    finally:
        engine.dispose()
    data = {f.name: pa.array([_to_arrow_value(r[k], f.type) for r in rows], type=f.type) for k, f in enumerate(schema)}
    return pa.table(data, schema=schema)


def table_exists(url: str, table: str) -> bool:
    engine = make_engine(url)
    try:
        return sa.inspect(engine).has_table(table)
    finally:
        engine.dispose()


def sql_source(spark: SparkSession, url: str, table: str, *, columns: Sequence[str] | None = None) -> DataFrame:
    return spark.createDataFrame(read_table(url, table, columns=columns))
