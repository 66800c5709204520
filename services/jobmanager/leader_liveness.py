"""Is the leading JobManager's process still alive? Asked by a standby in ZooKeeper mode.

A killed leader's ZooKeeper session lives on until it expires (10 s by default), and so does its
lock node: waiting for it is most of a failover. Every JobManager names its Redis connections
(`streams.jm_liveness_name`), and the kernel closes them the moment the process dies, so a
standby that sees the leader's name vanish can depose it at once (it deletes the leader's lock
node). A paused leader (SIGSTOP, a long GC pause) keeps its sockets: it is left to ZooKeeper.

Only a leader whose connection this standby has seen can be declared dead (an older JobManager
that does not name its connections is never deposed this way), and only after its name has been
absent for `absent_for_s` while this standby's own Redis calls succeed: after a Redis restart
every connection is gone for a moment, and the leader reconnects within a few hundred ms.
Deposing a live leader by mistake costs a leader change, not correctness: the catalog's
leadership row and the receivers' epoch check fence it (docs/architecture.md, "Fencing").
"""

from __future__ import annotations

import logging
import time
from typing import Callable

import redis

from shared import streams

log = logging.getLogger("headrace.jobmanager.liveness")


class LeaderConnection:
    def __init__(self, client: redis.Redis, *, absent_for_s: float = 0.75, clock: Callable[[], float] = time.monotonic):
        self.client, self.absent_for_s, self.clock = client, absent_for_s, clock
        self._seen: set[str] = set()
        self._absent_since: dict[str, float] = {}

    def dead(self, leader_id: str) -> bool:
        name = streams.jm_liveness_name(leader_id)
        try:
            names = {c.get("name") for c in self.client.client_list(_type="normal")}
        except redis.RedisError:
            self._absent_since.clear()  # we cannot tell; Redis may be restarting
            return False
        now = self.clock()
        if name in names:
            self._seen.add(name)
            self._absent_since.pop(name, None)
            return False
        if name not in self._seen:
            return False
        since = self._absent_since.setdefault(name, now)
        if now - since >= self.absent_for_s:
            log.warning(
                "the leading JobManager %s has had no Redis connection for %.1f s: its process is gone",
                leader_id,
                now - since,
            )
            return True
        return False
