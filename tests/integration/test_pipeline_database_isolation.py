"""Issue 43.5, the SQL half, played by a hostile pipeline on a real local cluster (`headrace up`
without a `pipeline_catalog_url`, its TaskManager as root, drivers as users of the pool): every
pipeline used to write one SQLite file, so one job could read another's SQL sink output and set
its fence (`_headrace_sink_fences`) out of reach. Now each lineage has a database of its own,
`<home>/pipelines/<lineage>/pipelines.db`, in a directory only the driver running the lineage's
task may open (services/taskmanager/tasks/pipeline_database.py): the hostile job is refused while
its own SQL sink writes its own database, and the victim's upgrade (a job resumed from its
savepoint: the same lineage) finds the rows its first job wrote.

The cluster lives under a directory of /tmp of its own (tests/integration/test_driver_sandbox.py
says why)."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import stat
import tempfile
import textwrap
import uuid
from pathlib import Path

import pytest

from services.taskmanager.drivers.user import DEFAULT_NAME, give_to_drivers
from tests.clusters import Rest, start_cluster
from tests.servers import IN_CI
from tests.waiting import wait_for

pytestmark = pytest.mark.skipif(os.geteuid() != 0 and not IN_CI, reason="starting drivers as other users needs root")

DONE = ("FINISHED", "FAILED", "CANCELED")
REPORT = """
    import json, os, sqlite3

    def attempt(fn):
        try:
            fn()
            return "done"
        except (OSError, sqlite3.Error) as exc:
            return type(exc).__name__ + (": " + str(exc) if isinstance(exc, sqlite3.Error) else "")

    def report(path, seen):
        seen["uid"] = os.getuid()
        with open(path, "w") as f:
            json.dump(seen, f)
"""
# Its own rows before it starts, read from its database while it builds (none on a first run).
VICTIM = """
    def build(ctx):
        try:
            before = ctx.sources.sql_table("victim_rows").count()
        except Exception:
            before = -1
        report(os.path.join(ctx.args[0], ctx.job_id + ".json"), {"catalog_url": ctx.catalog_url, "before": before})
        events = ctx.sources.datagen(seed=7, rows_per_second=20, max_rows_per_batch=20)
        return ctx.sinks.sql_table(events.select("i", "url"), "victim_rows", key_columns=["i"], trigger="1 second")
"""
HOSTILE = """
    def build(ctx):
        out, victim_db = ctx.args
        victim_dir, top = os.path.dirname(victim_db), os.path.dirname(os.path.dirname(victim_db))

        def fence():
            c = sqlite3.connect(f"file:{victim_db}?mode=rw", uri=True)
            c.execute("UPDATE _headrace_sink_fences SET attempt = 4611686018427387904")
            c.commit()

        def read_rows():
            sqlite3.connect(f"file:{victim_db}?mode=ro", uri=True).execute("SELECT * FROM victim_rows").fetchall()

        report(out, {
            "open its database": attempt(lambda: open(victim_db, "rb").read(1)),
            "set its fence": attempt(fence),
            "read its rows": attempt(read_rows),
            "list its directory": attempt(lambda: os.listdir(victim_dir)),
            "write in its directory": attempt(lambda: open(os.path.join(victim_dir, "planted"), "w").close()),
            "list the databases": attempt(lambda: os.listdir(top)),
            "plant a lineage": attempt(lambda: os.mkdir(os.path.join(top, "f" * 32))),
            "own": ctx.catalog_url,
        })
        df = ctx.sources.datagen(total=5, streaming=False)
        return ctx.sinks.sql_table(df.select("i", "url"), "hostile_rows", key_columns=["i"])
