"""Dead letters: what a consumer could not read or handle, parked in `hr:stream:dlq` for an
operator (docs/runbooks/dead-letters.md), so that one bad entry never stops a consumer.

Every producer of dead letters (the stream consumers, a TaskManager's command queue and inbox)
writes them here (a TaskManager to a dead-letter stream of its own, `hr:stream:dlq:tm:<id>`, so
that it cannot trim the others'), because the streams are capped by size as well as by length: whoever can write
to a queue could otherwise fill Redis through it (three 10 MB garbage entries used to keep
34 MB). A dead letter keeps at most `PAYLOAD_KEEP_BYTES` of the original, over all its fields
together, and says in its `truncated` field what it dropped; the stream keeps the newest
`streams.DLQ_MAXLEN` dead letters.

Fields of an entry: where it came from (`stream`, `entry_id`, `group`, or `queue`, `task`), the
`error`, and the original as `orig.<field>` (`orig.m`: an envelope's JSON; `orig.item`: a raw
Celery queue item).
"""

from __future__ import annotations

import logging
from typing import Mapping

from shared import streams

log = logging.getLogger(__name__)

PAYLOAD_KEEP_BYTES = 8 * 1024
ERROR_KEEP_CHARS = 2000
MAX_FIELDS = 16  # an entry with thousands of fields is not kept field by field either

Value = bytes | str | int | float


def _as_bytes(value: Value) -> bytes:
    if isinstance(value, bytes):
        return value
    return str(value).encode("utf-8", "replace")


def entry(*, error: str, origin: Mapping[str, Value], original: Mapping[Value, Value]) -> dict[str, bytes]:
    """The fields of one dead letter, with the original cut down to `PAYLOAD_KEEP_BYTES`."""
    fields: dict[str, bytes] = {k: _as_bytes(v) for k, v in origin.items()}
    fields["error"] = _as_bytes(error[:ERROR_KEEP_CHARS])
    budget = PAYLOAD_KEEP_BYTES
    cut: list[str] = []
    items = list(original.items())
    for key, value in items[:MAX_FIELDS]:
        name = key.decode("utf-8", "replace") if isinstance(key, bytes) else str(key)
        data = _as_bytes(value)
        kept = data[: max(0, budget)]
        budget -= len(kept)
        fields[f"orig.{name[:200]}"] = kept
        if len(kept) < len(data):
            cut.append(f"orig.{name[:200]}: kept {len(kept)} of {len(data)} bytes")
    if len(items) > MAX_FIELDS:
        cut.append(f"kept {MAX_FIELDS} of {len(items)} fields")
    if cut:
        fields["truncated"] = "; ".join(cut).encode()
    return fields


def add(
    client,
    *,
    error: str,
    origin: Mapping[str, Value],
    original: Mapping[Value, Value],
    stream: str = streams.DLQ_STREAM,
) -> None:
    """Append one dead letter; `client` is a redis client or pipeline (executed by the caller).
    `stream`: a TaskManager's own (streams.tm_dead_letters), the control plane's otherwise."""
    client.xadd(
        stream, entry(error=error, origin=origin, original=original), maxlen=streams.DLQ_MAXLEN, approximate=False
    )


def add_safely(
    client,
    *,
    error: str,
    origin: Mapping[str, Value],
    original: Mapping[Value, Value],
    stream: str = streams.DLQ_STREAM,
) -> bool:
    """`add`, for callers that must carry on even if Redis refuses (a worker reading its queue):
    the failure is logged with the error the entry would have carried."""
    try:
        add(client, error=error, origin=origin, original=original, stream=stream)
        return True
    except Exception:  # losing a dead letter must not stop the consumer
        log.exception("could not dead-letter an entry from %s (%s)", dict(origin), error[:200])
        return False
