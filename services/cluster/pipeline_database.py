"""The databases a local cluster's pipelines get when none is configured (`pipeline_catalog_url`):
an SQLite file per lineage under the cluster's home, `<home>/pipelines/<lineage>/pipelines.db`
(shared/pipeline_databases.py), never the control catalog. So the README's first job, the
examples and the runbooks' specs, whose SQL sinks name no database, run on `headrace up` as
written, and no pipeline reaches another lineage's output or sink fences: the TaskManager hands a
lineage's directory to the driver running its task only (services/taskmanager/tasks/
pipeline_database.py). A job's details (REST `GET /jobs/<id>`, `headrace run`) name its file."""

from __future__ import annotations

import os
from pathlib import Path

from shared.pipeline_databases import DIRECTORY
from shared.settings import Settings


def local_directory(settings: Settings) -> Path | None:
    """Where the lineages' own databases are (the TaskManagers make it), or None when the operator
    configured the pipelines' database."""
    if settings.pipeline_catalog_url:
        return None
    return Path(os.path.abspath(settings.pipeline_databases_dir or settings.home / DIRECTORY))
