"""What a driver's log says about a task that does not start (tasks/startup.py fails the task
with it): the start-up phase the driver last announced (`PHASE_MARKER`, runtime/driver_io.py)
and what it logged since, which after `DriverProcess.dump_stacks` is its threads' stacks."""

from __future__ import annotations

from shared.driver_contract import PHASE_MARKER

STARTUP_LOG_LINES = 2000  # read from the end of the log: the phase marker and the thread dump after it


def startup_report(log_tail: str, max_lines: int = 200) -> tuple[str | None, str]:
    """The phase last announced in `log_tail` (None if none), and at most `max_lines` lines of
    what was logged since."""
    lines = log_tail.splitlines()
    phase, since = None, lines
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].startswith(PHASE_MARKER):
            phase, since = lines[i][len(PHASE_MARKER) :].strip() or None, lines[i + 1 :]
            break
    return phase, "\n".join(_stuck_thread_first(since)[:max_lines])


def _stuck_thread_first(lines: list[str]) -> list[str]:
    """faulthandler prints the thread that took the signal, the main one where the pipeline
    runs, last ("Current thread ..."): move its block to the front, where a reader looks."""
    start = next((i for i, line in enumerate(lines) if line.startswith("Current thread ")), None)
    if start is None:
        return lines
    end = next((i for i in range(start + 1, len(lines)) if not lines[i].startswith("  ")), len(lines))
    return lines[start:end] + [""] + lines[:start] + lines[end:]
