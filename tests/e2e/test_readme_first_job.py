"""The README's "Using it": `headrace up`, then `headrace run examples/clickstream.py -p 2`, as a
newcomer types it. The example's SQL sink names no database: `headrace up` gives each job (and the
jobs that continue it) an SQLite database of its own (services/cluster/pipeline_database.py), never
the control catalog, so the job finishes with every event counted instead of looping in restarts
on "has no database"; `headrace run` says where that file is."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from sqlalchemy import create_engine, text

from tests.clusters import start_cluster

REPO = Path(__file__).resolve().parents[2]


def test_the_readmes_first_job_runs_on_headrace_up_as_written(tmp_path):
    home = tmp_path / "home"
    cluster = start_cluster(home, catalog_url=f"sqlite:///{home / 'catalog.db'}", taskmanagers=1, slots=2)
    try:
        assert cluster.pipeline_databases == home / "pipelines"
        env = {**os.environ, "HEADRACE_CONFIG": str(cluster.run_path / "config.yaml")}
        done = subprocess.run(
            [sys.executable, "-m", "services.cli", "run", "examples/clickstream.py", "-p", "2", "--wait"],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert "FINISHED" in done.stdout, done.stdout
        job = done.stdout.split("JobID")[-1].split()[0]
        database = home / "pipelines" / job / "pipelines.db"
        assert f"Its SQL output (ctx.catalog_url) goes to {database}" in done.stdout, done.stdout
        engine = create_engine(cluster.pipeline_database_url(job))
        try:
            with engine.connect() as c:
                total = c.execute(text("SELECT SUM(count) FROM clicks_per_minute")).scalar()
        finally:
            engine.dispose()
        assert total == 3000  # every generated event counted once
    finally:
        cluster.stop()


def test_the_readmes_quick_start_with_kafka_runs_as_written(tmp_path):
    """README, "Quick start": `headrace up --kafka`, a topic made with `headrace kafka
    create-topic`, the Kafka example run, stopped with a savepoint and resumed at parallelism 4
    from it; every event counted once in the pipelines' own database."""
    from shared.ports import free_port
    from tests.e2e.counting import expected_totals
    from tests.kafka_support import counting_event, produce
    from tests.waiting import wait_for

    home = tmp_path / "home"
    cluster = start_cluster(
        home,
        catalog_url=f"sqlite:///{home / 'catalog.db'}",
        taskmanagers=2,
        slots=4,
        kafka=True,
        kafka_port=free_port(),
    )
    env = {**os.environ, "HEADRACE_CONFIG": str(cluster.run_path / "config.yaml")}

    def headrace(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "services.cli", *args],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, f"headrace {' '.join(args)}: {done.stdout}{done.stderr}"
        return done.stdout

    def totals(lineage: str) -> dict:
        engine = create_engine(cluster.pipeline_database_url(lineage))
        try:
            with engine.connect() as c:
                return {k: (n, t) for k, n, t in c.execute(text("SELECT key, count, total FROM kafka_window_counts"))}
        except Exception:  # noqa: BLE001 - no table before the first batch
            return {}
        finally:
            engine.dispose()

    try:
        headrace("kafka", "create-topic", "orders", "--partitions", "2")
        bootstrap = cluster.describe()["kafka"]["bootstrap"]
        produce(bootstrap, "orders", [counting_event(n) for n in range(300)])
        out = headrace("run", "examples/kafka_to_postgres.py", "-p", "2", "--args", "--topic orders")
        job = out.split("JobID")[-1].split()[0]
        wait_for("the first 300 events counted", lambda: totals(job) == expected_totals(300), 240, poll_s=0.25)
        path = headrace("stop", job).strip().split("Path:")[-1].strip()
        produce(bootstrap, "orders", [counting_event(n) for n in range(300, 500)])
        out = headrace("run", "examples/kafka_to_postgres.py", "-s", path, "-p", "4", "--args", "--topic orders")
        # The resumed job continues the first one's lineage: the same database, its rows there.
        assert str(home / "pipelines" / job / "pipelines.db") in out, out
        wait_for(
            "every event counted once after the resume", lambda: totals(job) == expected_totals(500), 240, poll_s=0.25
        )
    finally:
        cluster.stop()
