"""The catalog: jobs, their state transitions, vertices, executions (one row per attempt),
TaskManagers, artifacts and exceptions. PostgreSQL by URL; an SQLite file is the embedded
default. The services read and write it only through the functions in
`shared.catalog.repository`; status columns, a deployment's lifecycle among them, change only
through its transition functions, which keep to the machines of shared/states.py."""

from shared.catalog.db import Catalog

__all__ = ["Catalog"]
