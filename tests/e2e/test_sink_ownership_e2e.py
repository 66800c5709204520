"""Two jobs on one files-sink directory, on the multi-process cluster (issue 21, finding 6).

Job X streams into a directory. Job Y, the same pipeline and directory but a fresh job (a
lineage of its own), used to take the directory over, delete X's committed batches and fence X
off; X's restart then fenced Y, and so on. Now Y fails at its start with SinkOwnedError naming X,
is not restarted (the error is non-recoverable), and X runs on untouched. Then X stops with a
savepoint and job Z resumes from it into the same directory: the same lineage, so Z takes the
directory over, and the output is every generated event exactly once. The owner and fence
records are the TaskManagers' (services/taskmanager/tasks/sink_claims.py), outside the directory.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from services.taskmanager.tasks.sink_claims import record_path
from tests.clusters import Rest, start_cluster
from tests.waiting import wait_for

PIPELINE = """
def build(ctx):
    events = ctx.sources.datagen(seed=5, rows_per_second=40, max_rows_per_batch=40)
    return ctx.sinks.files(events.select("i", "url"), ctx.args[0], format="parquet", trigger="1 second")
"""
RESTARTS = {"type": "fixed-delay", "attempts": 3, "delay": "1 s"}


@pytest.fixture
def cluster(tmp_path, pg_url):
    c = start_cluster(tmp_path / "home", catalog_url=pg_url, taskmanagers=1, slots=2, warm_drivers=0)
    yield c
    c.stop()


def markers(out: Path) -> list[int]:
    return sorted(int(p.stem) for p in (out / "_headrace" / "commits").glob("*.json"))


def committed_ids(out: Path) -> list[int]:
    """The `i` of every row in the committed data files (readers skip `_headrace/`)."""
    ids: list[int] = []
    for f in sorted(out.glob("b*-a*-*.parquet")):
        ids += pq.read_table(f, columns=["i"]).column("i").to_pylist()
    return sorted(ids)


def listing(out: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(out)): (p.stat().st_size, p.stat().st_mtime_ns) for p in out.rglob("*") if p.is_file()}


def test_a_second_job_on_the_directory_fails_once_and_the_first_runs_on(cluster, tmp_path):
    rest = Rest(cluster.dispatcher_url)
    out = tmp_path / "out"
    source = tmp_path / "to_files.py"
    source.write_text(PIPELINE)
    jar = rest.upload(source)
    args = [str(out)]

    x = rest.run(jar, parallelism=1, jobName="x", programArgsList=args, restartStrategy=RESTARTS)
    rest.wait_attempt_running(x, 0, timeout_s=300)
    wait_for("three committed batches of job X", lambda: len(markers(out)) >= 3, timeout_s=120)
    record = record_path(cluster.settings.checkpoints, out)
    assert json.loads(record.read_text())["owner"]["lineage"] == x
    assert not (out / "_headrace" / "owner.json").exists(), "no record a pipeline could rewrite"

    y = rest.run(jar, parallelism=1, jobName="y", programArgsList=args, restartStrategy=RESTARTS)
    failed = rest.wait_state(y, ("FAILED", "FINISHED", "CANCELED"), timeout_s=300)
    assert failed["state"] == "FAILED"
    assert len(rest.attempts(y)) == 1, "a sink owned by another lineage must not be retried"
    root = rest.get(f"/jobs/{y}/exceptions")["root-exception"]
    assert "SinkOwnedError" in root, root
    assert f"directory {out} is the sink of lineage {x} (job {x}); job {y} (lineage {y}) may not write it" in root
    assert "savepoint or retained checkpoint of job" in root and f"rm -rf {out}" in root

    # X was neither fenced nor restarted, and goes on committing.
    seen = len(markers(out))
    wait_for("job X's next batches", lambda: len(markers(out)) >= seen + 2, timeout_s=60)
    assert rest.job(x)["state"] == "RUNNING" and len(rest.attempts(x)) == 1
    ids = committed_ids(out)
    assert ids == list(range(len(ids))), "job X's output must be whole: every event once"

    # Stop X with a savepoint, resume job Z from it: the same lineage may take the directory.
    r = rest.http.post(f"/jobs/{x}/stop", json={"drain": False})
    assert r.status_code == 202, r.text
    assert rest.wait_state(x, ("FINISHED", "FAILED", "CANCELED"), timeout_s=120)["state"] == "FINISHED"
    sp = rest.get(f"/jobs/{x}/checkpoints")["latest"]["savepoint"]
    restored = sp["batch_id"]
    kept = {
        k: v for k, v in listing(out).items() if not k.startswith("_headrace") and int(k[1 : k.index("-")]) <= restored
    }
    z = rest.run(
        jar,
        parallelism=1,
        jobName="z",
        programArgsList=args,
        restartStrategy=RESTARTS,
        savepointPath=sp["external_path"],
    )
    rest.wait_attempt_running(z, 0, timeout_s=300)
    wait_for("job Z's batches", lambda: len(markers(out)) >= restored + 3, timeout_s=120)
    owner = json.loads(record.read_text())["owner"]
    assert owner == {"lineage": x, "job_id": z, "generation": 1, "replaced": [x]}
    now = listing(out)
    assert {k: now.get(k) for k in kept} == kept, "X's batches up to the savepoint are kept as they were"
    rest.cancel(z)
    assert rest.wait_state(z, ("CANCELED",), timeout_s=60)["state"] == "CANCELED"
    ids = committed_ids(out)
    assert ids == list(range(len(ids))), "X then Z: every event once, none lost"
    assert markers(out) == list(range(len(markers(out)))) and len(markers(out)) >= restored + 3
