"""Redis Streams as a replayable source and an exactly-once sink (Python Data Source API).

Entry formats (both accepted by the source, mixed freely in one stream):
  * packed: field `arrow` = an Arrow IPC stream holding many events (what Headrace writes; one
    XADD per ~1000 events makes Redis and decoding cheap),
  * single: field `json` = one JSON object (what outside producers find easiest).

Source offsets are stream entry ids `{"id": "<ms>-<seq>"}`: the checkpoint can replay any batch
as long as the stream still holds its entries. `max_entries_per_trigger` limits ENTRIES (not
events) per micro-batch, since counting events would mean decoding every entry at planning time.

Source lag: after planning a batch the reader counts the entries the stream holds beyond the
batch's end and reports them in its latest offset (`{"id": <last id>, "entriesBehind": n}`,
Spark's reportLatestOffset), where the driver reads them for `source_lag` (the Python Data Source
API has no source metrics). Counted exactly on the server up to LAG_COUNT_CAP entries, above
that estimated from the ids' times and XLEN; 0 at once when the batch ends at the last entry.
The cap is small on purpose: counting walks the entries inside Redis, payloads and all (a packed
entry is ~30 KB), and blocks every other client meanwhile: 10,000 packed entries took 0.65 s
per planned batch, which halved a backlogged query's throughput (docs/benchmarks.md).

Sink: executors pack their rows into IPC entries and return them as commit messages; the
driver-side `commit(messages, batch_id)` XADDs them in one server-side script together with the
sink's last-committed batch id (`headrace:sink:<id>:last_batch`), and skips a batch id at or
below it. A re-executed micro-batch thus never writes twice, and a crash can never leave half a
batch in the stream. The script also records the entry ids each batch added
(`headrace:sink:<id>:batches`, batch id -> ids, the last 100,000 batches kept).

Attempt fencing (streaming, after `SinkHandle.prepare(attempt, r)`): `headrace:sink:<id>:attempt`
names the attempt holding the sink. `prepare` (one script, so atomic) refuses if it names a newer
attempt, sets it, XDELs the entries of every batch after r (the discarded lineage; the new
attempt re-runs those batches, possibly with other contents) and resets the last batch to r.
Each commit checks the fence in the same script as its XADDs and raises `SinkFencedError` unless
it still names its attempt. Readers that consumed the deleted entries before the prepare have
seen them: a stream cannot take back what was read, so consumers that must not see a discarded
batch should read with some delay, or key their effects so that the re-run overwrites them.
The scripts, the keys and the sink's owner record (a prepare refuses a sink id another lineage
owns) are in redis_sink_fence.py.
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Mapping, Sequence

import pyarrow as pa
import redis
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows
from pyspark.sql.types import StructType

from . import redis_replies
from .ownership import SinkOwner
from .redis_sink_fence import (  # noqa: F401 - the sink's fence protocol, re-exported
    ARROW_FIELD,
    RETAINED_BATCH_RECORDS,
    batches_key,
    commit_entries,
    committed_key,
    fence_key,
    owner_key,
    prepare_sink,
)
from .sinks import SinkHandle

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

JSON_FIELD = "json"
DEFAULT_ROWS_PER_ENTRY = 1000
_MAX_SEQ = 18446744073709551615  # largest sequence number of a stream id
_READ_PAGE = 256  # entries per XRANGE round trip
BEHIND_KEY = "entriesBehind"  # in the reported latest offset: entries beyond the planned batch
LAG_COUNT_CAP = 256  # entries counted exactly per batch (one page); a larger backlog is estimated
# A batch is read in at most one partition per this many entries: every partition costs a task
# and a Python worker round trip, which for a trickle of single events is most of the read
# (docs/benchmarks.md, "Where a small micro-batch's time goes").
SPLIT_MIN_ENTRIES = 16


# ---------------------------------------------------------------- packing helpers


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
        return pa.Table.from_pylist([_coerce_json(r, schema) for r in rows], schema=schema)
    raise ValueError(f"stream entry has neither an `{ARROW_FIELD}` nor a `{JSON_FIELD}` field: {sorted(f)}")


def _parse_time(v: Any) -> Any:
    if isinstance(v, str):
        t = dt.datetime.fromisoformat(v.replace("Z", "+00:00"))
        return t if t.tzinfo else t.replace(tzinfo=dt.timezone.utc)
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return dt.datetime.fromtimestamp(v, tz=dt.timezone.utc)  # epoch seconds
    return v


def _coerce_json(row: Mapping[str, Any], schema: pa.Schema) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for field in schema:
        v = row.get(field.name)
        if v is not None:
            if pa.types.is_timestamp(field.type):
                v = _parse_time(v)
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


# ---------------------------------------------------------------- ids and options


def parse_id(entry_id: str | bytes) -> tuple[int, int]:
    s = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    ms, _, seq = s.partition("-")
    return int(ms), int(seq or 0)


def _fmt(i: tuple[int, int]) -> str:
    return f"{i[0]}-{i[1]}"


class _Options:
    def __init__(self, options: Mapping[str, str]):
        o = {k.lower(): v for k, v in options.items()}
        self.url = o.get("url", "redis://127.0.0.1:6379/0")
        if not o.get("stream"):
            raise ValueError("redis_stream: the `stream` option is required")
        self.stream: str = o["stream"]
        me = o.get("max_entries_per_trigger")
        self.max_entries: int | None = int(me) if me else None
        self.start = o.get("start", "0")
        self.partitions = max(1, int(o.get("partitions", 1)))
        self.rows_per_entry = int(o.get("rows_per_entry", DEFAULT_ROWS_PER_ENTRY))
        ml = o.get("maxlen")
        self.maxlen: int | None = int(ml) if ml else None
        self.sink_id = o.get("sink_id") or f"stream:{self.stream}"
        # Set by the sink handle's prepare (options reach the commit's Python worker pickled).
        att = o.get("attempt")
        self.attempt: int | None = int(att) if att not in (None, "") else None


class _LazyClient:
    """Holds a Redis client that is created on first use and never pickled (pitfall 2)."""

    _client: redis.Redis | None = None
    opts: _Options

    @property
    def client(self) -> redis.Redis:
        if self._client is None:
            self._client = redis.Redis.from_url(self.opts.url)
        return self._client

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state.pop("_client", None)
        return state


# ---------------------------------------------------------------- source


class _IdRange(InputPartition):
    """Entries with `after < id <= until`."""

    def __init__(self, after: str, until: str):
        super().__init__((after, until))
        self.after = after
        self.until = until


def split_id_range(after: str, until: str, parts: int) -> list[_IdRange]:
    """Split by the millisecond part of the ids: cheap (no reads) though possibly uneven."""
    a, u = parse_id(after), parse_id(until)
    if a >= u:
        return []
    span = u[0] - a[0]
    parts = max(1, min(parts, span + 1))
    bounds = [after]
    for k in range(1, parts):
        bounds.append(_fmt((a[0] + span * k // parts, _MAX_SEQ)))
    bounds.append(until)
    out = []
    for lo, hi in itertools.pairwise(bounds):
        if parse_id(lo) < parse_id(hi):
            out.append(_IdRange(lo, hi))
    return out


class _StreamReader(_LazyClient, DataSourceStreamReader):
    def __init__(self, opts: _Options, schema: StructType):
        self.opts = opts
        self.arrow_schema = to_arrow_schema(schema, timezone="UTC")

    def _last_id(self) -> str:
        last = redis_replies.newest_entries(self.client, self.opts.stream, "+", "-", count=1)
        return last[0][0].decode() if last else "0-0"

    def initialOffset(self) -> dict:
        if self.opts.start == "$":
            return {"id": self._last_id()}
        return {"id": _fmt(parse_id(self.opts.start))}

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        end = self._latest(start, limit)
        self._planned_end = end["id"]  # what reportLatestOffset, called next, counts beyond
        return end

    def _latest(self, start: dict, limit: ReadLimit) -> dict:
        after = start["id"]
        if isinstance(limit, ReadMaxRows):
            entries = redis_replies.entries(self.client, self.opts.stream, "(" + after, "+", count=limit.max_rows)
            return {"id": entries[-1][0].decode()} if entries else start
        last = self._last_id()
        return {"id": last} if parse_id(last) > parse_id(after) else start

    def reportLatestOffset(self) -> dict | None:
        """The stream's last entry id, and how many entries lie beyond the batch just planned."""
        planned = getattr(self, "_planned_end", None)
        last = self._last_id()
        if planned is None:
            return {"id": last}
        return {"id": last, BEHIND_KEY: entries_after(self.client, self.opts.stream, planned, last)}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.opts.max_entries) if self.opts.max_entries else ReadAllAvailable()

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        parts = self.opts.partitions
        if parts > 1:
            # Counted from the start to the stream's end, so never fewer than the batch holds.
            held = redis_replies.count_after(self.client, self.opts.stream, start["id"], cap=SPLIT_MIN_ENTRIES * parts)
            parts = max(1, min(parts, held // SPLIT_MIN_ENTRIES))
        return split_id_range(start["id"], end["id"], parts)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        part: _IdRange = partition  # type: ignore[assignment]
        client = redis.Redis.from_url(self.opts.url)
        try:
            yield from read_entries(client, self.opts.stream, part.after, part.until, self.arrow_schema)
        finally:
            client.close()

    def commit(self, end: dict) -> None:
        pass

    def stop(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


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
                    pending_json.append(_coerce_json(r, schema))
                if len(pending_json) >= 4096:
                    yield from flush_json()
        if len(entries) < _READ_PAGE:
            break
        cursor = entries[-1][0].decode()
        if parse_id(cursor) >= parse_id(until):
            break
    yield from flush_json()


# ---------------------------------------------------------------- sink


@dataclass
class PackedEntries(WriterCommitMessage):
    entries: list[bytes]
    num_rows: int


def _pack_batches(batches: Iterator[pa.RecordBatch], rows_per_entry: int) -> PackedEntries:
    entries: list[bytes] = []
    pending: list[pa.RecordBatch] = []
    pending_rows = total = 0
    for b in batches:
        total += b.num_rows
        pending.append(b)
        pending_rows += b.num_rows
        while pending_rows >= rows_per_entry:
            table = pa.Table.from_batches(pending)
            entries.append(pack_events(table.slice(0, rows_per_entry)))
            rest = table.slice(rows_per_entry)
            pending = rest.to_batches()
            pending_rows = rest.num_rows
    if pending_rows:
        entries.append(pack_events(pa.Table.from_batches(pending)))
    return PackedEntries(entries=entries, num_rows=total)


def _packed(messages: list[WriterCommitMessage | None]) -> list[bytes]:
    """The entries the writers' tasks packed (None: a task that wrote nothing)."""
    return [e for m in messages if isinstance(m, PackedEntries) for e in m.entries]


class _StreamWriter(_LazyClient, DataSourceStreamArrowWriter):
    def __init__(self, opts: _Options):
        self.opts = opts

    def write(self, iterator: Iterator[pa.RecordBatch]) -> PackedEntries:
        return _pack_batches(iterator, self.opts.rows_per_entry)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        entries = _packed(messages)
        commit_entries(
            self.client,
            self.opts.stream,
            entries,
            sink_id=self.opts.sink_id,
            batch_id=batchId,
            maxlen=self.opts.maxlen,
            attempt=self.opts.attempt,
        )

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        pass  # nothing reached Redis: entries are only written at commit


class _BatchWriter(_LazyClient, DataSourceArrowWriter):
    def __init__(self, opts: _Options):
        self.opts = opts

    def write(self, iterator: Iterator[pa.RecordBatch]) -> PackedEntries:
        return _pack_batches(iterator, self.opts.rows_per_entry)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        entries = _packed(messages)
        commit_entries(self.client, self.opts.stream, entries, sink_id=None, batch_id=None, maxlen=self.opts.maxlen)


class RedisStreamDataSource(DataSource):
    """`format("redis_stream")`. Options: url, stream, schema (DDL; or `.schema(...)`),
    start ("0" = whole stream, "$" = only new entries, or an entry id), max_entries_per_trigger,
    partitions; sink: rows_per_entry, maxlen, sink_id, attempt (set by prepare)."""

    @classmethod
    def name(cls) -> str:
        return "redis_stream"

    def schema(self) -> StructType | str:
        ddl = {k.lower(): v for k, v in self.options.items()}.get("schema")
        if not ddl:
            raise ValueError("redis_stream: give the event schema with .schema(...) or option `schema`")
        return ddl

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return _StreamReader(_Options(self.options), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamArrowWriter:
        return _StreamWriter(_Options(self.options))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceArrowWriter:
        return _BatchWriter(_Options(self.options))


# ---------------------------------------------------------------- sink handle


def redis_stream_sink(
    df: "DataFrame",
    url: str,
    stream: str,
    *,
    sink_id: str,
    rows_per_entry: int = DEFAULT_ROWS_PER_ENTRY,
    maxlen: int | None = None,
    output_mode: str = "append",
    trigger: str | None = None,
    name: str | None = None,
) -> SinkHandle:
    opts = {"url": url, "stream": stream, "rows_per_entry": str(rows_per_entry), "sink_id": sink_id}
    if maxlen:
        opts["maxlen"] = str(maxlen)

    def prepare(attempt: int, restored_batch_id: int, owner: SinkOwner | None = None) -> None:
        # Set first: after a failed prepare the sink must refuse to write, not write unfenced.
        opts["attempt"] = str(attempt)  # read by configure() when the query starts
        client = redis.Redis.from_url(url)
        try:
            prepare_sink(
                client, stream, sink_id=sink_id, attempt=attempt, restored_batch_id=restored_batch_id, owner=owner
            )
        finally:
            client.close()

    def configure(writer):
        return writer.format("redis_stream").options(**opts)

    def run_batch() -> None:
        df.write.format("redis_stream").mode("append").options(**opts).save()

    return SinkHandle(
        name=name or f"redis-{stream}",
        df=df,
        output_mode=output_mode,
        trigger=trigger,
        configure=configure,
        run_batch=run_batch,
        on_prepare=prepare,
    )
