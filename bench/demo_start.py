"""How long `headrace demo --once` takes, start to printed result, before and after the
staggered warm-ups.

Each run is the README's first command in a fresh HEADRACE_HOME on a free dispatcher port.
Variants alternate run by run, so a machine that gets busier during the benchmark slows both:
  after   the working tree
  before  the code of a git revision (default HEAD), exported with `git archive` into a
          temporary directory and run from there (the installed packages are shared)
Reported per run: seconds to the printed result (what a new user waits) and, where the demo
prints it, its own breakdown (cluster start, until the task ran, run, result). Warm-up tokens
are machine-wide: other Headrace clusters on the machine (tests) delay this one's warm-ups.

usage: python bench/demo_start.py [--runs 3] [--variants after,before] [--before-rev HEAD] [--timeout 300]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._procs import free_port

REPO = Path(__file__).resolve().parent.parent
VARIANTS = ("after", "before")
RESULT = re.compile(r"^\d+ rows, \d+ events$")
TIMINGS = re.compile(
    r"timings \(s\): total ([\d.]+) = cluster start ([\d.]+) \+ until the task ran ([\d.]+) "
    r".*\+ run ([\d.]+) \+ result ([\d.]+)"
)


def export(rev: str) -> Path:
    """The tree of `rev` in a temporary directory (git archive: the checkout is not touched)."""
    target = Path(tempfile.mkdtemp(prefix="headrace-demo-before-"))
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(target)], input=archive, check=True)
    return target


def run_once(variant: str, code_dir: Path, timeout_s: float) -> dict:
    home = Path(tempfile.mkdtemp(prefix="headrace-demo-bench-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("HEADRACE_")}
    env |= {"HEADRACE_HOME": str(home), "PYTHONPATH": str(code_dir)}
    cmd = [sys.executable, "-m", "services.cli", "demo", "--once", "--port", str(free_port())]
    started = time.monotonic()
    # Every process of the cluster inherits this directory: `python -m` imports from it first.
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True, cwd=code_dir
    )
    out: list[str] = []
    result_at = None
    try:
        deadline = started + timeout_s
        for line in proc.stdout:
            out.append(line.rstrip())
            if result_at is None and RESULT.match(line.strip()):
                result_at = time.monotonic() - started
            if time.monotonic() > deadline:
                break
        proc.wait(max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        pass
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)  # the demo stops its cluster on Ctrl-C
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
    if proc.returncode == 0:
        shutil.rmtree(home, ignore_errors=True)  # kept after a failure: its logs say why
    if result_at is None:
        tail = "\n".join(out[-15:])
        return {"variant": variant, "ok": False, "error": f"no result (exit {proc.returncode}); last lines:\n{tail}"}
    m = next((TIMINGS.search(line) for line in out if TIMINGS.search(line)), None)
    rows = next((line for line in out if RESULT.match(line.strip())), "")
    parts = (
        f"cluster {m.group(2)}, until the task ran {m.group(3)}, run {m.group(4)}, result {m.group(5)}; " if m else ""
    )
    return {"variant": variant, "ok": True, "to_result": result_at, "detail": parts + rows}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3, help="runs per variant")
    p.add_argument("--variants", default="after,before")
    p.add_argument("--before-rev", default="HEAD", help="git revision of the `before` variant")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds one run may take")
    args = p.parse_args(argv)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown or args.runs < 1:
        p.error(f"variants are {', '.join(VARIANTS)} (got {unknown}); --runs must be at least 1")
    dirs = {"after": REPO}
    if "before" in variants:
        dirs["before"] = export(args.before_rev)
    load = os.getloadavg()[0]
    print(f"{os.cpu_count()} cores, load {load:.2f} at the start", flush=True)
    results = []
    for i in range(args.runs):
        for v in variants:
            r = run_once(v, dirs[v], args.timeout)
            results.append(r)
            if r["ok"]:
                print(
                    f"run {i + 1} {v:<7} result after {r['to_result']:5.1f} s  ({r['detail']}; "
                    f"load {os.getloadavg()[0]:.2f})",
                    flush=True,
                )
            else:
                print(f"run {i + 1} {v:<7} FAILED: {r['error']}", flush=True)
    if "before" in dirs:
        shutil.rmtree(dirs["before"], ignore_errors=True)
    print()
    print(f"{'variant':<12} {'runs':>4} {'median s':>9} {'min s':>6} {'max s':>6}")
    for v in variants:
        times = [r["to_result"] for r in results if r["variant"] == v and r["ok"]]
        if times:
            print(f"{v:<12} {len(times):>4} {statistics.median(times):>9.1f} {min(times):>6.1f} {max(times):>6.1f}")
        else:
            print(f"{v:<12} {0:>4} {'-':>9}")
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
