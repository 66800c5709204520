"""The checkpoint benchmarks still run: each with --smoke (tiny sizes, one cluster each).

They are not measurements (no waiting for a quiet machine, tiny inputs); they fail when a
benchmark breaks: a cluster that does not start, a job that fails, a sink that miscounts, a
checkpoint, savepoint or restore that never completes, or JSON output that lost its figures.

Each takes about two minutes, so they run only when asked: HEADRACE_BENCH_SMOKE=1 python3 -m pytest
tests/integration/test_bench_smoke_checkpoints.py (do so after changing a benchmark).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import PG_ADMIN_URL, missing

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420),
              pytest.mark.skipif(os.environ.get("HEADRACE_BENCH_SMOKE") != "1",
                                 reason="benchmark smoke runs take minutes: set HEADRACE_BENCH_SMOKE=1")]

ROOT = Path(__file__).resolve().parents[2]
BENCH_PG = os.environ.get("HEADRACE_BENCH_PG", PG_ADMIN_URL)


def run_smoke(script: str, *args: str, timeout_s: float = 400) -> str:
    """`bench/<script> --smoke ARGS`; its standard output, or the failure with its error output."""
    if not shutil.which("redis-server"):
        missing("redis-server")
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / script), "--smoke", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout_s, start_new_session=True)
    assert proc.returncode == 0, f"{script} --smoke exited {proc.returncode}:\n{proc.stderr[-4000:]}"
    return proc.stdout


def run_bench(script: str, *args: str, timeout_s: float = 400) -> dict:
    out = run_smoke(script, *args, timeout_s=timeout_s)
    return json.loads(out[out.index("{"):])


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
