"""The Redis stream sink's fence protocol: its keys and the two server-side scripts (commit and
prepare) that keep a sink exactly once and fenced (see redis_streams.py, "Sink" and "Attempt
fencing").

Ownership (ownership.py): `headrace:sink:<id>:owner` (a hash: lineage, job_id, generation)
names the lineage that owns the sink id. Given the attempt's owner, the prepare script refuses
another lineage's sink id before it changes anything, and records the owner when it succeeds.
Who may write these keys: in the cluster's Redis each lineage's tasks connect as a user of their
own that reaches `headrace:sink:<lineage>:*` and no other lineage's (shared/pipeline_redis.py);
a prepare or commit Redis refuses raises `SinkBookkeepingRefused`, saying so.

Through `ctx.sinks.redis_stream` a sink id is `<lineage>:<stream>`, so lineages never share one:
several lineages may append to one stream (a stream has many producers), each undoing only the
entries its own batches recorded; the refusal guards explicit sink ids (`redis_stream_sink(...,
sink_id=...)`) reused by another lineage, whose fresh start would delete that lineage's entries.
"""

from __future__ import annotations

from typing import Any, Sequence

import redis
from redis.typing import EncodableT

from shared.errors import TaskError
from shared.redis_key_grants import WRITE_OPTION

from .ownership import MAX_REPLACED, UNKNOWN, SinkOwnedError, SinkOwner
from .sinks import SinkFencedError

ARROW_FIELD = "arrow"  # the field of a packed entry (what the commit script writes)


RETAINED_BATCH_RECORDS = 100_000  # batches whose entry ids a prepare can still delete


def committed_key(sink_id: str) -> str:
    return f"headrace:sink:{sink_id}:last_batch"


def fence_key(sink_id: str) -> str:
    return f"headrace:sink:{sink_id}:attempt"


def batches_key(sink_id: str) -> str:
    return f"headrace:sink:{sink_id}:batches"


def owner_key(sink_id: str) -> str:
    return f"headrace:sink:{sink_id}:owner"


# KEYS: stream, last_batch, fence, batches. ARGV: batch id, attempt ("" = not fenced), maxlen
# ("" = none), retained batch records, entries... Returns {"ok"}, {"skip"} or {"fenced", holder}.
_COMMIT_SCRIPT = """
if ARGV[2] ~= '' then
  local holder = redis.call('GET', KEYS[3])
  if not holder or tonumber(holder) ~= tonumber(ARGV[2]) then
    return {'fenced', holder or ''}
  end
end
local batch = tonumber(ARGV[1])
local last = redis.call('GET', KEYS[2])
if last and tonumber(last) >= batch then
  return {'skip'}
end
local ids = {}
for i = 5, #ARGV do
  if ARGV[3] ~= '' then
    ids[#ids + 1] = redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[3], '*', 'arrow', ARGV[i])
  else
    ids[#ids + 1] = redis.call('XADD', KEYS[1], '*', 'arrow', ARGV[i])
  end
end
redis.call('HSET', KEYS[4], ARGV[1], table.concat(ids, ' '))
redis.call('HDEL', KEYS[4], tostring(batch - tonumber(ARGV[4])))
redis.call('SET', KEYS[2], ARGV[1])
return {'ok'}
"""

