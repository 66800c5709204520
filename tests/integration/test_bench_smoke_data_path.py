"""The data-path and footprint benchmarks of issue 10 still run: each with --smoke (tiny sizes).

Not measurements: they fail when a benchmark breaks (a cluster or the bare script that does not
start, a sink that miscounts, figures missing from the output). Like the checkpoint benchmarks'
smoke runs they take minutes together, so they run only when asked:

    HEADRACE_BENCH_SMOKE=1 python3 -m pytest tests/integration/test_bench_smoke_data_path.py
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import missing

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420),
              pytest.mark.skipif(os.environ.get("HEADRACE_BENCH_SMOKE") != "1",
                                 reason="benchmark smoke runs take minutes: set HEADRACE_BENCH_SMOKE=1")]

ROOT = Path(__file__).resolve().parents[2]


def run_bench(script: str, *args: str, timeout_s: float = 400) -> str:
    if not shutil.which("redis-server"):
        missing("redis-server")
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / script), "--smoke", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout_s, start_new_session=True)
    assert proc.returncode == 0, f"{script} --smoke exited {proc.returncode}:\n{proc.stderr[-4000:]}"
    return proc.stdout


def test_throughput_smoke_runs_both_sides_to_exact_counts():
    out = run_bench("throughput.py")
    # watch_sink fails the run unless the sink counted exactly every event
    assert re.search(r"round 1 headrace .* total +[\d,]+ ev/s", out), out
    assert re.search(r"round 1 bare .* total +[\d,]+ ev/s", out), out
    assert "ratio headrace / bare" in out, out


def test_latency_smoke_reports_percentiles():
    out = run_bench("latency.py")
    m = re.search(r"headrace (\d+) events: p50 ([\d.]+) s .* p99 ([\d.]+) s", out)
    assert m and int(m.group(1)) == 500 and 0 < float(m.group(2)) <= float(m.group(3)), out


def test_memory_smoke_reports_every_service_and_driver():
    out = run_bench("memory.py")
    assert "JobManager + ResourceManager + dispatcher:" in out, out
    assert out.count("warm driver of taskmanager-") == 2, out
