"""The compose dev stack's figures (docs/benchmarks.md, "The compose stack"): image build, stack up
to healthy, and failover inside the stack, taken from one run of tests/e2e/test_compose_stack.py
(its phase timings), cold or warm.

    python3 bench/compose_stack.py            # warm: the images, wheels and Debian base cached
    python3 bench/compose_stack.py --cold     # a fresh cache dir: a dockerd of its own on an empty
                                              # data root, no wheels, no Debian tarball

Cold still finds pyspark's wheel in pip's own cache (building it from its source archive adds
about a minute on a fresh machine). A cold run leaves its cache behind in a temporary directory
and prints where; delete it afterwards (about 3 GB).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEST = "tests/e2e/test_compose_stack.py"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cold", action="store_true", help="build everything in a fresh cache directory")
    parser.add_argument("--logs", type=Path, help="write every service's timestamped log here")
    args = parser.parse_args()
    env = dict(os.environ)
    if args.logs:
        env["HEADRACE_STACK_LOGS"] = str(args.logs.absolute())
    if args.cold:
        cache = Path(tempfile.mkdtemp(prefix="headrace-cold-cache-"))
        env["HEADRACE_CACHE"] = str(cache)
        env.pop("DOCKER_HOST", None)  # the fresh cache's own engine, not one with images already
        print(f"cold cache: {cache} (delete it afterwards)")
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = Path(f.name)
    env["HEADRACE_STACK_TIMINGS"] = str(out)
    t0 = time.monotonic()
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "0", "-x", "-q", "-s", "-p", "no:cacheprovider", TEST],
        cwd=ROOT,
        env=env,
        timeout=7200,
    )
    total = time.monotonic() - t0
    timings = json.loads(out.read_text() or "{}") if out.exists() and out.stat().st_size else {}
    out.unlink(missing_ok=True)
    print(f"\n{'cold' if args.cold else 'warm'} run, pytest exit code {run.returncode}, whole test {total:.0f} s")
    for name, seconds in timings.items():
        print(f"  {name:32} {seconds:7.1f} s")
    return run.returncode


if __name__ == "__main__":
    sys.exit(main())
