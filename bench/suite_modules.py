"""Test modules' cost: wall time and the whole machine's busy CPU while they run, in one process.

The suite's wall time on two cores is its CPU (docs/benchmarks.md, "The test suite"): a change that
makes a module cheaper shows here before it shows in a whole run, and side by side with the code
before it, which a whole run of 20-30 minutes on a noisy machine cannot give. Each round runs the
modules once per variant, alternating; a variant (--variant name=DIR[,NAME=VALUE...]) is a checkout,
run as the working directory and only PYTHONPATH entry, with optional environment settings.

usage: python3 bench/suite_modules.py --rounds 2 \\
           --variant "before=/tmp/old" --variant "after=." tests/e2e/test_clickstream_e2e.py
       python3 bench/suite_modules.py --variant "query=.,HEADRACE_WARM_UP_QUERY=true" \\
           --variant "no-query=.,HEADRACE_WARM_UP_QUERY=false" tests/e2e/test_storage_and_restarts_e2e.py
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.cluster_start import busy_cpu_s


def parse_variant(text: str) -> tuple[str, Path, dict[str, str]]:
    """ "name=DIR[,NAME=VALUE...]" -> (name, checkout, environment)."""
    name, _, rest = text.partition("=")
    checkout, *settings = rest.split(",")
    if not name or not checkout:
        raise SystemExit(f"--variant {text!r}: expected name=DIR[,NAME=VALUE...]")
    env = {}
    for item in settings:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--variant {text!r}: {item!r} is not NAME=VALUE")
        env[key] = value
    return name, Path(checkout).resolve(), env


def run_modules(checkout: Path, env: dict[str, str], modules: list[str], log: Path) -> dict:
    environment = {**os.environ, "CI": "true", "PYTHONPATH": str(checkout), **env}
    t0, cpu0 = time.monotonic(), busy_cpu_s()
    with open(log, "wb") as out:
        rc = subprocess.call(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", *modules],
            cwd=checkout,
            env=environment,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    return {
        "rc": rc,
        "wall_s": time.monotonic() - t0,
        "cpu_s": busy_cpu_s() - cpu0,
        "summary": log.read_text(errors="replace").strip().splitlines()[-1:],
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("modules", nargs="+")
    p.add_argument("--variant", action="append", required=True, help="name=DIR[,NAME=VALUE...]; repeat to compare")
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    variants = [parse_variant(v) for v in args.variant]
    if len({name for name, _, _ in variants}) != len(variants):
        raise SystemExit("--variant: each needs a name of its own")
    logs = Path(tempfile.mkdtemp(prefix="suite-modules-"))
    results: dict[str, list[dict]] = {name: [] for name, _, _ in variants}
    for i in range(args.rounds):
        order = variants if i % 2 == 0 else variants[::-1]  # neither always runs first
        for name, checkout, env in order:
            r = run_modules(checkout, env, args.modules, logs / f"{name}-{i + 1}.log")
            results[name].append(r)
            print(
                f"round {i + 1} {name}: wall {r['wall_s']:.1f} s, machine busy {r['cpu_s']:.1f} CPU-s, "
                f"exit {r['rc']} {r['summary']} (load {os.getloadavg()[0]:.2f})",
                flush=True,
            )
    for name, rs in results.items():
        print(
            f"median {name}: wall {statistics.median(r['wall_s'] for r in rs):.1f} s, "
            f"busy {statistics.median(r['cpu_s'] for r in rs):.1f} CPU-s",
            flush=True,
        )
    print(f"logs: {logs}")


if __name__ == "__main__":
    main()
