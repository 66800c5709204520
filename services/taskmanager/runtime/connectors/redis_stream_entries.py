"""The entries of a Redis stream as Headrace's connectors read and write them.

Two formats, accepted by the source and mixed freely in one stream:
  * packed: field `arrow` = an Arrow IPC stream holding many events (what Headrace writes; one
    XADD per ~1000 events makes Redis and decoding cheap),
  * single: field `json` = one JSON object, or a list of them (what outside producers find
    easiest); timestamps as ISO 8601 text or epoch seconds, dates as ISO text.

Entry ids are `<ms>-<seq>`; `parse_id` and `format_id` turn them into comparable pairs and back.
The source (redis_streams.py) reads a batch's entries with `read_entries` and counts what is left
behind it with `entries_after`; the sink packs rows with `pack_events`.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any, Iterable, Iterator, Mapping

import pyarrow as pa
import redis

from . import redis_replies
from .redis_sink_fence import ARROW_FIELD

JSON_FIELD = "json"
_READ_PAGE = 256  # entries per XRANGE round trip
LAG_COUNT_CAP = 256  # entries counted exactly per batch (one page); a larger backlog is estimated


def pack_events(
    records: Iterable[Mapping[str, Any]] | pa.Table | pa.RecordBatch, schema: pa.Schema | None = None
) -> bytes:
    """Events -> the bytes of one packed entry (an Arrow IPC stream)."""
    if isinstance(records, pa.RecordBatch):
        table = pa.Table.from_batches([records])
    elif isinstance(records, pa.Table):
        table = records
    else:
        table = pa.Table.from_pylist(list(records), schema=schema)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    return sink.getvalue().to_pybytes()


def unpack_entry(fields: Mapping[Any, Any], schema: pa.Schema | None = None) -> pa.Table:
    """The events of one stream entry (packed or single JSON) as an Arrow table."""
    f = {(k.decode() if isinstance(k, bytes) else k): v for k, v in fields.items()}
    if ARROW_FIELD in f:
        table = pa.ipc.open_stream(f[ARROW_FIELD]).read_all()
        return conform(table, schema) if schema is not None else table
    if JSON_FIELD in f:
        raw = f[JSON_FIELD]
        obj = json.loads(raw.decode() if isinstance(raw, bytes) else raw)
        rows = obj if isinstance(obj, list) else [obj]
        if schema is None:
            return pa.Table.from_pylist(rows)
        return pa.Table.from_pylist([coerce_json(r, schema) for r in rows], schema=schema)
    raise ValueError(f"stream entry has neither an `{ARROW_FIELD}` nor a `{JSON_FIELD}` field: {sorted(f)}")


def parse_time(v: Any) -> Any:
    if isinstance(v, str):
        t = dt.datetime.fromisoformat(v.replace("Z", "+00:00"))
        return t if t.tzinfo else t.replace(tzinfo=dt.timezone.utc)
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return dt.datetime.fromtimestamp(v, tz=dt.timezone.utc)  # epoch seconds
    return v


def coerce_json(row: Mapping[str, Any], schema: pa.Schema) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for field in schema:
        v = row.get(field.name)
        if v is not None:
            if pa.types.is_timestamp(field.type):
                v = parse_time(v)
            elif pa.types.is_date(field.type) and isinstance(v, str):
                v = dt.date.fromisoformat(v)
        out[field.name] = v
    return out


def conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """Select and cast columns to `schema`; absent columns become nulls."""
    cols = []
    for field in schema:
        if field.name in table.column_names:
            col = table.column(field.name)
            cols.append(col if col.type == field.type else col.cast(field.type))
        else:
            cols.append(pa.nulls(table.num_rows, type=field.type))
    return pa.table(cols, schema=schema)


def parse_id(entry_id: str | bytes) -> tuple[int, int]:
    s = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    ms, _, seq = s.partition("-")
    return int(ms), int(seq or 0)


def format_id(i: tuple[int, int]) -> str:
    return f"{i[0]}-{i[1]}"


def entries_after(
    client: redis.Redis, stream: str, after: str, last: str | None = None, cap: int = LAG_COUNT_CAP
) -> int:
    """How many entries of `stream` have an id above `after`: exact up to `cap`, estimated above
    it (XLEN times the share of the stream's time span after `after`)."""
    if last is not None and parse_id(after) >= parse_id(last):
        return 0
    counted = redis_replies.count_after(client, stream, after, cap)
    if counted < cap:
        return counted
    length = client.xlen(stream)
    first = redis_replies.entries(client, stream, "-", "+", count=1)
    newest = [] if last else redis_replies.newest_entries(client, stream, "+", "-", count=1)
    last_id = last or (newest[0][0] if newest else b"0-0")
    t_first, t_after, t_last = parse_id(first[0][0])[0] if first else 0, parse_id(after)[0], parse_id(last_id)[0]
    share = (t_last - t_after) / (t_last - t_first) if t_last > t_first else 1.0
    return max(cap, min(length, int(length * share)))


def read_entries(
    client: redis.Redis, stream: str, after: str, until: str, schema: pa.Schema
) -> Iterator[pa.RecordBatch]:
    """Record batches of the entries `after < id <= until`, conformed to `schema`."""
    cursor = after
    pending_json: list[dict[str, Any]] = []

    def flush_json() -> Iterator[pa.RecordBatch]:
        if pending_json:
            yield from pa.Table.from_pylist(pending_json, schema=schema).to_batches()
            pending_json.clear()

    while True:
        entries = redis_replies.entries(client, stream, "(" + cursor, until, count=_READ_PAGE)
        for entry_id, fields in entries:
            if ARROW_FIELD.encode() in fields:
                yield from flush_json()
                yield from unpack_entry(fields, schema).to_batches()
            else:
                raw = fields.get(JSON_FIELD.encode())
                if raw is None:
                    raise ValueError(f"entry {entry_id!r} of {stream} has neither `arrow` nor `json`")
                obj = json.loads(raw)
                for r in obj if isinstance(obj, list) else [obj]:
                    pending_json.append(coerce_json(r, schema))
                if len(pending_json) >= 4096:
                    yield from flush_json()
        if len(entries) < _READ_PAGE:
            break
        cursor = entries[-1][0].decode()
        if parse_id(cursor) >= parse_id(until):
            break
    yield from flush_json()
