"""A database for the benchmark pipelines' SQL sinks. Pipelines get no catalog of the cluster
(issue 21): their `ctx.catalog_url` is `pipeline_catalog_url`. Here that is one SQLite file, in
a directory the drivers' group may write, that every benchmark job shares, so that a benchmark
reads every job's rows at one URL: a cluster-wide database as an operator configures one
(docs/runbooks/auth.md), not the database per lineage `headrace up` keeps without it
(services/cluster/pipeline_database.py)."""

from __future__ import annotations

import os
from pathlib import Path

DRIVER_USER = os.environ.get("HEADRACE_DRIVER_USER", "headrace-driver")
FILE = "sink.db"


def sink_db_url(home: Path) -> str:
    from services.taskmanager.drivers.user import give_to_drivers

    directory = home / "sink-db"
    directory.mkdir(parents=True, exist_ok=True)
    give_to_drivers(directory, DRIVER_USER or None, files=(FILE,))
    return f"sqlite:///{directory / FILE}"
