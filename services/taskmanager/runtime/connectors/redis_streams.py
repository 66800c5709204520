"""Redis Streams as a replayable source and an exactly-once sink (Python Data Source API).

Entries are packed (Arrow IPC, what Headrace writes) or single JSON objects (what outside
producers find easiest), mixed freely in one stream: redis_stream_entries.py reads and packs them.

Source offsets are stream entry ids `{"id": "<ms>-<seq>"}`: the checkpoint can replay any batch
as long as the stream still holds its entries. `max_entries_per_trigger` limits ENTRIES (not
events) per micro-batch, since counting events would mean decoding every entry at planning time.

Source lag: after planning a batch the reader counts the entries the stream holds beyond the
batch's end and reports them in its latest offset (`{"id": <last id>, "entriesBehind": n}`,
Spark's reportLatestOffset), where the driver reads them for `source_lag` (the Python Data Source
API has no source metrics). Counted exactly on the server up to LAG_COUNT_CAP entries, above
that estimated from the ids' times and XLEN (redis_stream_entries.py `entries_after`); 0 at once
when the batch ends at the last entry.
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

import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator, Mapping, Sequence

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
from .redis_stream_entries import entries_after, format_id, pack_events, parse_id, read_entries
from .sinks import SinkHandle

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

DEFAULT_ROWS_PER_ENTRY = 1000
_MAX_SEQ = 18446744073709551615  # largest sequence number of a stream id
BEHIND_KEY = "entriesBehind"  # in the reported latest offset: entries beyond the planned batch
# A batch is read in at most one partition per this many entries: every partition costs a task
# and a Python worker round trip, which for a trickle of single events is most of the read
# (docs/benchmarks.md, "Where a small micro-batch's time goes").
SPLIT_MIN_ENTRIES = 16


# ---------------------------------------------------------------- options


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
        bounds.append(format_id((a[0] + span * k // parts, _MAX_SEQ)))
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
        return {"id": format_id(parse_id(self.opts.start))}

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