"""


@pytest.fixture(scope="module")
def root():
    path = Path(tempfile.mkdtemp(prefix="headrace-pipedb-", dir="/tmp"))
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def cluster(root):
    home = root / "home"
    home.mkdir()
    c = start_cluster(
        home, catalog_url=f"sqlite:///{home / 'catalog.db'}", taskmanagers=1, slots=2, driver_user=DEFAULT_NAME
    )
    yield c
    c.stop()


@pytest.fixture(scope="module")
def outbox(root):
    out = root / "outbox"
    out.mkdir()
    give_to_drivers(out, DEFAULT_NAME)
    return out


def upload(rest: Rest, root: Path, source: str) -> str:
    path = root / f"p{uuid.uuid4().hex[:8]}.py"
    path.write_text(textwrap.dedent(REPORT) + textwrap.dedent(source))
    return rest.upload(path)


def rows(db: Path, table: str) -> int:
    """Rows of `table` (0 before it exists), read as the operator does: read-only."""
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as c:
            return c.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]
    except sqlite3.OperationalError:
        return 0


def owner_mode(p: Path) -> tuple[int, int]:
    st = p.stat()
    return st.st_uid, stat.S_IMODE(st.st_mode)


def read(path: Path) -> dict:
    wait_for(f"the pipeline's report {path.name}", lambda: path.exists() and path.stat().st_size > 0, timeout_s=240)
    return json.loads(path.read_text())


def stop_with_savepoint(rest: Rest, job: str) -> str:
    r = rest.http.post(f"/jobs/{job}/stop", json={})
    assert r.status_code == 202, r.text
    rid = r.json()["request-id"]
    status = wait_for(
        "the stop's savepoint",
        lambda: (s := rest.get(f"/jobs/{job}/savepoints/{rid}"))["status"]["id"] == "COMPLETED" and s,
        timeout_s=180,
    )
    assert "failure-cause" not in (status.get("operation") or {}), status
    return status["operation"]["location"]


def test_a_pipeline_reaches_only_its_own_lineages_database(cluster, rest, root, outbox):
    top = cluster.settings.home / "pipelines"
    victim_jar = upload(rest, root, VICTIM)
    victim = rest.run(victim_jar, parallelism=1, programArgsList=[str(outbox)], restartStrategy={"type": "none"})
    victim_db = Path(rest.get(f"/jobs/{victim}")["pipeline-database"])
    assert victim_db == top / victim / "pipelines.db"
    first = read(outbox / f"{victim}.json")
    assert (first["catalog_url"], first["before"]) == (f"sqlite:///{victim_db}", -1)  # a fresh lineage
    wait_for("the victim's first rows", lambda: rows(victim_db, "victim_rows") > 0, timeout_s=240)
    with sqlite3.connect(f"file:{victim_db}?mode=ro", uri=True) as c:
        fences = c.execute("SELECT sink_id, attempt FROM _headrace_sink_fences").fetchall()
    assert fences and all(sink.startswith(f"{victim}:") for sink, _ in fences), fences
    victim_uid, mode = owner_mode(victim_db.parent)
    assert mode == 0o700 and victim_uid != 0  # the running task's user's
    assert owner_mode(top) == (0, 0o711)

    hostile = rest.run(
        upload(rest, root, HOSTILE),
        parallelism=1,
        programArgsList=[str(outbox / "hostile.json"), str(victim_db)],
        restartStrategy={"type": "none"},
    )
    final = rest.wait_state(hostile, DONE, timeout_s=300)
    assert final["state"] == "FINISHED", rest.get(f"/jobs/{hostile}/exceptions")
    seen = read(outbox / "hostile.json")
    own = top / hostile / "pipelines.db"
    assert seen.pop("own") == f"sqlite:///{own}"
    assert seen.pop("uid") != victim_uid
    assert {k: v.split(":")[0] for k, v in seen.items()} == {
        "open its database": "PermissionError",
        "set its fence": "OperationalError",  # unable to open database file
        "read its rows": "OperationalError",
        "list its directory": "PermissionError",
        "write in its directory": "PermissionError",
        "list the databases": "PermissionError",
        "plant a lineage": "PermissionError",
    }, seen
    # Its own SQL sink wrote its own database, and nothing of it reached the victim's.
    assert rows(own, "hostile_rows") == 5
    assert rows(victim_db, "hostile_rows") == 0
    with sqlite3.connect(f"file:{victim_db}?mode=ro", uri=True) as c:
        assert c.execute("SELECT sink_id, attempt FROM _headrace_sink_fences").fetchall() == fences
    wait_for("the hostile job's database taken back", lambda: owner_mode(own.parent) == (0, 0o700), timeout_s=60)

    # The upgrade (a job resumed from the victim's savepoint) is the same lineage: its database,
    # with the rows the first job wrote.
    savepoint = stop_with_savepoint(rest, victim)
    assert rest.wait_state(victim, DONE, timeout_s=120)["state"] == "FINISHED"
    wait_for("the victim's database taken back", lambda: owner_mode(victim_db.parent) == (0, 0o700), timeout_s=60)
    written = rows(victim_db, "victim_rows")
    upgraded = rest.run(
        victim_jar,
        parallelism=1,
        programArgsList=[str(outbox)],
        savepointPath=savepoint,
        restartStrategy={"type": "none"},
    )
    details = rest.get(f"/jobs/{upgraded}")
    assert (details["lineage"], details["pipeline-database"]) == (victim, str(victim_db))
    assert read(outbox / f"{upgraded}.json")["before"] == written > 0
    wait_for("the upgrade's own rows", lambda: rows(victim_db, "victim_rows") > written, timeout_s=240)
    rest.cancel(upgraded)
    rest.wait_state(upgraded, DONE, timeout_s=120)