# KEYS: stream, last_batch, fence, batches, owner. ARGV: attempt, restored batch id, lineage
# ("" = no ownership check), job id, generation, replaced ids kept. Returns {"owned", lineage,
# job} ("" when the owner is unknown), {"replaced", lineage, job}, {"fenced", holder},
# {"missing", batch} (nothing changed in all four) or {"ok", deleted entries}. The ownership
# rules are ownership.check_claim's and replaced_after's.
_PREPARE_SCRIPT = """
local attempt = tonumber(ARGV[1])
local r = tonumber(ARGV[2])
local lineage, job = ARGV[3], ARGV[4]
local owner = redis.call('HMGET', KEYS[5], 'lineage', 'job_id', 'replaced')
local replaced = {}
for id in string.gmatch(owner[3] or '', '%S+') do
  replaced[#replaced + 1] = id
end
if lineage ~= '' then
  if owner[1] then
    if owner[1] ~= lineage then
      return {'owned', owner[1], owner[2] or ''}
    end
    if owner[2] ~= job then
      for _, id in ipairs(replaced) do
        if id == job then
          return {'replaced', owner[1], owner[2]}
        end
      end
    end
  elseif r < 0 and redis.call('EXISTS', KEYS[2]) == 1 then
    return {'owned', '', ''}
  end
end
local holder = redis.call('GET', KEYS[3])
if holder and tonumber(holder) > attempt then
  return {'fenced', holder}
end
local last = tonumber(redis.call('GET', KEYS[2]) or '-1')
local doomed = {}
for b = r + 1, last do
  local ids = redis.call('HGET', KEYS[4], tostring(b))
  if not ids then
    return {'missing', tostring(b)}
  end
  doomed[#doomed + 1] = ids
end
local deleted = 0
for b = r + 1, last do
  redis.call('HDEL', KEYS[4], tostring(b))
end
for _, ids in ipairs(doomed) do
  for id in string.gmatch(ids, '%S+') do
    deleted = deleted + redis.call('XDEL', KEYS[1], id)
  end
end
if last > r then
  if r >= 0 then
    redis.call('SET', KEYS[2], tostring(r))
  else
    redis.call('DEL', KEYS[2])
  end
end
redis.call('SET', KEYS[3], ARGV[1])
if lineage ~= '' then
  if owner[1] and owner[2] ~= job then
    local kept = {}
    for _, id in ipairs(replaced) do
      if id ~= owner[2] then
        kept[#kept + 1] = id
      end
    end
    local keep = tonumber(ARGV[6]) - 1
    replaced = {}
    for i = math.max(1, #kept - keep + 1), #kept do
      replaced[#replaced + 1] = kept[i]
    end
    replaced[#replaced + 1] = owner[2]
  end
  redis.call('HSET', KEYS[5], 'lineage', lineage, 'job_id', job, 'generation', ARGV[5],
             'replaced', table.concat(replaced, ' '))
end
return {'ok', tostring(deleted)}
"""


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


class SinkBookkeepingRefused(TaskError, RuntimeError):
    """This task's Redis user may not touch the sink's stream or bookkeeping keys."""

    def __init__(self, sink_id: str, error: Exception | str, stream: str = ""):
        self.sink_id, self.error, self.stream = sink_id, str(error), stream
        super().__init__(
            f"Redis refused this task's user the stream {stream!r} or the bookkeeping of sink {sink_id!r} "
            f"(headrace:sink:{sink_id}:*; {error}). A job that declares its Redis keys writes only the streams "
            f"named in {WRITE_OPTION}: add the stream there. A task reaches only its own lineage's sinks, whose "
            f"ids are '<lineage>:<name>' "
            f"(ctx.sinks.redis_stream names them so; an explicit sink_id must start with the lineage). If this is "
            f"ctx.sinks.redis_stream, the JobManager could not make the lineage's Redis user: its log says why "
            f'(docs/runbooks/auth.md, "Redis users").'
        )

    def __reduce__(self):  # picklable despite its own signature (e.g. across processes)
        return (SinkBookkeepingRefused, (self.sink_id, self.error, self.stream))


def _eval(client: redis.Redis, script: str, keys: list[str], args: list[EncodableT], sink_id: str) -> list[str]:
    try:
        return [_text(x) for x in client.eval(script, len(keys), *keys, *args)]
    except redis.exceptions.NoPermissionError as exc:
        raise SinkBookkeepingRefused(sink_id, exc, stream=keys[0]) from None


