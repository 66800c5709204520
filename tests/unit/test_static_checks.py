"""The linters are gates: the suite fails when ruff finds anything in the repository or would format
a file differently, or mypy finds anything in services/ and shared/ (rules and exceptions in
pyproject.toml, [tool.ruff] and [tool.mypy])."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run(tool: str, *args: str) -> subprocess.CompletedProcess:
    if (
        shutil.which(tool) is None
        and subprocess.run([sys.executable, "-m", tool, "--version"], capture_output=True).returncode != 0
    ):
        pytest.fail(f"{tool} is not installed: ./scripts/bootstrap installs it (pip install -e '.[dev]')")
    return subprocess.run([sys.executable, "-m", tool, *args], cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_ruff_finds_nothing():
    out = run("ruff", "check", "--output-format", "concise", ".")
    assert out.returncode == 0, f"ruff check . found:\n{out.stdout}{out.stderr}"


def test_the_tree_is_formatted():
    out = run("ruff", "format", "--check", ".")
    assert out.returncode == 0, f"ruff format --check . (run `python3 -m ruff format .`):\n{out.stdout}{out.stderr}"


def test_mypy_finds_nothing():
    out = run("mypy")
    assert out.returncode == 0, f"mypy (services/ and shared/) found:\n{out.stdout}{out.stderr}"
