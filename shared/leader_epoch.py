"""The current JobManager leader's epoch, as receivers fence by it.

A receiver (ResourceManager, TaskManager) accepts a JobManager message only if its epoch is the
epoch of the current leader, read from Redis (`streams.JM_EPOCH_KEY`), never "the highest epoch
seen so far": a forged or corrupt message with a future epoch would otherwise make every real
message after it stale.

The key only rises (`publish` is a compare-and-set in Lua). A leader publishes its epoch when it
takes leadership (standalone: the INCR that creates it; ZooKeeper mode: after winning the
election, the epoch coming from ZooKeeper's counter) and again every few seconds, so a Redis that
restarted empty learns it back within seconds.
"""

from __future__ import annotations

import logging
import time
from typing import Callable

import redis

from shared import streams

log = logging.getLogger("headrace.leader_epoch")

# Raise the key to ARGV[1] if it is missing or lower; return the value it holds afterwards.
_PUBLISH = """
local cur = tonumber(redis.call('GET', KEYS[1]) or '0')
local new = tonumber(ARGV[1])
if new > cur then redis.call('SET', KEYS[1], ARGV[1]) return new end
return cur
"""


def publish(client: redis.Redis, epoch: int) -> int:
    """Make `epoch` the published leader epoch unless a newer one is there; returns the newest."""
    return int(client.eval(_PUBLISH, 1, streams.JM_EPOCH_KEY, int(epoch)))


def current(client: redis.Redis) -> int | None:
    raw = client.get(streams.JM_EPOCH_KEY)
    return int(raw) if raw is not None else None


class LeaderEpochFence:
    """`accept(epoch)`: is this the current leader's epoch? Reads Redis at most every
    `refresh_s` while epochs match, and at once when one differs (a new leader has just
    published: its first messages must not be refused for a stale cache)."""

    def __init__(
        self, read: Callable[[], int | None], *, refresh_s: float = 1.0, clock: Callable[[], float] = time.monotonic
    ):
        self._read, self._refresh_s, self._clock = read, refresh_s, clock
        self._epoch: int | None = None
        self._read_at = -1e18

    @classmethod
    def from_redis(cls, client: redis.Redis, **kw) -> "LeaderEpochFence":
        return cls(lambda: current(client), **kw)

    @property
    def epoch(self) -> int | None:
        return self._epoch

    def accept(self, epoch: int) -> bool:
        now = self._clock()
        if epoch != self._epoch or now - self._read_at >= self._refresh_s:
            try:
                self._epoch = self._read()
                self._read_at = now
            except redis.RedisError:
                log.warning("cannot read the leader epoch; judging by the last one read (%s)", self._epoch)
        return self._epoch is not None and epoch == self._epoch
