"""Running a bench/ script from a test: its --smoke mode, or its JSON result."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.servers import PG_ADMIN_URL, missing

ROOT = Path(__file__).resolve().parents[2]
BENCH_PG = os.environ.get("HEADRACE_BENCH_PG", PG_ADMIN_URL)


def run_smoke(script: str, *args: str, timeout_s: float = 400) -> str:
    """`bench/<script> --smoke ARGS`; its standard output, or the failure with its error output."""
    if not shutil.which("redis-server"):
        missing("redis-server")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), "--smoke", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        start_new_session=True,
    )
    assert proc.returncode == 0, f"{script} --smoke exited {proc.returncode}:\n{proc.stderr[-4000:]}"
    return proc.stdout


def run_bench(script: str, *args: str, timeout_s: float = 400) -> dict:
    out = run_smoke(script, *args, timeout_s=timeout_s)
    return json.loads(out[out.index("{") :])
