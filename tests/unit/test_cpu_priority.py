"""shared/cpu_priority.py on a real child process: kept in reserve at nice 19 (its process group
and its session's autogroup), given this process's priority back when put to work."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from shared import cpu_priority

pytestmark = pytest.mark.skipif(
    not cpu_priority.may_raise_priority(),
    reason="this process may not raise a niced child's priority back (not root, RLIMIT_NICE too low)",
)


def autogroup_nice(pid: int) -> int | None:
    path = Path(f"/proc/{pid}/autogroup")
    return int(path.read_text().split()[-1]) if path.exists() else None  # "/autogroup-42 nice 19"


def test_a_child_in_reserve_is_lowered_then_raised_back():
    child = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        own = os.getpriority(os.PRIO_PROCESS, 0)
        assert cpu_priority.lower(child.pid)
        assert os.getpriority(os.PRIO_PGRP, child.pid) == cpu_priority.RESERVE_NICE
        assert autogroup_nice(child.pid) in (None, cpu_priority.RESERVE_NICE)
        cpu_priority.restore(child.pid)
        assert os.getpriority(os.PRIO_PGRP, child.pid) == own
        assert autogroup_nice(child.pid) in (None, own)
    finally:
        child.kill()
        child.wait(10)


def test_a_session_s_groups_are_found():
    child = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        assert child.pid in cpu_priority.session_groups(child.pid)
    finally:
        child.kill()
        child.wait(10)
