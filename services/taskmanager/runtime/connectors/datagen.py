"""Deterministic click-stream generator: a Python Data Source (streaming and batch).

Event `i` is a pure function of `(seed, i)` and the shape options, so a test can compute the
exact expected output of a pipeline with `generate_events` without running Spark. The vectorised
generator used by the Spark reader (`generate_batch`) must agree bit for bit with the scalar
`generate_event`; tests check that.

Event time: event `i` is nominally at `base_time + i * spacing` (spacing = 60 s /
events_per_minute) and arrives up to `max_delay_ms` early in event time, i.e. its event time is
`nominal - delay(seed, i)`. A watermark delay >= max_delay_ms therefore never drops an event.

Offsets are `{"i": n}`: the next event index to read.
"""

from __future__ import annotations

import itertools
import time
from datetime import datetime, timedelta, timezone
from typing import Any, Iterator, Sequence

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows
from pyspark.sql.types import StructType

SCHEMA_DDL = "i long, user_id string, url string, event_time timestamp"
ARROW_SCHEMA = pa.schema(
    [("i", pa.int64()), ("user_id", pa.string()), ("url", pa.string()), ("event_time", pa.timestamp("us", tz="UTC"))]
)

DEFAULT_URLS: tuple[str, ...] = (
    "/",
    "/home",
    "/search",
    "/product/1",
    "/product/2",
    "/product/3",
    "/cart",
    "/checkout",
    "/login",
    "/about",
)
DEFAULT_BASE_TIME = datetime(2024, 1, 1, tzinfo=timezone.utc)
DEFAULT_EVENTS_PER_MINUTE = 600
DEFAULT_NUM_USERS = 1000
DEFAULT_MAX_DELAY_MS = 5000

_MASK = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
# Salts give independent streams for the different random fields of one event.
_SALT_USER, _SALT_URL_A, _SALT_URL_B, _SALT_DELAY = 1, 2, 3, 4


