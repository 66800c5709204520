"""The CLI answers user mistakes with one line and a non-zero exit, never a traceback."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import free_port


def headrace(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "services.cli", *args], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("args, expected", [
    (("run", "does-not-exist.py"), "does-not-exist.py: no such file"),
    (("run", "README.md"), "a pipeline is a .py file or a .zip"),
    (("run", "examples/clickstream.py", "-p", "0"), "-p/--parallelism must be at least 1"),
    (("list", "-m", "http://127.0.0.1:{port}"), "cannot reach the dispatcher"),
    (("cancel", "abc", "-m", "http://127.0.0.1:{port}"), "cannot reach the dispatcher"),
    (("taskmanager", "--slots", "0"), "--slots must be at least 1"),
])
def test_user_mistakes_get_one_line(args, expected):
    port = str(free_port())
    result = headrace(*[a.replace("{port}", port) for a in args])
    assert result.returncode != 0
    assert expected in result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert len(result.stderr.strip().splitlines()) == 1


def test_invalid_settings_are_reported_not_raised(monkeypatch):
    result = subprocess.run([sys.executable, "-m", "services.cli", "jobmanager"], capture_output=True, text=True,
                            timeout=60, env={"HEADRACE_HEARTBEAT_INTERVAL_S": "20", "PATH": "/usr/bin:/bin"})
    assert result.returncode == 2
    assert "heartbeat_interval_s" in result.stderr and "Traceback" not in result.stderr
