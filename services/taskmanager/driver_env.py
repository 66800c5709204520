"""The environment a Spark driver starts with: an allow-list, not the TaskManager's own.

The TaskManager's environment names its config file (HEADRACE_CONFIG, with its Redis password)
and may hold any HEADRACE_* setting, a catalog URL or a token. A driver gets only what Spark and
Python need; what the runner needs from the settings it gets as arguments (driver_process.py),
and what a task needs (its pipeline Redis URL, its own configuration) in its RunTask line.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Mapping

# Kept as they are, when the TaskManager has them.
ALLOWED = frozenset({"PATH", "LANG", "LANGUAGE", "TZ", "JAVA_HOME", "PYTHONPATH", "PYTHONDONTWRITEBYTECODE",
                     "PYTHONUNBUFFERED", "PYTHONIOENCODING", "PYTHONHASHSEED"})
ALLOWED_PREFIXES = ("LC_", "SPARK_", "PYSPARK_")
# Set on every driver: its work directory. It marks every process of the driver, whatever its
# session (task_processes.py finds orphans re-parented to init by it).
MARK = "HEADRACE_DRIVER_DIR"
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
# `python -m services...` from the driver's own work directory: the checkout must be importable.
REPO_ROOT = Path(__file__).resolve().parents[2]


def allowed(name: str) -> bool:
    return name in ALLOWED or name.startswith(ALLOWED_PREFIXES)


def driver_environment(environ: Mapping[str, str], *, workdir: Path, user: str | None) -> dict[str, str]:
    """The environment of a driver working in `workdir` (its HOME and TMPDIR too), run as `user`
    (None: the TaskManager's own)."""
    env = {k: v for k, v in environ.items() if allowed(k)}
    env.setdefault("PATH", DEFAULT_PATH)
    env.update(HOME=str(workdir), TMPDIR=str(workdir), PYSPARK_PYTHON=sys.executable,
               PYSPARK_DRIVER_PYTHON=sys.executable)
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys([str(REPO_ROOT), *paths]))
    env[MARK] = str(workdir)
    if user:
        env.update(USER=user, LOGNAME=user)
    return env
