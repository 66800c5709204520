"""The catalog: jobs, their state transitions, vertices, executions (one row per attempt),
TaskManagers, artifacts and exceptions. PostgreSQL by URL; an SQLite file is the embedded
default. Status columns change only through the functions in `shared.catalog.repository`,
except a deployment's, which services/jobmanager/deployment_reconciler.py assigns directly."""

from shared.catalog.db import Catalog

__all__ = ["Catalog"]
