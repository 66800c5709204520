"""What suspended deployments cost the leading JobManager: N deployments SUSPENDED in a throwaway
PostgreSQL catalog, the real DeploymentReconciler ticked as the leader's loop ticks it (every
0.2 s) for a while, and the CPU this process spent per second of that (cores).

usage: python bench/suspended_deployments.py [--deployments 500] [--seconds 20]
       [--catalog postgresql://postgres@127.0.0.1:5432/postgres] [--checkout DIR]
--checkout: import Headrace from another checkout (side-by-side comparisons).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

parser = argparse.ArgumentParser()
parser.add_argument("--deployments", type=int, default=500)
parser.add_argument("--seconds", type=float, default=20.0)
parser.add_argument("--catalog", default="postgresql://postgres@127.0.0.1:5432/postgres")
parser.add_argument("--checkout", default=str(Path(__file__).resolve().parent.parent))
args = parser.parse_args()
sys.path.insert(0, args.checkout)

from bench.control_plane_scale import drop_pg, fresh_pg  # noqa: E402
from services.jobmanager.deployment_reconciler import DeploymentReconciler  # noqa: E402
from services.jobmanager.job_master import JobMaster  # noqa: E402
from shared.catalog import Catalog  # noqa: E402
from shared.catalog.models import DeploymentRow, utcnow  # noqa: E402
from shared.clock import SystemClock, WallClock  # noqa: E402
from shared.settings import Settings  # noqa: E402
from shared.transport import InMemoryTransport  # noqa: E402

SPEC = {
    "jarId": "0" * 32,
    "entryClass": "build",
    "kind": "noop",
    "programArgsList": [],
    "parallelism": 1,
    "flinkConfiguration": {},
    "restartStrategy": {"type": "none"},
    "upgradeMode": "savepoint",
    "state": "suspended",
    "rollback": {"enabled": True, "readyWithin": 60.0},
    "savepoints": {"interval": None, "historyMax": 5},
}


def main() -> None:
    url = fresh_pg(args.catalog)
    try:
        catalog = Catalog(url)
        catalog.migrate()
        with catalog.session() as s:
            now = utcnow()
            s.add_all(
                [
                    DeploymentRow(
                        name=f"d{i:04d}",
                        spec=SPEC,
                        generation=1,
                        deleting=False,
                        delete_with_savepoint=True,
                        rollback_requested=False,
                        lifecycle="SUSPENDED",
                        created_at=now,
                        updated_at=now,
                    )
                    for i in range(args.deployments)
                ]
            )
        settings = Settings(home=Path("/tmp/headrace-bench-suspended"), catalog=url)
        master = JobMaster(
            settings,
            catalog,
            InMemoryTransport(sender="jobmanager", epoch=1),
            gateway=None,
            clock=SystemClock(),
            epoch=1,
        )
        with master.unit_of_work():
            master.recover()
        reconciler = DeploymentReconciler(master, settings, WallClock())
        reconciler.tick()  # the first pass looks at every deployment, as a new leader's does
        passes, wall0, cpu0 = 0, time.monotonic(), time.process_time()
        while time.monotonic() - wall0 < args.seconds:
            if reconciler.due():
                reconciler.tick()
                passes += 1
            time.sleep(0.01)
        wall, cpu = time.monotonic() - wall0, time.process_time() - cpu0
        catalog.dispose()
        print(
            json.dumps(
                {
                    "deployments": args.deployments,
                    "passes": passes,
                    "seconds": round(wall, 1),
                    "cores": round(cpu / wall, 3),
                    "checkout": args.checkout,
                }
            )
        )
    finally:
        drop_pg(args.catalog, url)


if __name__ == "__main__":
    main()
