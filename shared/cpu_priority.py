"""A child process kept in reserve at the lowest CPU priority, and given its parent's priority back
when it is put to work (Linux; elsewhere these do nothing).

A process that is started ahead of need (the dispatcher's spare restore-check planner) takes a
core for seconds while its JVM starts; on a small machine that core belongs to what runs now. So
it starts at nice RESERVE_NICE: its process group, and its session's autogroup, since with
autogroup scheduling (/proc/sys/kernel/sched_autogroup_enabled, the default of many distributions'
kernels) a process's nice weighs only against the processes of its own session, and sessions share
the CPU as equals. Only where this process may raise it back (root, or RLIMIT_NICE high enough):
otherwise the work it is kept for would run at the lowest priority.
"""

from __future__ import annotations

import logging
import os
import resource
import time

from shared.driver_contract import session_groups

log = logging.getLogger(__name__)

RESERVE_NICE = 19
CAP_SYS_NICE = 23  # linux/capability.h
AUTOGROUP_WRITE_TRIES = 5
AUTOGROUP_WRITE_PAUSE_S = 0.11  # the kernel's limit without CAP_SYS_ADMIN: one write per 100 ms


def may_raise_priority() -> bool:
    """Whether this process may give a niced child its own priority back."""
    own = os.getpriority(os.PRIO_PROCESS, 0)
    return privileged() or resource.getrlimit(resource.RLIMIT_NICE)[1] >= 20 - own


def privileged() -> bool:
    """Root with CAP_SYS_NICE: may raise any process's priority. A container's root lacks the
    capability unless given it (Docker's default set drops it: deploy/docker-compose.yml adds it)."""
    if os.geteuid() != 0:
        return False
    try:
        with open("/proc/self/status") as f:
            caps = next(line for line in f if line.startswith("CapEff:"))
    except (OSError, StopIteration):
        return True  # no such file (not Linux): root is root
    return bool(int(caps.split()[1], 16) & (1 << CAP_SYS_NICE))


def lower(leader: int) -> bool:
    """Put the process group and session of `leader` (the leader of both) at RESERVE_NICE."""
    try:
        os.setpriority(os.PRIO_PGRP, leader, RESERVE_NICE)
    except OSError as exc:
        log.warning("could not lower the priority of process group %d (%s)", leader, exc)
        return False
    set_autogroup_nice(leader, RESERVE_NICE)
    return True


def restore(leader: int) -> None:
    """Every process group of `leader`'s session back to this process's priority, and its autogroup."""
    own = os.getpriority(os.PRIO_PROCESS, 0)
    set_autogroup_nice(leader, own)
    for group in session_groups(leader) | {leader}:
        try:
            os.setpriority(os.PRIO_PGRP, group, own)
        except ProcessLookupError:
            pass
        except OSError as exc:
            log.warning("could not raise the priority of process group %d (%s)", group, exc)


def set_autogroup_nice(leader: int, nice: int) -> bool:
    """Set the nice value of the autogroup of `leader`'s session."""
    # Without CAP_SYS_ADMIN (a container's root) the kernel takes one such write per 100 ms on the
    # whole machine and refuses the others with EAGAIN.
    for attempt in range(1, AUTOGROUP_WRITE_TRIES + 1):
        try:
            with open(f"/proc/{leader}/autogroup", "w") as f:
                f.write(str(nice))
            return True
        except FileNotFoundError:
            return False  # no such process, or a kernel without autogroups
        except OSError as exc:
            if isinstance(exc, BlockingIOError) and attempt < AUTOGROUP_WRITE_TRIES:
                time.sleep(AUTOGROUP_WRITE_PAUSE_S)
                continue
            log.warning("could not set the autogroup nice of session %d to %d (%s)", leader, nice, exc)
            return False
    return False
