"""The linters are gates: the suite fails when ruff finds anything in the repository, or mypy anything
in the typed packages (rules and exceptions in pyproject.toml, [tool.ruff] and [tool.mypy])."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run(tool: str, *args: str) -> subprocess.CompletedProcess:
    if shutil.which(tool) is None and subprocess.run([sys.executable, "-m", tool, "--version"],
                                                     capture_output=True).returncode != 0:
        pytest.fail(f"{tool} is not installed: ./scripts/bootstrap installs it (pip install -e '.[dev]')")
    return subprocess.run([sys.executable, "-m", tool, *args], cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_ruff_finds_nothing():
    out = run("ruff", "check", "--output-format", "concise", ".")
    assert out.returncode == 0, f"ruff check . found:\n{out.stdout}{out.stderr}"


# Packages mypy (configured in pyproject.toml, [tool.mypy]) must find nothing in; the rest of
# services/ joins as it is cleaned up (issue 22).
TYPED_PACKAGES = ("services/jobmanager/", "services/resourcemanager/", "shared/")


def test_mypy_finds_nothing_in_the_typed_packages():
    out = run("mypy")
    errors = [line for line in out.stdout.splitlines() if line.startswith(TYPED_PACKAGES) and ": error:" in line]
    assert not errors, "mypy found:\n" + "\n".join(errors)
    assert "error: " not in out.stderr, out.stderr
