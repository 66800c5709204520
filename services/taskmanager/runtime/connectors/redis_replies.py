"""Redis stream replies as the connectors' clients read them: bytes (replies are not decoded),
over RESP2. redis-py types each reply for every protocol and decoding at once; the connectors
read them through here, typed once. A read the task's Redis user may not make (a key its job did
not declare, shared/redis_key_grants.py) is a StreamReadRefused that says so."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, cast

import redis

from shared.errors import TaskError
from shared.redis_key_grants import READ_OPTION, WRITE_OPTION

# A stream entry: its id and its fields.
StreamEntry = tuple[bytes, dict[bytes, bytes]]


def entries(
    client: redis.Redis, stream: str, low: str | bytes, high: str | bytes, *, count: int | None = None
) -> list[StreamEntry]:
    """XRANGE: the entries from `low` to `high` ("(" before a bound excludes it), oldest first."""
    with reading(stream):
        return cast("list[StreamEntry] | None", client.xrange(stream, low, high, count=count)) or []


def newest_entries(
    client: redis.Redis, stream: str, high: str | bytes, low: str | bytes, *, count: int | None = None
) -> list[StreamEntry]:
    """XREVRANGE: the entries from `high` down to `low`, newest first."""
    with reading(stream):
        return cast("list[StreamEntry] | None", client.xrevrange(stream, high, low, count=count)) or []


# KEYS: stream. ARGV: exclusive start id, cap. Counts entries after the id on the server, in
# pages, so their contents never cross the network.
_COUNT_AFTER = """
local n, cursor, cap = 0, ARGV[1], tonumber(ARGV[2])
while n < cap do
  local want = math.min(200, cap - n)
  local page = redis.call('XRANGE', KEYS[1], '(' .. cursor, '+', 'COUNT', want)
  n = n + #page
  if #page < want then break end
  cursor = page[#page][1]
end
return n
"""


def count_after(client: redis.Redis, stream: str, after: str, cap: int) -> int:
    """How many entries of `stream` have an id above `after`, counted on the server up to `cap`."""
    with reading(stream):  # EVAL_RO: a read-only grant of the stream suffices
        try:
            return int(client.eval_ro(_COUNT_AFTER, 1, stream, after, cap))
        except redis.exceptions.ResponseError as exc:
            if "unknown command" not in str(exc).lower():
                raise
            return int(client.eval(_COUNT_AFTER, 1, stream, after, cap))  # a source's Redis before 7.0


class StreamReadRefused(TaskError, RuntimeError):
    """Redis refused this task's user a read of a stream."""

    def __init__(self, stream: str, error: Exception | str):
        self.stream, self.error = stream, str(error)
        super().__init__(
            f"Redis refused this task's user a read of {stream!r} ({error}): a job that declares its Redis keys "
            f"reads only those ({READ_OPTION}, or {WRITE_OPTION} for keys it also writes); add the stream there "
            'and submit again (docs/runbooks/auth.md, "Redis users")'
        )

    def __reduce__(self):  # picklable despite its own signature (from the Python workers)
        return (StreamReadRefused, (self.stream, self.error))


@contextmanager
def reading(stream: str) -> Iterator[None]:
    try:
        yield
    except redis.exceptions.NoPermissionError as exc:
        raise StreamReadRefused(stream, exc) from None
