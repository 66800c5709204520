"""K simulated TaskManagers in one process, for the control-plane benchmarks
(control_plane_scale.py, taskmanager_intake.py; started through _procs.Procs.simulated_fleet).

Composed here from the TaskManager's own parts (services/taskmanager/__main__.py, ProcessParts),
without what a real one has: no Spark or jar check, no driver sandbox and no drivers (no-op tasks
only), no artifact check, no log guard, endpoint announcement or storage probe. The TaskManagers
are <id>-sim00000, <id>-sim00001, ...; they share their process's command queue (a Celery worker
polling thousands of queues spends its time building BRPOP commands instead of running commands)
and say so in their registrations (`simulated`, which the ResourceManager's check of the queue
allows: shared/message_auth.py). The keys come from the cluster secret (a simulating process
serves more than one TaskManager).

usage: python bench/simulated_taskmanagers.py K [--slots N] [--id ID]
       (settings from HEADRACE_* / HEADRACE_CONFIG, as every service)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from services.cli.common import settings_or_fail
from services.taskmanager.__main__ import ProcessParts, keys_or_exit
from shared import streams
from shared.ids import TaskManagerId, new_taskmanager_id
from shared.logs import configure_logging
from shared.settings import Settings


def run(settings: Settings, count: int, *, slots: int | None = None, taskmanager_id: str | None = None) -> None:
    configure_logging("taskmanager", settings.log_level)
    slots = slots or settings.taskmanager_slots
    base_id = TaskManagerId(taskmanager_id) if taskmanager_id else new_taskmanager_id()
    ids = [TaskManagerId(f"{base_id}-sim{i:05d}") for i in range(count)]
    parts = ProcessParts(settings, base_id, ids, slots, keys_or_exit(settings, base_id, ids))
    parts.supervise(lambda: None)
    app = parts.commands(None)
    parts.serve_metrics(None)
    queue = streams.tm_queue(base_id)
    link = parts.link(queue_of=lambda _tm: queue, log_endpoint=None, simulated=True)
    parts.work(app, link, [queue], started=f", {count} simulated", without_heartbeat=True)


def main() -> None:
    ap = argparse.ArgumentParser(description="K simulated TaskManagers (no-op tasks only) in one process")
    ap.add_argument("count", type=int, help="how many TaskManagers")
    ap.add_argument("--slots", "-s", type=int, default=None, help="slots of each (default: taskmanager_slots)")
    ap.add_argument("--id", default=None, help="the process's id, prefix of its TaskManagers' (default: host-random)")
    a = ap.parse_args()
    if a.count < 1 or (a.slots is not None and a.slots < 1):
        ap.error("K and --slots must be at least 1")
    run(settings_or_fail(), a.count, slots=a.slots, taskmanager_id=a.id)


if __name__ == "__main__":
    main()
