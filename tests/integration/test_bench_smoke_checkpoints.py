"""The checkpoint benchmarks still run: each with --smoke (tiny sizes, one cluster each).

They are not measurements (no waiting for a quiet machine, tiny inputs); they fail when a
benchmark breaks: a cluster that does not start, a job that fails, a sink that miscounts, a
checkpoint, savepoint or restore that never completes, or JSON output that lost its figures.

Each takes about two minutes, so they run only when asked: HEADRACE_BENCH_SMOKE=1 python3 -m pytest
tests/integration/test_bench_smoke_checkpoints.py (do so after changing a benchmark).
"""

from __future__ import annotations

import os

import pytest

from tests.integration.bench_runs import BENCH_PG, run_bench
from tests.servers import missing

pytestmark = [
    pytest.mark.timeout(420),
    pytest.mark.skipif(
        os.environ.get("HEADRACE_BENCH_SMOKE") != "1",
        reason="benchmark smoke runs take minutes: set HEADRACE_BENCH_SMOKE=1",
    ),
]


def test_checkpoint_overhead_smoke():
    try:
        import psycopg

        psycopg.connect(BENCH_PG, connect_timeout=3).close()
    except Exception:  # noqa: BLE001 - whatever keeps the server from answering, it is missing
        missing(f"PostgreSQL at {BENCH_PG} (HEADRACE_BENCH_PG)")
    out = run_bench("checkpoint_overhead.py", "--pg", BENCH_PG)
    runs = out["runs"]
    assert [r["variant"] for r in runs] == ["A", "B"]
    assert all(r["events_per_s"] > 0 and r["batches"] >= 2 for r in runs), runs
    assert runs[0]["checkpoints_whole_job"]["completed"] >= 1, runs[0]
    assert "checkpoints" not in runs[1]  # the B run has none to report
    assert out["ratio_A_over_B"] > 0


def test_checkpoint_state_sizes_smoke():
    out = run_bench("checkpoint_state_sizes.py")
    [size] = out["sizes"]
    assert size["grow"]["state_size_bytes"] > 0 and size["grow"]["keys"] > 0, size
    assert size["checkpoints"]["completed"] >= 1, size
    assert size["savepoint"]["seconds"] > 0 and size["savepoint"]["state_size_bytes"] > 0, size
    restore = size["restore"]
    assert 0 < restore["post_to_running_s"] <= restore["post_to_first_batch_s"], restore
