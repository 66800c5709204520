"""What a TaskManager publishes of its warm Spark drivers (streams.tm_warm_key: JSON refreshed with
each heartbeat, expiring 60 s after the last), and the rules its readers apply. A pool is settled
when a driver is ready or it wants none (no free slot a driver would fit): a task or a failover
placed there starts at once. Until every TaskManager is settled, `headrace up` does not call the
cluster warm (services/cluster/readiness.py). A pool also says whether it starts a driver's JVM
and session at the TaskManager's full priority (`urgent`: no driver ready, no task of its own);
while any does, the dispatcher's spare planner stays at the lowest CPU priority, out of the way of
the start a failover would wait for (services/dispatcher/submission/warm_planner.py)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import redis

from shared import streams


def settled(status: Mapping[str, Any]) -> bool:
    """A driver ready, or none wanted (nothing starting, nothing waiting for a warm-up token)."""
    wants_none = not (status.get("starting") or status.get("waiting"))
    return int(status.get("ready") or 0) > 0 or wants_none


def parsed(raw: bytes | str | None) -> dict[str, Any] | None:
    """A published pool, or None for nothing or what is not one (it counts as not published)."""
    try:
        pool = json.loads(raw) if raw else None
    except ValueError:
        return None
    return pool if isinstance(pool, dict) else None


def taskmanager_settled(client: redis.Redis, taskmanager_id: str) -> bool:
    """False while the TaskManager has not published its pool yet, or Redis does not answer."""
    try:
        pool = parsed(client.get(streams.tm_warm_key(taskmanager_id)))
        return pool is not None and settled(pool)
    except (redis.RedisError, ValueError, TypeError):
        return False


def no_urgent_warm_up(client: redis.Redis, taskmanager_ids: Sequence[str]) -> bool:
    """True when at least one of the TaskManagers publishes its pool and none starts a driver at
    its full priority (one with no driver ready and no task of its own: the next task or failover
    lands there, and waits for that driver's session); False when none publishes yet (a cluster
    starting) or Redis does not answer. One MGET of their keys: no SCAN of a keyspace that pipelines
    share by default."""
    if not taskmanager_ids:
        return False
    try:
        values = client.mget([streams.tm_warm_key(tm) for tm in taskmanager_ids])
    except redis.RedisError:
        return False
    pools = [pool for pool in map(parsed, values) if pool is not None]
    return bool(pools) and not any(p.get("urgent") for p in pools)
