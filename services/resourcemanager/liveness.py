"""Fast loss detection for TaskManagers that die outright.

Every TaskManager process keeps one named Redis connection open. When the process dies
(kill -9, OOM killer, host crash), the kernel closes its socket and Redis drops the client at
once, long before a heartbeat times out. A name missing on two consecutive looks counts as a
death (the ResourceManager looks every 0.5 s, and 0.1 s after a miss: a death is declared 0.1-0.6 s
after it); a frozen process (SIGSTOP, a long GC pause) keeps its socket, so heartbeats still cover
that case.

A Redis restart drops every connection at once, and a TaskManager opens its named one again only
at its next heartbeat (seconds later): a missing name is a death only if that name was seen
connected to the server's current run (its `run_id`). A TaskManager that died while Redis was
away never reconnects and is judged by its heartbeats. A Redis user without `+info` (ACLs written
before it was granted) is warned of once and judged as before: any name missing twice.
"""

from __future__ import annotations

import logging
from typing import Any

import redis

log = logging.getLogger("headrace.resourcemanager.liveness")


class ConnectionLiveness:
    def __init__(self, client: redis.Redis, *, misses_to_die: int = 2):
        self.client = client
        self.misses_to_die = misses_to_die
        self._misses: dict[str, int] = {}
        self._server_run: str | None = None
        self._seen_this_run: set[str] = set()
        self._warned = False

    def suspected(self) -> bool:
        """Whether a watched name was missing at the last look and not yet declared dead: the
        caller looks again sooner than usual."""
        return bool(self._misses)

    def look(self) -> tuple[Any, list[dict]]:
        """(INFO server, or the error refusing it; CLIENT LIST's entries) in one round trip."""
        pipe = self.client.pipeline(transaction=False)
        pipe.info("server")
        pipe.client_list(_type="normal")
        server, clients = pipe.execute(raise_on_error=False)
        if isinstance(clients, Exception):
            raise clients
        return server, clients

    def dead(self, watched: set[str], seen: tuple[Any, list[dict]] | None = None) -> set[str]:
        """Names in `watched` whose connection has been absent `misses_to_die` looks in a row,
        after being seen connected to this run of the server. `seen`: a `look()` just taken."""
        if not watched:
            return set()
        server, clients = seen if seen is not None else self.look()
        knows_runs = not isinstance(server, Exception)
        if not knows_runs and not self._warned:
            self._warned = True
            log.warning(
                "Redis refused INFO (%s): a Redis restart may be taken for TaskManager deaths; run "
                "`headrace redis-auth deploy` again (it grants the resourcemanager user +info)",
                server,
            )
        run = server.get("run_id") if knows_runs else None
        if knows_runs and run != self._server_run:  # first look, or Redis restarted: nobody reconnected yet
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
            if knows_runs and name not in self._seen_this_run:
                continue
            self._misses[name] = self._misses.get(name, 0) + 1
            if self._misses[name] >= self.misses_to_die:
                dead.add(name)
                del self._misses[name]
                self._seen_this_run.discard(name)
        return dead
