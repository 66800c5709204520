"""What a TaskManager's signed registration claims that is not its own to claim (issue 43.6, 43.11).

A signature proves which TaskManager registers, not that what it says is true. Two claims reach
beyond itself and are checked here before anything acts on them:

- **Allocations it reports running.** Believed, a registration that lists another TaskManager's
  allocation as its own moves that allocation here, and the JobManager releases it as a zombie's:
  the other TaskManager's slots are given away while its task still runs. So each claimed
  allocation is matched against the catalog's placement (the live attempt holding it, and the
  TaskManager that attempt was deployed to) and, where the catalog has none, against the
  allocations this ResourceManager holds: one placed on another TaskManager is ignored, with the
  report of its task, and dead-lettered naming both.
- **Where it serves its logs.** The dispatcher fetches a TaskManager's logs for operators from the
  address its registration names (never from a key the TaskManager could rewrite at any time),
  kept in `hr:rm:tm-endpoints`, and only when it is an http(s)://host:port (shared/log_access.py).
  Another address is dead-lettered and not kept.
"""

from __future__ import annotations

import json
import logging
from typing import Callable

from services.resourcemanager.slot_manager import Allocation
from shared import streams
from shared.catalog import Catalog
from shared.catalog import repository as repo
from shared.ids import AllocationId, TaskManagerId
from shared.log_access import endpoint_problem
from shared.messages import Envelope, RegisterTaskManager, encode
from shared.transport import dead_letters

log = logging.getLogger("headrace.resourcemanager")


class RegistrationClaims:
    """`held(allocation id)`: the allocation this ResourceManager holds under that id, if any.
    `client`: Redis for the endpoints and the dead letters (None: a transport without Redis)."""

    def __init__(self, catalog: Catalog, held: Callable[[AllocationId], Allocation | None], client) -> None:
        self.catalog, self.held, self.client = catalog, held, client
        self._endpoints: dict[TaskManagerId, str | None] = {}  # to write (None: to delete)
        # Those with an endpoint kept: only theirs are deleted (a fleet of simulated TaskManagers
        # registers none, and must not cost a deletion each).
        self._kept: set[TaskManagerId] = set()

    def allocations(
        self, env: Envelope, occupied: dict[int, Allocation]
    ) -> tuple[dict[int, Allocation], set[AllocationId]]:
        """(the claimed allocations it may have, the ids refused): those of its slot report and of
        the tasks it reports running."""
        msg = env.body
        assert isinstance(msg, RegisterTaskManager)
        tm = msg.taskmanager_id
        claimed = {a.allocation_id for a in occupied.values()} | {
            r.allocation_id for r in msg.running if r.allocation_id
        }
        if not claimed:
            return occupied, set()
        try:
            with self.catalog.session() as s:
                placed = repo.live_placements(s, claimed)
        except Exception as exc:  # noqa: BLE001 - the catalog away: this ResourceManager's own memory decides
            log.warning(
                "cannot read where the catalog places %d allocations claimed by %s (%s); judging them by "
                "what this ResourceManager holds",
                len(claimed),
                tm,
                exc,
            )
            placed = {}
        refused: dict[AllocationId, TaskManagerId] = {}
        for alloc_id in claimed:
            elsewhere = placed.get(alloc_id)
            if elsewhere is None:
                held = self.held(alloc_id)
                elsewhere = held.taskmanager_id if held is not None else None
            if elsewhere is not None and elsewhere != tm:
                refused[alloc_id] = elsewhere
        if refused:
            listed = ", ".join(f"{a} (placed on {where})" for a, where in sorted(refused.items()))
            self._dead_letter(
                env,
                f"RegisterTaskManager of {tm} claims allocations placed on other TaskManagers: "
                f"{listed}; those claims (and their tasks' reports) are ignored",
            )
        return {i: a for i, a in occupied.items() if a.allocation_id not in refused}, set(refused)

    def endpoint(self, env: Envelope) -> None:
        msg = env.body
        assert isinstance(msg, RegisterTaskManager)
        address = msg.log_endpoint
        if address is not None:
            problem = endpoint_problem(address)
            if problem is not None:
                self._dead_letter(
                    env,
                    f"RegisterTaskManager of {msg.taskmanager_id} names log endpoint "
                    f"{address[:200]!r}: {problem}; it is not used",
                )
                address = None
        if address is not None:
            self._endpoints[msg.taskmanager_id] = json.dumps({"address": address, "log": msg.main_log})
            self._kept.add(msg.taskmanager_id)
        else:
            self.gone(msg.taskmanager_id)

    def gone(self, tm: TaskManagerId) -> None:
        if tm in self._kept:
            self._kept.discard(tm)
            self._endpoints[tm] = None

    def flush(self) -> None:
        """Write the endpoints learnt since the last flush (one round trip)."""
        if not self._endpoints or self.client is None:
            self._endpoints.clear()
            return
        changes, self._endpoints = self._endpoints, {}
        pipe = self.client.pipeline(transaction=False)
        for tm, value in changes.items():
            if value is None:
                pipe.hdel(streams.RM_TM_ENDPOINTS_KEY, tm)
            else:
                pipe.hset(streams.RM_TM_ENDPOINTS_KEY, tm, value)
        try:
            pipe.execute()
        except Exception:
            self._endpoints = changes | self._endpoints  # newer changes win; tried again next flush
            raise

    def _dead_letter(self, env: Envelope, error: str) -> None:
        log.warning("%s", error)
        if self.client is not None:
            dead_letters.add_safely(
                self.client,
                error=error,
                original={"m": encode(env)},
                origin={"check": "registration claims", "sender": env.sender},
            )
