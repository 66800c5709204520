"""Which TaskManagers' report streams the ResourceManager reads (streams.tm_rm_stream).

Each TaskManager process writes its registrations and heartbeats to a stream of its own, so no
TaskManager can trim what another reports (issue 43.8). The ResourceManager learns the streams:
- from the catalog at start: every TaskManager the previous ResourceManager registered (by its
  command queue, which a simulating process's TaskManagers share with its streams);
- from CLIENT LIST, which it reads every half second anyway for TaskManager liveness: a
  TaskManager process names its publishing connections `hr-reports-<id>` (streams.reporter_name).
  With Redis ACLs the name counts only from the user `taskmanager.<id>` itself (or the admin, as a
  benchmark's simulating process is): a TaskManager cannot make the ResourceManager read another's
  stream, nor invent streams for it to keep.
A stream once learnt is read for good (a TaskManager that comes back writes there again); the
groups are created from "0", so a registration written before its stream was found is read.
"""

from __future__ import annotations

import logging
from typing import Iterable

from shared import streams
from shared.catalog import Catalog
from shared.catalog import repository as repo
from shared.ids import TASKMANAGER_ID

log = logging.getLogger("headrace.resourcemanager")
ADMIN_USER = "default"


class ReportStreams:
    def __init__(self) -> None:
        self._names: dict[str, None] = {}  # insertion-ordered set of stream names

    def names(self) -> list[str]:
        return list(self._names)

    def add(self, reporter: str) -> bool:
        """Read `reporter`'s stream from now on; True when it is new."""
        name = streams.tm_rm_stream(reporter)
        if name in self._names:
            return False
        self._names[name] = None
        log.info("reading the reports of TaskManager %s (%s)", reporter, name)
        return True

    def load(self, catalog: Catalog) -> None:
        with catalog.session() as s:
            for tm in repo.list_taskmanagers(s):
                reporter = streams.reporter_of_queue(tm.queue)
                if reporter is not None:
                    self.add(reporter)

    def discover(self, clients: Iterable[dict]) -> None:
        """Learn the streams of the TaskManager processes connected now (CLIENT LIST's entries)."""
        for c in clients:
            name = str(c.get("name") or "")
            if not name.startswith(streams.REPORTER_NAME_PREFIX):
                continue
            reporter = name[len(streams.REPORTER_NAME_PREFIX) :]
            user = str(c.get("user") or ADMIN_USER)
            if not TASKMANAGER_ID.fullmatch(reporter) or user not in (ADMIN_USER, f"taskmanager.{reporter}"):
                continue  # a TaskManager naming itself after another: its name counts for nothing
            self.add(reporter)
