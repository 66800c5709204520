"""The restore compatibility check's planner (services/taskmanager/runtime/planner.py, started by
services/dispatcher/restore_check.py for a changed pipeline): how long one check takes with and
without the drivers' class-data-sharing archive, alternating, on this machine.

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

from services.dispatcher.restore_check import run_planner
from shared.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
ARGS = ["--stream", "bench", "--sink", "sql", "--table", "t", "--sink-url", "sqlite:////tmp/never-opened.db"]


def once(archive_dir: Path | None) -> float:
    t0 = time.monotonic()
    result = run_planner(python=sys.executable, artifact_path=str(ROOT / "examples" / "keyed_counts.py"),
                         entry="build", args=ARGS, config={}, parallelism=1, timeout_s=300,
                         class_archive_dir=archive_dir)
    took = time.monotonic() - t0
    if not (result or {}).get("ok"):
        raise SystemExit(f"the planner failed: {result}")
    return took


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=4)
    a = ap.parse_args()
    archive_dir = Settings().driver_class_archive_dir
    once(None)  # the first run pays for the page cache; not counted
    without, with_archive = [], []
    for _ in range(a.runs):
        without.append(once(None))
        with_archive.append(once(archive_dir))
    for name, runs in (("without the archive", without), ("with the archive", with_archive)):
        print(f"{name:22} median {statistics.median(runs):.2f} s  runs {' '.join(f'{r:.2f}' for r in runs)}")
    print(f"with / without: {statistics.median(with_archive) / statistics.median(without):.2f}")


if __name__ == "__main__":
    main()