def _mix(z: int) -> int:
    """splitmix64 finaliser: cheap, well distributed, trivially reproducible in numpy."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def _hash(seed: int, i: int, salt: int) -> int:
    return _mix((_mix((seed * _GOLDEN + salt) & _MASK) + i * _GOLDEN) & _MASK)


def _mix_np(z: np.ndarray) -> np.ndarray:
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def _hash_np(seed: int, idx: np.ndarray, salt: int) -> np.ndarray:
    key = np.uint64(_mix((seed * _GOLDEN + salt) & _MASK))
    with np.errstate(over="ignore"):
        return _mix_np(key + idx.astype(np.uint64) * np.uint64(_GOLDEN))


def _micros(t: datetime) -> int:
    if t.tzinfo is None:
        t = t.replace(tzinfo=timezone.utc)
    d = t - _EPOCH
    return (d.days * 86_400 + d.seconds) * 1_000_000 + d.microseconds


def _spacing_us(events_per_minute: int) -> int:
    if events_per_minute <= 0:
        raise ValueError("events_per_minute must be > 0")
    return 60_000_000 // events_per_minute


def generate_event(
    seed: int,
    i: int,
    *,
    urls: Sequence[str] = DEFAULT_URLS,
    num_users: int = DEFAULT_NUM_USERS,
    base_time: datetime = DEFAULT_BASE_TIME,
    events_per_minute: int = DEFAULT_EVENTS_PER_MINUTE,
    max_delay_ms: int = DEFAULT_MAX_DELAY_MS,
) -> dict[str, Any]:
    """Event `i` of the stream `seed`; `event_time` is a UTC-aware datetime."""
    n = len(urls)
    # min of two uniform draws skews traffic towards the first urls, like real click streams.
    url_idx = min(_hash(seed, i, _SALT_URL_A) % n, _hash(seed, i, _SALT_URL_B) % n)
    delay_us = (_hash(seed, i, _SALT_DELAY) % (max_delay_ms + 1)) * 1000
    t_us = _micros(base_time) + i * _spacing_us(events_per_minute) - delay_us
    return {
        "i": i,
        "user_id": f"user-{_hash(seed, i, _SALT_USER) % num_users}",
        "url": urls[url_idx],
        "event_time": _EPOCH + timedelta(microseconds=t_us),
    }


def generate_events(seed: int, start: int, end: int, **shape: Any) -> list[dict[str, Any]]:
    """Events `start <= i < end`, each exactly `generate_event(seed, i, **shape)`."""
    return [generate_event(seed, i, **shape) for i in range(start, end)]


def generate_batch(
    seed: int,
    start: int,
    end: int,
    *,
    urls: Sequence[str] = DEFAULT_URLS,
    num_users: int = DEFAULT_NUM_USERS,
    base_time: datetime = DEFAULT_BASE_TIME,
    events_per_minute: int = DEFAULT_EVENTS_PER_MINUTE,
    max_delay_ms: int = DEFAULT_MAX_DELAY_MS,
) -> pa.RecordBatch:
    """Vectorised `generate_events` as an Arrow record batch (the reader's hot path)."""
    idx = np.arange(start, end, dtype=np.int64)
    n = np.uint64(len(urls))
    url_idx = np.minimum(_hash_np(seed, idx, _SALT_URL_A) % n, _hash_np(seed, idx, _SALT_URL_B) % n)
    user_idx = _hash_np(seed, idx, _SALT_USER) % np.uint64(num_users)
    delay_us = (_hash_np(seed, idx, _SALT_DELAY) % np.uint64(max_delay_ms + 1)).astype(np.int64) * 1000
    t_us = _micros(base_time) + idx * _spacing_us(events_per_minute) - delay_us
    # Strings are built once per distinct value and gathered with `take`, far cheaper than
    # formatting one string per event.
    users = pa.array([f"user-{u}" for u in range(num_users)]).take(pa.array(user_idx.astype(np.int64)))
    url_col = pa.array(list(urls)).take(pa.array(url_idx.astype(np.int64)))
    return pa.RecordBatch.from_arrays(
        [pa.array(idx), users, url_col, pa.array(t_us, type=pa.timestamp("us", tz="UTC"))], schema=ARROW_SCHEMA
    )


class _Options:
    """Parsed data source options (Spark lower-cases option names)."""

    def __init__(self, options: dict[str, str]):
        o = {k.lower(): v for k, v in options.items()}
        self.seed = int(o.get("seed", 0))
        total = o.get("total")
        self.total: int | None = int(total) if total not in (None, "", "none") else None
        rate = o.get("rows_per_second") or o.get("rowspersecond")
        self.rows_per_second: float | None = float(rate) if rate not in (None, "", "0") else None
        max_rows = o.get("max_rows_per_batch")
        self.max_rows_per_batch: int | None = int(max_rows) if max_rows else None
        self.partitions = max(1, int(o.get("partitions", 1)))
        self.shape: dict[str, Any] = {
            "num_users": int(o.get("num_users", DEFAULT_NUM_USERS)),
            "events_per_minute": int(o.get("events_per_minute", DEFAULT_EVENTS_PER_MINUTE)),
            "max_delay_ms": int(o.get("max_delay_ms", DEFAULT_MAX_DELAY_MS)),
        }
        if o.get("urls"):
            self.shape["urls"] = tuple(u for u in o["urls"].split(",") if u)
        if o.get("base_time"):
            self.shape["base_time"] = datetime.fromisoformat(o["base_time"])


class _Range(InputPartition):
    def __init__(self, start: int, end: int):
        super().__init__((start, end))
        self.start = start
        self.end = end


def split_range(start: int, end: int, parts: int) -> list[_Range]:
    """Contiguous, nearly equal sub-ranges of [start, end); empty ones are dropped."""
    n = end - start
    if n <= 0:
        return []
    parts = max(1, min(parts, n))
    bounds = [start + n * k // parts for k in range(parts + 1)]
    return [_Range(a, b) for a, b in itertools.pairwise(bounds) if b > a]


def _read_range(opts: _Options, part: _Range, chunk: int = 65_536) -> Iterator[pa.RecordBatch]:
    for a in range(part.start, part.end, chunk):
        yield generate_batch(opts.seed, a, min(a + chunk, part.end), **opts.shape)


class _BatchReader(DataSourceReader):
    def __init__(self, opts: _Options):
        if opts.total is None:
            raise ValueError("datagen: a batch read needs the `total` option")
        self.opts = opts

    def partitions(self) -> Sequence[InputPartition]:
        return split_range(0, self.opts.total or 0, self.opts.partitions)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        yield from _read_range(self.opts, partition)  # type: ignore[arg-type]


class _StreamReader(DataSourceStreamReader):
    """Paced reader: `rows_per_second` events become available per second since the reader
    was created (query start), counted from the offset the query (re)started at, capped at
    `total`."""

    def __init__(self, opts: _Options):
        self.opts = opts
        self._t0 = time.monotonic()
        # The restart offset is only known at the first latestOffset call.
        self._anchor: tuple[float, int] | None = None

    def initialOffset(self) -> dict:
        return {"i": 0}

    def _available(self, start: int) -> int:
        cap = self.opts.total
        if self.opts.rows_per_second is None:
            if cap is None:
                raise ValueError("datagen: an unbounded stream needs `rows_per_second`")
            return cap
        if self._anchor is None:
            self._anchor = (self._t0, start)
        t0, i0 = self._anchor
        avail = i0 + int((time.monotonic() - t0) * self.opts.rows_per_second)
        return avail if cap is None else min(avail, cap)

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        begin = int(start["i"])
        end = max(begin, self._available(begin))
        if isinstance(limit, ReadMaxRows):
            end = min(end, begin + limit.max_rows)
        return {"i": end}

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_rows_per_batch:
            return ReadMaxRows(self.opts.max_rows_per_batch)
        return ReadAllAvailable()

    def reportLatestOffset(self) -> dict | None:
        return {"i": self.opts.total} if self.opts.total is not None else None

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        return split_range(int(start["i"]), int(end["i"]), self.opts.partitions)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        yield from _read_range(self.opts, partition)  # type: ignore[arg-type]

    def commit(self, end: dict) -> None:
        pass


class DatagenDataSource(DataSource):
    """`spark.readStream.format("datagen")` / `spark.read.format("datagen")`.

    Options: seed, total (bounded when set), rows_per_second (pacing; unset = everything at
    once, needs total), max_rows_per_batch, partitions, events_per_minute, num_users,
    max_delay_ms, urls (comma separated), base_time (ISO 8601, UTC if naive).
    """

    @classmethod
    def name(cls) -> str:
        return "datagen"

    def schema(self) -> str:
        return SCHEMA_DDL

    def reader(self, schema: StructType) -> DataSourceReader:
        return _BatchReader(_Options(dict(self.options)))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return _StreamReader(_Options(dict(self.options)))


def is_exhausted(end_offset: dict | None, total: int) -> bool:
    """True when a datagen offset has reached the bound `total` (for the runner's finish check)."""
    return isinstance(end_offset, dict) and set(end_offset) == {"i"} and int(end_offset["i"]) >= total
