"""The restore compatibility check's planner (services/taskmanager/runtime/planner.py, started by
services/dispatcher/submission/restore_check.py for a changed pipeline): how long one check takes with and
without the drivers' class-data-sharing archive, and on the dispatcher's warm planner
(services/dispatcher/submission/warm_planner.py: a spare started after the previous check, given time to get
ready as it has between two upgrades), alternating, on this machine.

usage: python bench/planner_start.py [--runs 4]
Figures go to docs/benchmarks.md ("Deployments").
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from services.dispatcher.submission.restore_check import run_planner
from services.dispatcher.submission.warm_planner import WarmPlanner
from shared.settings import Settings
from shared.spark_runtime import SparkRuntime

ROOT = Path(__file__).resolve().parent.parent
ARGS = ["--stream", "bench", "--sink", "sql", "--table", "t", "--sink-url", "sqlite:////tmp/never-opened.db"]


def once(archive_dir: Path | None) -> float:
    t0 = time.monotonic()
    result = run_planner(
        python=sys.executable,
        artifact_path=str(ROOT / "examples" / "keyed_counts.py"),
        entry="build",
        args=ARGS,
        config={},
        parallelism=1,
        timeout_s=300,
        runtime=SparkRuntime(Settings().jar_cache_dir, archive_dir),
    )
    took = time.monotonic() - t0
    if not (result or {}).get("ok"):
        raise SystemExit(f"the planner failed: {result}")
    return took


def warm_once(warm: WarmPlanner, ready_after_s: float) -> float:
    warm.replenish()
    time.sleep(ready_after_s)  # between two upgrades the spare has had its time to start
    t0 = time.monotonic()
    result = warm.plan(
        artifact_path=str(ROOT / "examples" / "keyed_counts.py"),
        entry="build",
        args=ARGS,
        config={},
        parallelism=1,
        timeout_s=300,
    )
    took = time.monotonic() - t0
    if not (result or {}).get("ok"):
        raise SystemExit(f"the warm planner gave no result: {result}")
    return took


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=4)
    ap.add_argument("--ready-after", type=float, default=15.0, help="seconds a spare gets before its check")
    a = ap.parse_args()
    archive_dir = Settings().driver_class_archive_dir
    once(None)  # the first run pays for the page cache; not counted
    warm = WarmPlanner(
        python=sys.executable,
        run_as=None,
        catalog_url=None,
        redis_url=None,
        runtime=SparkRuntime(Settings().jar_cache_dir, archive_dir),
    )
    without, with_archive, warmed = [], [], []
    try:
        for _ in range(a.runs):
            without.append(once(None))
            with_archive.append(once(archive_dir))
            warmed.append(warm_once(warm, a.ready_after))
    finally:
        warm.close()
    for name, runs in (
        ("cold, no archive", without),
        ("cold, with the archive", with_archive),
        ("warm planner", warmed),
    ):
        print(f"{name:24} median {statistics.median(runs):.2f} s  runs {' '.join(f'{r:.2f}' for r in runs)}")
    print(
        f"with the archive / without: {statistics.median(with_archive) / statistics.median(without):.2f}; "
        f"warm / cold with the archive: {statistics.median(warmed) / statistics.median(with_archive):.2f}"
    )


if __name__ == "__main__":
    main()
