"""Where the cluster keeps one SQLite pipelines database per lineage, the dispatcher's restore
check plans a changed pipeline with a copy of the database of the lineage it continues, so a
pipeline that reads a table while it builds (a dimension table for a stream-static join) plans as
its task will run (issue 43). The copy is taken by root without following a link the lineage's
driver may have planted, and given to the planner's own user."""

from __future__ import annotations

import json
import os
import sqlite3
import textwrap
from pathlib import Path

import pytest

from services.dispatcher.submission.planner_database import LineageDatabase
from shared import pipeline_databases
from tests.integration.planner_support import DRIVER_USER, pool_user, refused_plan, spare_planner
from tests.servers import IN_CI

pytestmark = pytest.mark.skipif(os.geteuid() != 0 and not IN_CI, reason="the drivers' users need root")

LINEAGE = "0123456789abcdef0123456789abcdef"

PIPELINE = textwrap.dedent("""
    import json, os

    def build(ctx):
        seen = {"uid": os.getuid(), "catalog_url": ctx.catalog_url}
        try:
            rows = ctx.sources.sql_table("dim").collect()
            seen["rows"] = sorted((r["k"], r["v"]) for r in rows)
        except Exception as exc:
            seen["error"] = type(exc).__name__
        raise RuntimeError("SEEN" + json.dumps(seen) + "END")
""")


def _seen(text: str) -> dict:
    assert "SEEN" in text, text
    return json.loads(text.split("SEEN", 1)[1].split("END", 1)[0])


def _lineage_dir(tmp_path: Path) -> tuple[Path, Path]:
    """The top directory (root's, 0711) and a lineage's (a running driver's user's, 0700)."""
    top = tmp_path / pipeline_databases.DIRECTORY
    top.mkdir(mode=0o711)
    top.chmod(0o711)
    lineage = top / LINEAGE
    lineage.mkdir(mode=0o700)
    holder = pool_user(30)
    os.chown(lineage, holder.pw_uid, holder.pw_gid)
    return top, lineage


def test_the_warm_planner_reads_the_lineages_rows_even_those_still_in_the_write_ahead_log(tmp_path):
    top, lineage = _lineage_dir(tmp_path)
    writer = sqlite3.connect(lineage / pipeline_databases.FILE, isolation_level=None)
    writer.execute("PRAGMA journal_mode=WAL")
    writer.execute("PRAGMA wal_autocheckpoint=0")  # the rows stay in the log, as while a driver writes
    writer.execute("CREATE TABLE dim (k TEXT PRIMARY KEY, v INTEGER)")
    writer.executemany("INSERT INTO dim VALUES (?, ?)", [("a", 1), ("b", 2), ("c", 3)])
    assert (lineage / (pipeline_databases.FILE + "-wal")).stat().st_size > 0
    artifact = tmp_path / "dimension_join.py"
    artifact.write_text(PIPELINE)
    warm = spare_planner()
    try:
        warm.replenish()
        result = warm.plan(
            artifact_path=str(artifact),
            entry="build",
            args=[],
            config={},
            parallelism=1,
            timeout_s=180,
            database=LineageDatabase(top, LINEAGE),
        )
    finally:
        warm.close()
        writer.close()
    assert result is not None and result.get("stage") == "build", result
    seen = _seen(str(result.get("error")))
    assert seen.get("rows") == [["a", 1], ["b", 2], ["c", 3]], seen
    assert seen["uid"] != pool_user(30).pw_uid, "the planner must not run as the lineage's driver's user"
    assert LINEAGE not in seen["catalog_url"], seen  # a copy, never the driver's own file


def test_a_link_planted_as_the_database_is_not_followed(tmp_path):
    top, lineage = _lineage_dir(tmp_path)
    secret = tmp_path / "root-only.db"
    with sqlite3.connect(secret) as db:
        db.execute("CREATE TABLE dim (k TEXT, v INTEGER)")
        db.execute("INSERT INTO dim VALUES ('secret', 42)")
    secret.chmod(0o600)
    (lineage / pipeline_databases.FILE).symlink_to(secret)
    artifact = tmp_path / "dimension_join.py"
    artifact.write_text(PIPELINE)
    message = refused_plan(artifact, DRIVER_USER, database=LineageDatabase(top, LINEAGE))
    seen = _seen(message)
    assert "rows" not in seen, seen  # the placeholder database: no table, and nothing of root's
    assert "placeholder" in seen["catalog_url"], seen
