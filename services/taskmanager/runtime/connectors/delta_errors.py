"""The Delta Lake connector's own failures. Each message says what was found, what was kept
and what to do; none of them can be cured by a restart, so the JobManager fails the job at once
(services/jobmanager/transitions.py NON_RECOVERABLE, by these class names)."""

from __future__ import annotations

from shared.errors import TaskError

RUNBOOK = "docs/runbooks/delta.md"


class DeltaPathRefused(TaskError, ValueError):
    """A table path outside the lake directory and every allowed storage root."""


class DeltaSchemaMismatch(TaskError, ValueError):
    """The pipeline's rows do not fit the table's schema; `columns` names the columns at fault."""

    def __init__(self, message: str, columns: tuple[str, ...] = ()):
        super().__init__(message)
        self.columns = columns

    def __reduce__(self):  # picklable despite its own signature (e.g. across processes)
        return (DeltaSchemaMismatch, (str(self), self.columns))


class DeltaUndoRefused(TaskError, RuntimeError):
    """A restore needs the table as it was at an older version and that cannot be had: another
    writer committed after it, or VACUUM (or log clean-up) removed what it needs. Nothing was
    changed."""