def prepare_sink(
    client: redis.Redis,
    stream: str,
    *,
    sink_id: str,
    attempt: int,
    restored_batch_id: int,
    owner: SinkOwner | None = None,
) -> int:
    """Take the sink over for `attempt` and delete the entries of batches after
    `restored_batch_id`; returns how many entries were deleted. Raises SinkOwnedError when
    another lineage than `owner`'s owns the sink id, SinkFencedError when a newer attempt holds
    the sink, RuntimeError when a batch to undo has no recorded entry ids."""
    keys = [stream, committed_key(sink_id), fence_key(sink_id), batches_key(sink_id), owner_key(sink_id)]
    claim = (owner.lineage, owner.job_id, owner.generation) if owner else ("", "", 0)
    args: list[EncodableT] = [attempt, restored_batch_id, *claim, MAX_REPLACED]
    status, *rest = _eval(client, _PREPARE_SCRIPT, keys, args, sink_id)
    if status in ("owned", "replaced"):
        release = (
            f"cancel the owner's job, then DEL {owner_key(sink_id)} {fence_key(sink_id)} "
            f"{committed_key(sink_id)} {batches_key(sink_id)} (its entries stay in {stream})"
        )
        lineage, job = (rest[0], rest[1]) if rest[0] else (UNKNOWN, UNKNOWN)
        # Only a prepare with an owner is refused so (the script checks ownership only then).
        claimant = f"job {owner.job_id} (lineage {owner.lineage})" if owner else "a prepare without an owner"
        raise SinkOwnedError(
            "Redis stream sink",
            f"{sink_id!r} (stream {stream})",
            lineage,
            job,
            claimant,
            release,
            replaced=status == "replaced",
        )
    if status == "fenced":
        raise SinkFencedError(f"stream:{stream} ({sink_id})", attempt, int(rest[0]))
    if status == "missing":
        raise RuntimeError(
            f"Redis stream sink {sink_id}: attempt {attempt} restarts after batch "
            f"{restored_batch_id} and must delete the entries of batch {rest[0]} from {stream}, "
            f"but their ids are not recorded in {batches_key(sink_id)} (the batch is older than "
            f"the last {RETAINED_BATCH_RECORDS} batches, or was written by a Headrace version "
            f"without attempt fencing), so re-running it would duplicate it. Fix: write the job "
            f"to a new stream, or remove that batch's entries yourself and set "
            f"{committed_key(sink_id)} to {restored_batch_id} (delete the key if that is -1)."
        )
    return int(rest[0])


def commit_entries(
    client: redis.Redis,
    stream: str,
    entries: Sequence[bytes],
    *,
    sink_id: str | None,
    batch_id: int | None,
    maxlen: int | None = None,
    attempt: int | None = None,
) -> bool:
    """XADD all entries atomically; with a batch id, skip (False) if it is already committed;
    with an attempt (a prepared sink), raise SinkFencedError, writing nothing, unless that
    attempt still holds the sink.

    Micro-batch ids only grow within a lineage and only the last one can be re-run, so one
    integer per sink is enough to remember what was written (prepare rewinds it).
    """
    if sink_id is None or batch_id is None:
        with client.pipeline() as pipe:  # MULTI/EXEC: all entries or none
            for e in entries:
                pipe.xadd(stream, {ARROW_FIELD: e}, maxlen=maxlen, approximate=maxlen is not None)
            pipe.execute()
        return True
    keys = [stream, committed_key(sink_id), fence_key(sink_id), batches_key(sink_id)]
    args: list[EncodableT] = [
        batch_id,
        "" if attempt is None else attempt,
        "" if maxlen is None else maxlen,
        RETAINED_BATCH_RECORDS,
        *entries,
    ]
    status, *rest = _eval(client, _COMMIT_SCRIPT, keys, args, sink_id)
    if status == "fenced" and attempt is not None:  # the script checks the fence only for an attempt
        raise SinkFencedError(f"stream:{stream} ({sink_id})", attempt, int(rest[0]) if rest[0] else None)
    return status == "ok"
