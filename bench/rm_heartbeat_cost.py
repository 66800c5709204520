"""ResourceManager heartbeat cost in isolation: N registered TaskManagers, N heartbeats queued
in a throwaway redis-server, time for the ResourceManager's loop to drain them. Separates the
RM's own cost from the CPU contention of a whole simulated cluster on one machine.

usage: python bench/rm_heartbeat_cost.py [--taskmanagers 2000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._procs import Procs
from services.resourcemanager.service import ResourceManager
from shared import cluster_keys, streams
from shared.catalog import Catalog
from shared.clock import SystemClock
from shared.message_auth import ClusterAuth, TaskManagerAuth
from shared.messages import RegisterTaskManager, SlotState, TaskManagerHeartbeat
from shared.settings import Settings
from shared.transport.redis_streams import RedisStreamsTransport


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--taskmanagers", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="headrace-rmcost-"))
    procs = Procs(work, {})
    try:
        url = procs.redis()
        settings = Settings(home=work)
        catalog = Catalog(settings.catalog)
        catalog.migrate()
        n = a.taskmanagers
        # Signed and checked as on a cluster: each heartbeat as the TaskManager it is from.
        secret = cluster_keys.parse_secret(cluster_keys.new_secret())
        rm = ResourceManager(
            settings, catalog, RedisStreamsTransport.from_url(url, sender="rm", auth=ClusterAuth(secret)), SystemClock()
        )
        tms = RedisStreamsTransport.from_url(
            url, sender="tm", auth=TaskManagerAuth([f"tm-{i}" for i in range(n)], secret=secret)
        )
        tms.publish_many(
            [
                (
                    streams.RM_STREAM,
                    RegisterTaskManager(
                        taskmanager_id=f"tm-{i}", host="h", slots=1, cores=1, memory_bytes=1, queue=f"tm.tm-{i}"
                    ),
                )
                for i in range(n)
            ]
        )
        while len(rm.slots.taskmanagers) < n:
            rm.poll_once(0)
        rm.tick()
        per_round = []
        for _ in range(a.rounds):
            tms.publish_many(
                [
                    (
                        streams.RM_HEARTBEAT_STREAM,
                        TaskManagerHeartbeat(taskmanager_id=f"tm-{i}", slot_report=(SlotState(index=0),)),
                    )
                    for i in range(n)
                ]
            )
            t0 = time.perf_counter()
            handled = 0
            while handled < n:
                handled += rm.poll_once(0)
            per_round.append(time.perf_counter() - t0)
        med = statistics.median(per_round)
        print(
            json.dumps(
                {
                    "taskmanagers": n,
                    "median_drain_s": round(med, 3),
                    "us_per_heartbeat": round(med / n * 1e6, 1),
                    "core_share_at_1hz": round(med, 3),
                },
                indent=2,
            )
        )
    finally:
        procs.stop()


if __name__ == "__main__":
    main()
