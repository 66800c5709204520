"""Redis stream replies as the connectors' clients read them: bytes (replies are not decoded),
over RESP2. redis-py types each reply for every protocol and decoding at once; the connectors
read them through here, typed once."""

from __future__ import annotations

from typing import cast

import redis

# A stream entry: its id and its fields.
StreamEntry = tuple[bytes, dict[bytes, bytes]]


def entries(client: redis.Redis, stream: str, low: str | bytes, high: str | bytes, *,
            count: int | None = None) -> list[StreamEntry]:
    """XRANGE: the entries from `low` to `high` ("(" before a bound excludes it), oldest first."""
    return cast("list[StreamEntry] | None", client.xrange(stream, low, high, count=count)) or []


def newest_entries(client: redis.Redis, stream: str, high: str | bytes, low: str | bytes, *,
                   count: int | None = None) -> list[StreamEntry]:
    """XREVRANGE: the entries from `high` down to `low`, newest first."""
    return cast("list[StreamEntry] | None", client.xrevrange(stream, high, low, count=count)) or []
