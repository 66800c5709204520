"""Whether a pipeline's rows fit a Delta table, said before anything is written.

Delta refuses a write whose schema does not fit the table with a long dump of both schemas; the
sink checks first (when an attempt takes the table over, and again when Delta refuses a batch)
and fails with the columns at fault: columns the table lacks (accepted with the writer option
`mergeSchema`, which adds them), columns of another type (never accepted: a new table, or an
ALTER TABLE by hand), and NOT NULL columns the rows lack. Columns the rows lack that may be
null are fine: Delta writes null. Names compare case-insensitively, as Delta does.
"""

from __future__ import annotations

import json
from typing import Any

from .delta_errors import RUNBOOK, DeltaSchemaMismatch


def _fields(schema: Any) -> dict[str, tuple[str, str, bool]]:
    """lower-cased name -> (name, type, nullable) of a StructType or its JSON."""
    if isinstance(schema, str):
        schema = json.loads(schema)
    if isinstance(schema, dict):
        from pyspark.sql.types import StructType

        schema = StructType.fromJson(schema)
    return {f.name.lower(): (f.name, f.dataType.simpleString(), f.nullable) for f in schema.fields}


def _is_struct_growth(table_type: str, row_type: str) -> bool:
    """A struct (or array/map of structs) whose row type only adds fields: mergeSchema takes it."""
    return (
        table_type.startswith(("struct<", "array<struct<", "map<"))
        and row_type != table_type
        and row_type.split("<", 1)[0] == table_type.split("<", 1)[0]
    )


def check(path: str, table_schema: Any, rows: Any, *, merge_schema: bool) -> None:
    """Raise DeltaSchemaMismatch unless rows of schema `rows` can be written to the table."""
    table, mine = _fields(table_schema), _fields(rows)
    extra = [f"{n} ({t})" for k, (n, t, _) in mine.items() if k not in table]
    retyped = [
        f"{n} (table: {table[k][1]}, rows: {t})"
        for k, (n, t, _) in mine.items()
        if k in table and t != table[k][1] and not (merge_schema and _is_struct_growth(table[k][1], t))
    ]
    required = [f"{n} ({t}, NOT NULL)" for k, (n, t, nullable) in table.items() if k not in mine and not nullable]
    problems = []
    if extra and not merge_schema:
        problems.append(
            "columns the table does not have: " + ", ".join(extra) + " (the sink option "
            "options={'mergeSchema': 'true'} adds them to the table)"
        )
    if retyped:
        problems.append(
            "columns of another type: " + ", ".join(retyped) + " (cast them in the pipeline, or "
            "write to a new table: Delta does not change a column's type on a write)"
        )
    if required:
        problems.append("NOT NULL columns the rows lack: " + ", ".join(required))
    if problems:
        columns = tuple(p.split(" (")[0] for p in extra + retyped + required)
        raise DeltaSchemaMismatch(
            f"the rows of this pipeline do not fit the Delta table {path}: "
            + "; ".join(problems)
            + f'. Nothing was written ({RUNBOOK}, "Schema mismatch")',
            columns,
        )


def is_schema_refusal(exc: BaseException) -> bool:
    """Whether a failed write is Delta refusing the batch's schema."""
    text = str(exc)
    return any(
        code in text
        for code in (
            "DELTA_METADATA_MISMATCH",
            "DELTA_FAILED_TO_MERGE_FIELDS",
            "DELTA_SCHEMA_CHANGED",
            "DELTA_MERGE_INCOMPATIBLE_DATATYPE",
            "DELTA_NOT_NULL_CONSTRAINT_VIOLATED",
        )
    )
