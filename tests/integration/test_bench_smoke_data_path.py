"""The data-path and footprint benchmarks of issue 10 still run: each with --smoke (tiny sizes).

Not measurements: they fail when a benchmark breaks (a cluster or the bare script that does not
start, a sink that miscounts, figures missing from the output). Like the checkpoint benchmarks'
smoke runs they take minutes together, so they run only when asked:

    HEADRACE_BENCH_SMOKE=1 python3 -m pytest tests/integration/test_bench_smoke_data_path.py
"""

from __future__ import annotations

import os
import re

import pytest

from tests.integration.bench_runs import run_smoke

pytestmark = [
    pytest.mark.timeout(420),
    pytest.mark.skipif(
        os.environ.get("HEADRACE_BENCH_SMOKE") != "1",
        reason="benchmark smoke runs take minutes: set HEADRACE_BENCH_SMOKE=1",
    ),
]


def test_throughput_smoke_runs_both_sides_to_exact_counts():
    out = run_smoke("throughput.py")
    # watch_sink fails the run unless the sink counted exactly every event
    assert re.search(r"round 1 headrace .* total +[\d,]+ ev/s", out), out
    assert re.search(r"round 1 bare .* total +[\d,]+ ev/s", out), out
    assert "ratio headrace / bare" in out, out


def test_latency_smoke_reports_percentiles():
    out = run_smoke("latency.py")
    m = re.search(r"headrace-latency +(\d+) events: p50 ([\d.]+) s .* p99 ([\d.]+) s", out)
    assert m and int(m.group(1)) == 500 and 0 < float(m.group(2)) <= float(m.group(3)), out


def test_latency_profile_smoke_reports_every_phase():
    out = run_smoke("latency_profile.py")
    for phase in ("walCommit", "addBatch", "triggerExecution", "collect", "callback"):
        assert re.search(rf"{phase} +median +[\d.]+ ms", out), (phase, out)


def test_memory_smoke_reports_every_service_and_driver():
    out = run_smoke("memory.py")
    assert "JobManager + ResourceManager + dispatcher:" in out, out
    assert out.count("warm driver of taskmanager-") == 2, out
