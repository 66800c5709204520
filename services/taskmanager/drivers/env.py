"""The environment a Spark driver starts with: an allow-list, not the TaskManager's own.
The allow-list is shared/untrusted_code.py's, the one the dispatcher's planner gets too.

The TaskManager's environment names its config file (HEADRACE_CONFIG, with its Redis password)
and may hold any HEADRACE_* setting, a catalog URL or a token. A driver gets only what Spark and
Python need; what the runner needs from the settings it gets as arguments (drivers/process.py),
and what a task needs (its pipeline Redis URL, its own configuration) in its RunTask line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

from shared import untrusted_code
from shared.import_root import IMPORT_ROOT

# Set on every driver: its work directory. It marks every process of the driver, whatever its
# session (drivers/task_processes.py finds orphans re-parented to init by it).
MARK = "HEADRACE_DRIVER_DIR"


def driver_environment(environ: Mapping[str, str], *, workdir: Path, user: str | None) -> dict[str, str]:
    """The environment of a driver working in `workdir` (its HOME and TMPDIR too), run as `user`
    (None: the TaskManager's own): what shared/untrusted_code.py gives any pipeline code, and
    the driver's mark."""
    env = untrusted_code.environment(environ, home=workdir, user=user, import_root=IMPORT_ROOT)
    env[MARK] = str(workdir)
    return env
