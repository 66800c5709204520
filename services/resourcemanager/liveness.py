"""Fast loss detection for TaskManagers that die outright.

Every TaskManager process keeps one named Redis connection open. When the process dies
(kill -9, OOM killer, host crash), the kernel closes its socket and Redis drops the client at
once, long before a heartbeat times out. A name missing on two consecutive looks counts as a
death; a frozen process (SIGSTOP, a long GC pause) keeps its socket, so heartbeats still cover
that case.
"""

from __future__ import annotations

import redis


class ConnectionLiveness:
    def __init__(self, client: redis.Redis, *, misses_to_die: int = 2):
        self.client = client
        self.misses_to_die = misses_to_die
        self._misses: dict[str, int] = {}

    def dead(self, watched: set[str]) -> set[str]:
        """Names in `watched` whose connection has been absent `misses_to_die` looks in a row."""
        if not watched:
            return set()
        present = {c.get("name") for c in self.client.client_list(_type="normal")}
        dead = set()
        for name in watched:
            if name in present:
                self._misses.pop(name, None)
                continue
            self._misses[name] = self._misses.get(name, 0) + 1
            if self._misses[name] >= self.misses_to_die:
                dead.add(name)
                del self._misses[name]
        return dead
