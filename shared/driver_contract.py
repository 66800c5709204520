"""What a TaskManager and the Spark driver processes it starts agree on besides their messages
(shared/task_protocol.py): the phase marker in a driver's log, the signal that dumps its stacks,
where its Python workers' sockets are, and how a driver's session is killed. Both processes import
this module; neither imports the other's.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
from pathlib import Path

# The driver writes "<marker><phase>" to its log as a task starts ("importing the pipeline
# module x.py", "building the pipeline (in build(ctx))", ...): a task that does not start in
# time is reported with the phase it was stuck in.
PHASE_MARKER = "headrace task phase: "
# The driver dumps every thread's stack into its log on this signal (faulthandler).
STACK_DUMP_SIGNAL = signal.SIGUSR1
# Micro-batches of the warm-up query a driver in reserve runs before it reports ready, unless the
# TaskManager says otherwise (Settings.warm_up_batches; services/taskmanager/runtime/warm_up.py).
WARM_UP_BATCHES = 150

PYTHON_SOCKET_BASE = Path("/tmp")
PYTHON_SOCKET_DIR_PREFIX = "hr-py-"


def python_socket_dir(workdir: str | Path) -> Path:
    """Where this process's local Spark session in `workdir` puts the Unix domain sockets of its
    Python workers: named after the work directory and the user, so a directory another user
    left under the same name never stands in the way."""
    return PYTHON_SOCKET_BASE / f"{PYTHON_SOCKET_DIR_PREFIX}{_workdir_digest(workdir)}-{os.geteuid()}"


def remove_python_socket_dirs(workdir: str | Path) -> None:
    """Remove every user's socket directory of the driver that worked in `workdir`."""
    for path in PYTHON_SOCKET_BASE.glob(f"{PYTHON_SOCKET_DIR_PREFIX}{_workdir_digest(workdir)}-*"):
        shutil.rmtree(path, ignore_errors=True)


def _workdir_digest(workdir: str | Path) -> str:
    return hashlib.sha1(str(Path(workdir).resolve()).encode()).hexdigest()[:16]


def session_groups(session: int) -> set[int]:
    """The process groups of every process in `session` (Linux /proc; empty elsewhere)."""
    groups: set[int] = set()
    try:
        entries = os.listdir("/proc")
    except OSError:
        return groups
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        if len(fields) > 3 and int(fields[3]) == session:  # state, ppid, pgrp, session
            groups.add(int(fields[2]))
    return groups


def kill_session(session: int, *, leader_last: bool = False) -> None:
    """SIGKILL every process group of `session` (its leader's group first, or last when the
    caller is the leader and must finish the others first)."""
    # The groups first: once the leader is dead its session is only found through them.
    groups = session_groups(session) | {session}
    for group in sorted(groups, key=lambda g: (g == session) == leader_last):
        try:
            os.killpg(group, signal.SIGKILL)
        except ProcessLookupError:
            pass
