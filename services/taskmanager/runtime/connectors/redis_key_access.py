"""A Redis source or sink makes sure the task's Redis user reaches its stream before the query
starts (shared/redis_key_grants.py, pipeline_redis_keys "connectors").

The task's lineage user reaches the streams its job declares, or, when it declares none, those
its connectors were granted: a stream it cannot reach yet is claimed from the JobManager through
the TaskManager (runtime/grants.py), and the grant is awaited in the task's own connection, which
Redis changes at once. A refusal fails the attempt from the JobManager's side; a claim not granted
within GRANT_TIMEOUT_S fails it here, saying so. Whether the user reaches a stream is asked with
a command that changes nothing: XLEN for a read, XTRIM MINID 0 (no entry has a smaller id) for a
write. Outside a TaskManager's driver (the restore-check planner, tests, tools) nothing is checked.
"""

from __future__ import annotations

import logging
import time

import redis

from services.taskmanager.runtime import grants
from shared.errors import TaskError
from shared.redis_key_grants import READ_OPTION, WRITE_OPTION

log = logging.getLogger("headrace.driver")

GRANT_TIMEOUT_S = 30.0
POLL_S = 0.01
WAITING_AFTER_S = 1.0


class RedisKeysNotGranted(TaskError, RuntimeError):
    """The task's Redis user does not reach a stream a connector needs, and will not."""


def _reaches(client: redis.Redis, stream: str, *, write: bool) -> bool:
    try:
        if write:
            client.xtrim(stream, minid="0")
        else:
            client.xlen(stream)
    except redis.exceptions.NoPermissionError:
        return False
    except redis.exceptions.ResponseError as exc:
        if "WRONGTYPE" not in str(exc):
            raise  # the connector's own use fails with it, and says more
    return True


def _missing(client: redis.Redis, read: tuple[str, ...], write: tuple[str, ...]) -> tuple[tuple[str, ...], ...]:
    return (
        tuple(k for k in read if not _reaches(client, k, write=False)),
        tuple(k for k in write if not _reaches(client, k, write=True)),
    )


def ensure(url: str, *, read: tuple[str, ...] = (), write: tuple[str, ...] = (), declared: bool = False) -> None:
    """Return once the user of `url` may read `read` and write `write`; RedisKeysNotGranted when
    it may not (its job declares its keys and these are not among them; no grant in time)."""
    channel = grants.current()
    if channel is None:
        return
    client = redis.Redis.from_url(url, socket_timeout=10)
    try:
        try:
            missing_read, missing_write = _missing(client, read, write)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            log.warning("could not ask Redis whether this task's user reaches its streams: %s", exc)
            return  # the connector meets Redis's absence itself, with its own waits and errors
        if not missing_read and not missing_write:
            return
        if declared:
            raise RedisKeysNotGranted(
                f"the job declares its Redis keys and does not name {[*missing_read, *missing_write]}: add the "
                f"streams it writes to {WRITE_OPTION} and those it only reads to {READ_OPTION}, then submit again "
                '(docs/runbooks/auth.md, "Redis users")'
            )
        what = ", ".join([*(f"read {k!r}" for k in missing_read), *(f"write {k!r}" for k in missing_write)])
        print(f"headrace: claiming Redis streams for this task's lineage: {what}", flush=True)  # the driver's log
        channel.claim_redis_keys(read=missing_read, write=missing_write)
        started = time.monotonic()
        waiting = False
        while missing_read or missing_write:
            elapsed = time.monotonic() - started
            if elapsed > GRANT_TIMEOUT_S:
                raise RedisKeysNotGranted(
                    f"the JobManager granted no access to the Redis streams ({what}) within {GRANT_TIMEOUT_S:.0f} s: "
                    "see the leading JobManager's log for 'Redis keys' (docs/runbooks/auth.md, \"Redis users\")"
                )
            if not waiting and elapsed > WAITING_AFTER_S:
                waiting = True
                channel.waiting(f"waiting for the JobManager to grant this task's Redis user: {what}")
            time.sleep(POLL_S)
            missing_read, missing_write = _missing(client, missing_read, missing_write)
        if waiting:
            channel.waiting(None)
        print(f"headrace: Redis streams granted after {time.monotonic() - started:.3f} s: {what}", flush=True)
    finally:
        client.close()
