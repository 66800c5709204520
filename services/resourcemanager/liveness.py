"""Fast loss detection for TaskManagers that die outright.

Every TaskManager process keeps one named Redis connection open. When the process dies
(kill -9, OOM killer, host crash), the kernel closes its socket and Redis drops the client at
once, long before a heartbeat times out. A name missing on two consecutive looks counts as a
death; a frozen process (SIGSTOP, a long GC pause) keeps its socket, so heartbeats still cover
that case.

A Redis restart drops every connection at once, and a TaskManager opens its named one again only
at its next heartbeat (seconds later): a missing name is a death only if that name was seen
connected to the server's current run (its `run_id`). A TaskManager that died while Redis was
away never reconnects and is judged by its heartbeats.
"""

from __future__ import annotations

import redis


class ConnectionLiveness:
    def __init__(self, client: redis.Redis, *, misses_to_die: int = 2):
        self.client = client
        self.misses_to_die = misses_to_die
        self._misses: dict[str, int] = {}
        self._server_run: str | None = None
        self._seen_this_run: set[str] = set()

    def dead(self, watched: set[str]) -> set[str]:
        """Names in `watched` whose connection has been absent `misses_to_die` looks in a row,
        after being seen connected to this run of the server."""
        if not watched:
            return set()
        pipe = self.client.pipeline(transaction=False)
        pipe.info("server")
        pipe.client_list(_type="normal")
        server, clients = pipe.execute()
        run = server.get("run_id")
        if run != self._server_run:  # first look, or Redis restarted: nobody has had time to reconnect
            self._server_run = run
            self._seen_this_run.clear()
            self._misses.clear()
        present = {c.get("name") for c in clients}
        self._seen_this_run &= watched
        dead = set()
        for name in watched:
            if name in present:
                self._seen_this_run.add(name)
                self._misses.pop(name, None)
                continue
            if name not in self._seen_this_run:
                continue
            self._misses[name] = self._misses.get(name, 0) + 1
            if self._misses[name] >= self.misses_to_die:
                dead.add(name)
                del self._misses[name]
                self._seen_this_run.discard(name)
        return dead
