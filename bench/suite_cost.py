"""The whole test suite's cost, measured apart from how fast the machine is that day.

This machine's speed varies about twofold from day to day: one running counting job has cost
0.32 busy cores on a fast day and 0.71 on a slow one (bench/job_cpu.py). A whole run's wall time
follows it, so a wall time alone cannot say whether the suite got cheaper. This runs, in one go:

  bench/job_cpu.py (one counting job, the suite's JVM options)   -> the day's speed, before
  CI=true python3 -m pytest in --checkout                        -> wall time, busy core-seconds
  bench/job_cpu.py again                                         -> the day's speed, after

and prints the run's busy core-seconds divided by the job's cores (the suite's work in units of
"one job running for a second" on that day's machine), and the wall time the same run would take on
a machine where the job costs --reference-job-cores (default 0.32, the fastest day measured,
2026-11-28 night) at the same use of the cores.

usage: python3 bench/suite_cost.py [--checkout DIR] [--reference-job-cores 0.32] [-- <pytest args>]
(--checkout: a clean worktree of the commit to measure, e.g. `git worktree add /tmp/wt HEAD`;
default this checkout)
"""

from __future__ import annotations

import argparse
import ast
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.checkpoint_overhead import machine  # noqa: E402
from bench.cluster_start import busy_cpu_s  # noqa: E402

JOB_CPU = [
    sys.executable,
    str(ROOT / "bench" / "job_cpu.py"),
    "--suite-jvm",
    "--setting",
    "1 second,2 s,4",
    "--rounds",
    "1",
    "--seconds",
    "30",
    "--settle",
    "15",
]
JOB_CPU_TIMEOUT_S = 600
SUITE_TIMEOUT_S = 90 * 60  # CI's own limit


def job_cores() -> float:
    """One counting job's busy cores on the machine as it is now (bench/job_cpu.py's last line)."""
    try:
        done = subprocess.run(JOB_CPU, capture_output=True, text=True, timeout=JOB_CPU_TIMEOUT_S, cwd=ROOT)
    except subprocess.TimeoutExpired:
        raise SystemExit(f"bench/job_cpu.py did not finish within {JOB_CPU_TIMEOUT_S} s") from None
    if done.returncode != 0:
        raise SystemExit(f"bench/job_cpu.py failed ({done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    last = (done.stdout.strip().splitlines() or [""])[-1]
    try:
        return float(ast.literal_eval(last)["busy_cores"])
    except (ValueError, SyntaxError, KeyError, TypeError):
        raise SystemExit(f"bench/job_cpu.py's last line has no busy_cores figure: {last!r}") from None


def run_suite(checkout: Path, pytest_args: list[str]) -> dict:
    env = {**os.environ, "CI": "true", "PYTHONPATH": str(checkout)}
    t0, cpu0 = time.monotonic(), busy_cpu_s()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *pytest_args],
            cwd=checkout,
            env=env,
            capture_output=True,
            text=True,
            timeout=SUITE_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        raise SystemExit(f"the suite did not finish within {SUITE_TIMEOUT_S // 60} min (CI's limit)") from None
    wall, busy = time.monotonic() - t0, busy_cpu_s() - cpu0
    summary = (done.stdout.strip().splitlines() or ["(no output)"])[-1]
    return {
        "exit_code": done.returncode,
        "summary": summary,
        "wall_s": round(wall, 1),
        "busy_core_s": round(busy, 1),
        "busy_cores": round(busy / wall, 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkout", type=Path, default=ROOT)
    ap.add_argument("--reference-job-cores", type=float, default=0.32)
    ap.add_argument("pytest_args", nargs="*", help="after --: passed to pytest")
    opts = ap.parse_args()
    if opts.reference_job_cores <= 0:
        ap.error(f"--reference-job-cores {opts.reference_job_cores}: expected a positive number of cores, e.g. 0.32")
    if not (opts.checkout / "pyproject.toml").exists():
        ap.error(f"--checkout {opts.checkout}: no pyproject.toml there; give a checkout of this project")
    print(machine(), flush=True)
    before = job_cores()
    print({"job_cores_before": before}, flush=True)
    suite = run_suite(opts.checkout.resolve(), opts.pytest_args)
    print(suite, flush=True)
    after = job_cores()
    low, high = sorted((before, after))
    reference = opts.reference_job_cores
    # The same work at the same use of the cores on the reference machine.
    ref_wall = [suite["wall_s"] * reference / cores for cores in (high, low)]
    print(
        {
            "job_cores_after": after,
            "work_in_job_seconds": [round(suite["busy_core_s"] / high), round(suite["busy_core_s"] / low)],
            f"minutes_at_{reference}_cores_per_job": [round(w / 60, 1) for w in ref_wall],
        },
        flush=True,
    )
    if suite["exit_code"] != 0:
        raise SystemExit(f"the suite failed: {suite['summary']}")


if __name__ == "__main__":
    main()
