"""Where a lineage's own SQLite pipelines database is, when the cluster keeps them locally.

`headrace up` without a `pipeline_catalog_url` gives each lineage (a job and the jobs that
continue it: restarts, upgrades, restores; shared/job_lineage.py) a database of its own,
`<pipeline_databases_dir>/<lineage>/pipelines.db`. The TaskManager makes the lineage's directory
for the task's OS user, 0700, for as long as the task runs, and takes it back when it ends
(services/taskmanager/tasks/pipeline_database.py), so no other pipeline can open it, nor the SQL
sinks' fence table in it. The dispatcher shows the path in a job's details.

A cluster-wide `pipeline_catalog_url` (the operator's database) wins: every job then shares it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from shared.pipeline_redis import check_lineage

if TYPE_CHECKING:
    from shared.settings import Settings

DIRECTORY = "pipelines"
FILE = "pipelines.db"
# What SQLite keeps beside the file while it writes (a rollback journal or the WAL's).
COMPANIONS = ("-journal", "-wal", "-shm")


def database_path(directory: Path, lineage: str) -> Path:
    """The lineage's database file under `directory` (ValueError for a lineage id that is not one
    plain path component)."""
    return Path(directory) / check_lineage(lineage) / FILE


def sqlite_url(path: Path) -> str:
    return f"sqlite:///{path}"


def local_database(settings: "Settings", lineage: str, job_config: Mapping[str, Any] | None = None) -> Path | None:
    """The lineage's own local database when a job of it gets one (the cluster keeps them locally,
    names no database for every job, and the job names none of its own); None otherwise."""
    directory = settings.pipeline_databases_dir
    if directory is None or settings.pipeline_catalog_url or (job_config or {}).get("catalog_url"):
        return None
    return database_path(directory, lineage)
