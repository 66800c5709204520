"""The README's "Using it": `headrace up`, then `headrace run examples/clickstream.py -p 2`, as a
newcomer types it. The example's SQL sink names no database: `headrace up` gives pipelines one
of their own (services/cluster/pipeline_database.py), never the control catalog, so the job
finishes with every event counted instead of looping in restarts on "has no database"."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from tests.clusters import start_cluster

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]


def test_the_readmes_first_job_runs_on_headrace_up_as_written(tmp_path):
    home = tmp_path / "home"
    cluster = start_cluster(home, catalog_url=f"sqlite:///{home / 'catalog.db'}", taskmanagers=1, slots=2)
    try:
        assert cluster.pipeline_catalog_url.startswith("sqlite:///")
        assert cluster.pipeline_catalog_url != cluster.settings.catalog
        env = {**os.environ, "HEADRACE_CONFIG": str(cluster.run_path / "config.yaml")}
        done = subprocess.run([sys.executable, "-m", "services.cli", "run", "examples/clickstream.py", "-p", "2",
                               "--wait"], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "FINISHED" in done.stdout, done.stdout
        engine = create_engine(cluster.pipeline_catalog_url)
        try:
            with engine.connect() as c:
                total = c.execute(text("SELECT SUM(count) FROM clicks_per_minute")).scalar()
        finally:
            engine.dispose()
        assert total == 3000  # every generated event counted once
    finally:
        cluster.stop()
