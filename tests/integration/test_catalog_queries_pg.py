"""tests/unit/test_catalog_queries.py on PostgreSQL: the repository's reads that were the
services' own queries answer the same there (JSON extraction, FOR UPDATE, aggregates)."""

from __future__ import annotations

import pytest

from tests.unit.test_catalog_queries import (  # noqa: F401 - collected here with a PostgreSQL catalog
    catalog,
    test_artifacts_outbox_schedules,
    test_checkpoint_figures,
    test_checkpoints_of_many_jobs,
    test_checkpoints_of_one_job,
    test_deployments,
    test_empty_catalog,
    test_executions,
    test_jobs,
    test_snapshots_by_path,
    test_transition_deployment_writes_the_lifecycle,
)


@pytest.fixture
def catalog_url(migrated_pg_url):
    return migrated_pg_url
