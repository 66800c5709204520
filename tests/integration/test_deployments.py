"""Deployments on the real stack (JobManager, ResourceManager, TaskManagers and the dispatcher as
processes, PostgreSQL), with no-op pipelines: the lifecycle without Spark's start-up costs. Each
step is read back the way a user would, over REST, and checked in the catalog's job rows.

apply v1 -> STABLE; v2 (other arguments) -> UPGRADING -> STABLE on a new job started from the
savepoint the old one stopped with; v3 (fails every attempt) -> ROLLED_BACK to v2, restarted from
that same savepoint; a parallelism change alone -> a rescale of the same job; suspend -> the job
FINISHED with a savepoint; resume -> STABLE again from it; delete -> gone, its job FINISHED.
The counting pipeline through all of it, exact, is tests/e2e/test_deployments_e2e.py."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import redis
import yaml
from typer.testing import CliRunner

from services.cli import app as cli
from services.taskmanager.metrics import TaskMetrics
from shared.task_protocol import Progress
from tests.autoscaling_series import shifted, simulate, steady
from tests.clusters import start_cluster
from tests.waiting import wait_for

NAME = "clicks"
TIMEOUT_S = 60


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, pg_url_module):
    c = start_cluster(tmp_path_factory.mktemp("deployments-home"), catalog_url=pg_url_module, slots=4)
    yield c
    c.stop()


def spec(jar: str, *, args=("v1",), fail=False, parallelism=1, **extra) -> dict:
    config = {"noop.duration": "-1", "execution.checkpointing.interval": "500 ms"}
    if fail:  # each attempt fails 200 ms after RUNNING, before its first checkpoint is due
        config.update({"noop.fail-attempts": "1000", "noop.duration": "200 ms"})
    return {
        "jarId": jar,
        "kind": "noop",
        "programArgsList": list(args),
        "parallelism": parallelism,
        "flinkConfiguration": config,
        "restartStrategy": {"type": "fixed-delay", "attempts": 5, "delay": "200 ms"},
        "rollback": {"enabled": True, "readyWithin": "10 s"},
        **extra,
    }


def put(rest, body: dict, name: str = NAME) -> dict:
    r = rest.http.put(f"/deployments/{name}", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def show(rest, name: str = NAME) -> dict:
    r = rest.http.get(f"/deployments/{name}")
    assert r.status_code == 200, r.text
    return r.json()


def wait_lifecycle(
    rest, state: str, *, generation: int | None = None, timeout_s: float = TIMEOUT_S, name: str = NAME
) -> dict:
    def reached(seen: dict) -> bool:
        st = seen["status"]
        return st["lifecycleState"] == state and (generation is None or st["jobGeneration"] == generation)

    return wait_for(
        f"deployment {name} {state} (generation {generation})",
        lambda: show(rest, name),
        timeout_s,
        poll_s=0.2,
        until=reached,
    )


def wait_deleted(rest, name: str = NAME, timeout_s: float = TIMEOUT_S) -> None:
    """Until GET /deployments/<name> answers 404; a timeout shows the deployment's last status."""

    def left() -> object:
        r = rest.http.get(f"/deployments/{name}")
        if r.status_code == 404:
            return None
        return r.json()["status"] if r.status_code == 200 else f"{r.status_code}: {r.text}"

    wait_for(f"deployment {name} deleted", left, timeout_s, poll_s=0.2, until=lambda seen: seen is None)


def restored_from(rest, job_id: str) -> str | None:
    return rest.attempts(job_id)[0]["restored-from"]


def test_bad_specs_are_refused_naming_the_field(rest, jar):
    cases = [
        ("Bad_Name", spec(jar), "name"),
        (NAME, {**spec(jar), "upgradeMod": "savepoint"}, "upgradeMod"),
        (NAME, {**spec(jar), "upgradeMode": "hot-swap"}, "upgradeMode"),
        (NAME, {**spec(jar), "rollback": {"readyWithin": "100 ms"}}, "rollback.readyWithin"),
        (NAME, {**spec(jar), "jarId": "no-such-jar"}, "jarid"),
        (NAME, {**spec(jar), "flinkConfiguration": {"execution.savepoint.path": "/tmp/x"}}, "execution.savepoint.path"),
        (NAME, {**spec(jar), "name": "other"}, "name"),
    ]
    for name, body, field in cases:
        r = rest.http.put(f"/deployments/{name}", json=body)
        assert r.status_code in (400, 404), (field, r.status_code, r.text)
        assert field in r.text, (field, r.text)
    assert rest.http.get("/deployments/nothing-here").status_code == 404
    assert rest.get("/deployments")["deployments"] == []


def test_upgrade_rollback_rescale_suspend_resume_delete(rest, jar):
    assert put(rest, spec(jar)) == {"name": NAME, "generation": 1, "changed": True}
    assert put(rest, spec(jar))["changed"] is False
    v1 = wait_lifecycle(rest, "STABLE", generation=1)
    assert v1["status"]["waitingReason"] is None
    job1 = v1["status"]["jobId"]
    assert rest.job(job1)["state"] == "RUNNING"
    r = rest.http.post(f"/deployments/{NAME}/rollback")  # nothing to roll back to while STABLE
    assert r.status_code == 409 and "nothing to roll back to" in r.text, r.text

    # v2: another argument -> stop with a savepoint, a new job from it.
    assert put(rest, spec(jar, args=("v2",)))["generation"] == 2
    v2 = wait_lifecycle(rest, "STABLE", generation=2)
    job2 = v2["status"]["jobId"]
    assert job2 != job1 and rest.job(job1)["state"] == "FINISHED"
    upgrade_savepoint = restored_from(rest, job2)
    assert upgrade_savepoint and "savepoint" in upgrade_savepoint, upgrade_savepoint
    assert [e["to"] for e in v2["status"]["history"]][-2:] == ["UPGRADING", "STABLE"]
    assert v2["status"]["stableGeneration"] == 2
    assert [s["trigger"] for s in v2["savepoints"]] == ["upgrade"]

    # v3 fails every attempt -> rolled back to v2 from the upgrade savepoint, automatically.
    t0 = time.monotonic()
    assert put(rest, spec(jar, args=("v3",), fail=True))["generation"] == 3
    v3 = wait_lifecycle(rest, "ROLLED_BACK", timeout_s=10 + 10 + 30)
    rolled_back_in = time.monotonic() - t0
    job_rb = v3["status"]["jobId"]
    assert v3["status"]["jobGeneration"] == 2 and v3["status"]["stableGeneration"] == 2
    assert any(w in (v3["status"]["error"] or "") for w in ("failed", "ended")), v3["status"]
    assert rest.job(job_rb)["state"] == "RUNNING"
    # From the savepoint v2 stopped with when v3 was applied: what v3 itself started from.
    job3 = next(e["jobId"] for e in v3["status"]["history"] if e["to"] == "ROLLING_BACK")
    assert job3 not in (job2, job_rb) and rest.job(job3)["state"] in ("CANCELED", "FAILED")
    assert restored_from(rest, job_rb) == restored_from(rest, job3) != upgrade_savepoint
    assert len({job1, job2, job_rb}) == 3
    assert rolled_back_in < 10 + 10 + 30
    states = [e["to"] for e in v3["status"]["history"]]
    assert "ROLLING_BACK" in states and states[-1] == "ROLLED_BACK", states
    # The v3 spec is not tried again by itself.
    time.sleep(2)
    assert show(rest)["status"]["jobId"] == job_rb

    # Parallelism alone (from the v2 spec): a rescale of the same job.
    assert put(rest, spec(jar, args=("v2",), parallelism=2))["generation"] == 4
    v4 = wait_lifecycle(rest, "STABLE", generation=4)
    assert v4["status"]["jobId"] == job_rb
    assert rest.job(job_rb)["vertices"][0]["parallelism"] == 2

    # Suspend: stop with a savepoint, kept; resume: the same generation from it.
    suspended_spec = {**spec(jar, args=("v2",), parallelism=2), "state": "suspended"}
    assert put(rest, suspended_spec)["generation"] == 5
    sus = wait_lifecycle(rest, "SUSPENDED")
    assert rest.job(job_rb)["state"] == "FINISHED"
    assert sus["status"]["lastSavepoint"]
    assert put(rest, spec(jar, args=("v2",), parallelism=2))["generation"] == 6
    resumed = wait_lifecycle(rest, "STABLE", generation=6)
    assert restored_from(rest, resumed["status"]["jobId"]) == sus["status"]["lastSavepoint"]

    listed = rest.get("/deployments")["deployments"]
    assert [(d["name"], d["lifecycleState"], d["jobState"]) for d in listed] == [(NAME, "STABLE", "RUNNING")]

    # Delete: stopped with a savepoint, then gone.
    last_job = resumed["status"]["jobId"]
    assert rest.http.delete(f"/deployments/{NAME}").status_code == 202
    wait_deleted(rest)
    assert rest.job(last_job)["state"] == "FINISHED"


def test_resume_after_a_rollback_runs_the_stable_version_not_the_failed_one(cluster, rest, jar):
    """`headrace deploy suspend` and `resume` send the current spec back with another state; after a
    rollback that spec is the failed one, and resuming must run what ran: the stable generation."""
    name = "resumed"
    url = ["-m", cluster.dispatcher_url]
    put(rest, spec(jar), name=name)
    wait_lifecycle(rest, "STABLE", generation=1, name=name)
    assert put(rest, spec(jar, args=("broken",), fail=True), name=name)["generation"] == 2
    back = wait_lifecycle(rest, "ROLLED_BACK", generation=1, timeout_s=10 + 10 + 30, name=name)["status"]
    runner = CliRunner()
    suspended = runner.invoke(cli.app, ["deploy", "suspend", name, "--wait", "SUSPENDED", *url])
    assert suspended.exit_code == 0, suspended.output
    sus = show(rest, name)
    assert sus["generation"] == 3 and sus["spec"]["programArgsList"] == ["broken"]
    assert rest.job(back["jobId"])["state"] == "FINISHED" and sus["status"]["lastSavepoint"]
    resumed = runner.invoke(cli.app, ["deploy", "resume", name, *url])
    assert resumed.exit_code == 0, resumed.output
    again = wait_lifecycle(rest, "ROLLED_BACK", generation=1, name=name)
    job = again["status"]["jobId"]
    assert again["generation"] == 4 and job != back["jobId"] and rest.job(job)["state"] == "RUNNING"
    assert restored_from(rest, job) == sus["status"]["lastSavepoint"]
    states = [e["to"] for e in again["status"]["history"]]
    since_resume = states[len(states) - states[::-1].index("SUSPENDED") :]
    assert since_resume == ["DEPLOYING", "ROLLED_BACK"], states  # the failed version was not started again
    reasons = [e["reason"] or "" for e in again["status"]["history"]]
    assert any("generation 1, the stable one" in r for r in reasons), reasons
    time.sleep(2)  # the failed version is not tried by itself
    assert show(rest, name)["status"]["jobId"] == job and show(rest, name)["status"]["jobGeneration"] == 1
    assert rest.http.delete(f"/deployments/{name}", params={"savepoint": "false"}).status_code == 202
    wait_deleted(rest, name)


def test_the_cli_applies_a_file_lists_shows_suspends_and_deletes(cluster, rest, tmp_path):
    runner = CliRunner()
    url = ["-m", cluster.dispatcher_url]
    pipeline = tmp_path / "noop_pipeline.py"
    pipeline.write_text("def build(ctx):\n    raise RuntimeError('no-op jobs never call build')\n")
    body = spec("unused", args=("cli",))
    body.pop("jarId")
    deployment = tmp_path / "cli-demo.yaml"
    deployment.write_text(yaml.safe_dump({"name": "cli-demo", "pipeline": "noop_pipeline.py", **body}))
    applied = runner.invoke(cli.app, ["deploy", "apply", str(deployment), "--wait", "STABLE", "--timeout", "60", *url])
    assert applied.exit_code == 0, applied.output
    assert "generation 1" in applied.output
    again = runner.invoke(cli.app, ["deploy", "apply", str(deployment), *url])  # the same file: no new jar or spec
    assert again.exit_code == 0 and "unchanged" in again.output and "Uploaded" not in again.output, again.output
    listed = runner.invoke(cli.app, ["deploy", "list", *url])
    assert listed.exit_code == 0 and "cli-demo" in listed.output and "STABLE" in listed.output, listed.output
    shown = runner.invoke(cli.app, ["deploy", "show", "cli-demo", "--json", *url])
    assert json.loads(shown.output)["status"]["lifecycleState"] == "STABLE"
    suspended = runner.invoke(cli.app, ["deploy", "suspend", "cli-demo", "--wait", "SUSPENDED", *url])
    assert suspended.exit_code == 0, suspended.output
    assert rest.job(show(rest, "cli-demo")["status"]["jobId"])["state"] == "FINISHED"
    refused = runner.invoke(cli.app, ["deploy", "rollback", "cli-demo", *url])
    assert refused.exit_code == 1 and "nothing to roll back to" in refused.output and "Traceback" not in refused.output
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: Bad_Name\njarId: x\n")
    assert runner.invoke(cli.app, ["deploy", "apply", str(bad), *url]).exit_code == 2
    assert runner.invoke(cli.app, ["deploy", "delete", "cli-demo", *url]).exit_code == 0
    wait_deleted(rest, "cli-demo")


def test_expected_generation_guards_a_read_modify_write_and_a_deployed_jar_stays(rest, jar):
    name = "guarded"
    r = rest.http.put(f"/deployments/{name}", params={"expectedGeneration": 3}, json=spec(jar))
    assert r.status_code == 409 and "does not exist" in r.text, r.text
    assert rest.http.put(f"/deployments/{name}", params={"expectedGeneration": 0}, json=spec(jar)).status_code == 200
    first = wait_lifecycle(rest, "STABLE", generation=1, name=name)
    stale = rest.http.put(f"/deployments/{name}", params={"expectedGeneration": 0}, json=spec(jar, args=("x",)))
    assert stale.status_code == 409 and stale.json()["field"] == "expectedGeneration", stale.text
    assert show(rest, name)["generation"] == 1
    # Suspended, no job of it runs; still, the jar its generations run cannot be deleted from under it.
    r = rest.http.put(
        f"/deployments/{name}", params={"expectedGeneration": 1}, json={**spec(jar), "state": "suspended"}
    )
    assert r.status_code == 200, r.text
    wait_lifecycle(rest, "SUSPENDED", name=name)
    r = rest.http.delete(f"/jars/{jar}")
    assert r.status_code == 409 and name in r.text, r.text
    assert rest.http.delete(f"/deployments/{name}", params={"savepoint": "false"}).status_code == 202
    wait_deleted(rest, name)
    assert rest.job(first["status"]["jobId"])["state"] == "FINISHED"


def test_periodic_savepoints_are_kept_up_to_history_max_and_older_ones_disposed(rest, jar):
    name = "periodic"
    # The shortest interval accepted (services/dispatcher/schemas/deployments.py MIN_SAVEPOINT_INTERVAL_S).
    put(rest, {**spec(jar), "savepoints": {"interval": "10 s", "historyMax": 2}}, name=name)

    def savepoints_first() -> dict:  # a timeout shows the savepoints before the (clipped) rest
        detail = show(rest, name)
        return {"savepoints": detail["savepoints"], **detail}

    wait_for(
        "3 periodic savepoints",
        savepoints_first,
        TIMEOUT_S + 30,
        poll_s=0.2,
        until=lambda seen: len([sp for sp in seen["savepoints"] if sp["trigger"] == "periodic"]) >= 3,
    )
    detail = show(rest, name)
    kept = [sp for sp in detail["savepoints"] if not sp["disposed"]]
    gone = [sp for sp in detail["savepoints"] if sp["disposed"]]
    assert len(kept) == 2 and len(gone) >= 1, detail["savepoints"]
    assert detail["status"]["lastSavepoint"] == kept[-1]["path"]
    # The files go after the catalog stops pointing at them.
    wait_for(
        "the disposed savepoints' files removed",
        lambda: [sp["path"] for sp in gone if Path(sp["path"]).exists()],
        10,
        poll_s=0.2,
        until=lambda left: not left,
    )
    assert all(Path(sp["path"]).exists() for sp in kept)
    assert rest.http.delete(f"/deployments/{name}", params={"savepoint": "false"}).status_code == 202


# --- the autoscaler (shared/autoscaling.py decides, services/jobmanager/autoscaler.py acts) ----
# A no-op task reports no figures: the test writes them for it, through the TaskManagers' own
# writer (services/taskmanager/metrics.py), from a simulated task (tests/autoscaling_series.py).


class FakeTaskFigures:
    """A no-op task's figures as its TaskManager would write them (services/taskmanager/metrics.py),
    each point when its time comes, from a simulated task (tests/autoscaling_series.py), until stopped."""

    def __init__(
        self,
        cluster,
        rest,
        job_id: str,
        rows_per_s: float,
        parallelism: int,
        seconds: float = 120,
        max_batch: int = 100_000,
    ):
        attempt = rest.attempts(job_id)[-1]  # the current one
        self.execution = SimpleNamespace(
            job_id=job_id,
            vertex_id=rest.job(job_id)["vertices"][0]["id"],
            execution_id=attempt["execution-id"],
            attempt=attempt["attempt"],
        )
        # Written under the TaskManager that runs it: the autoscaler reads only that one's figures.
        self.taskmanager = attempt["taskmanager-id"]
        self.points = shifted(
            simulate(steady(rows_per_s), seconds, parallelism, max_batch=max_batch), time.time() + seconds
        )
        self.client = redis.Redis.from_url(cluster.redis_url)
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._write, daemon=True)
        self.thread.start()

    def _write(self) -> None:
        for p in self.points:
            if self.stopped.wait(max(0.0, p.at_s - time.time())):
                return
            event = Progress(
                batch_id=p.batch_id,
                num_input_rows=p.rows,
                source_lag=p.lag,
                batch_duration_ms=int((p.duration_s or 0) * 1000),
                input_rows_per_second=p.input_rate or 0.0,
            )
            TaskMetrics(self.client, clock_ms=lambda at=p.at_s: int(at * 1000)).progress(
                self.taskmanager, self.execution, event
            )

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join(10)
        self.client.close()


def wait_parallelism(rest, parallelism: int, *, name: str, timeout_s: float = TIMEOUT_S) -> dict:
    def reached(seen: dict) -> bool:
        st = seen["status"]
        return (
            st["lifecycleState"] == "STABLE"
            and st["parallelism"] == parallelism
            and bool(st["jobId"])
            and rest.job(st["jobId"])["vertices"][0]["parallelism"] == parallelism
        )

    return wait_for(
        f"deployment {name} STABLE at parallelism {parallelism}",
        lambda: show(rest, name),
        timeout_s,
        poll_s=0.5,
        until=reached,
    )


def test_the_autoscaler_scales_up_under_load_and_back_down_when_it_falls(cluster, rest, jar):
    name = "scaled"
    auto = {
        "enabled": True,
        "minParallelism": 1,
        "maxParallelism": 2,
        "metricsWindow": "10 s",
        "stabilization": "0 s",
        "catchUp": "1 min",
    }
    put(rest, spec(jar, autoscaler=auto), name=name)
    first = wait_lifecycle(rest, "STABLE", name=name)
    job = first["status"]["jobId"]
    assert first["status"]["parallelism"] == 1 and first["status"]["autoscaler"]["heldOff"] is None

    # Above what one core does (4,000 rows/s in the simulation): to 2, the same job through a savepoint.
    figures = FakeTaskFigures(cluster, rest, job, 6000, 1)
    try:
        up = wait_parallelism(rest, 2, name=name)
    finally:
        figures.stop()
    assert up["status"]["jobId"] == job and up["spec"]["parallelism"] == 1
    assert any(e["reason"].startswith("autoscaler: scale-up from 1 to 2") for e in up["status"]["history"])
    assert [s["trigger"] for s in up["savepoints"]][-1:] == ["rescale"]
    evaluations = rest.get(f"/deployments/{name}/autoscaler")["evaluations"]
    ups = [e for e in evaluations if e["outcome"] == "scale-up"]
    assert len(ups) == 1 and ups[0]["proposed"] == 2 and ups[0]["figures"]["arrivalRate"] > 4000, ups

    # /metrics is cached for a moment. The lines naming a deployment (every figure looked for below names one)
    # are kept, and shown on a timeout.
    def deployment_lines() -> str:
        return "\n".join(line for line in rest.http.get("/metrics").text.splitlines() if "deployment" in line)

    text = wait_for(
        "the deployment's parallelism 2 in /metrics",
        deployment_lines,
        10,
        poll_s=0.5,
        until=lambda lines: f'headrace_deployment_parallelism{{deployment="{name}"}} 2.0' in lines,
    )
    assert f'headrace_autoscaler_rescales_total{{deployment="{name}"}} 1.0' in text
    assert f'headrace_autoscaler_arrival_rows_per_second{{deployment="{name}"}}' in text

    # The input falls to what one core does easily: back to 1 after the stabilization.
    figures = FakeTaskFigures(cluster, rest, job, 500, 2)
    try:
        down = wait_parallelism(rest, 1, name=name)
    finally:
        figures.stop()
    assert down["status"]["jobId"] == job
    outcomes = [e["outcome"] for e in rest.get(f"/deployments/{name}/autoscaler")["evaluations"]]
    assert outcomes.count("scale-up") == 1 and outcomes.count("scale-down") == 1, outcomes

    # Turned off: the spec's parallelism again, and no more evaluations.
    put(rest, spec(jar, parallelism=1), name=name)
    wait_lifecycle(rest, "STABLE", generation=2, name=name)
    assert rest.get(f"/deployments/{name}/autoscaler")["enabled"] is False
    assert rest.http.delete(f"/deployments/{name}?savepoint=false").status_code == 202


def test_bad_autoscaler_specs_are_refused_naming_the_field(rest, jar):
    for auto, field in [
        ({"enabled": True, "minParallelism": 3, "maxParallelism": 2}, "minParallelism"),
        ({"enabled": True, "targetUtilization": 1.5}, "targetUtilization"),
        ({"enabled": True, "metricsWindow": "1 s"}, "metricsWindow"),
        ({"enabled": True, "metricsWindow": "1 h"}, "metricsWindow"),
        ({"enabled": True, "maxParalelism": 2}, "maxParalelism"),
    ]:
        r = rest.http.put("/deployments/refused", json=spec(jar, autoscaler=auto))
        assert r.status_code == 400 and field in r.text, (auto, r.text)


def test_the_autoscaler_proposes_no_parallelism_a_taskmanager_cannot_hold(cluster, rest, jar):
    # State partitions 8 and a lag that needs 6 would let it choose 6, which no TaskManager (4 slots
    # each) can hold: it chooses 4, says why, and the rescaled job runs (issue 42.5: a rescale to 6
    # failed with NoResourceAvailableException and the deployment rolled back).
    name = "overreach"
    auto = {
        "enabled": True,
        "minParallelism": 1,
        "maxParallelism": 6,
        "metricsWindow": "10 s",
        "stabilization": "0 s",
        "catchUp": "1 min",
    }
    body = spec(jar, autoscaler=auto)
    body["flinkConfiguration"]["pipeline.max-parallelism"] = 8
    put(rest, body, name=name)
    job = wait_lifecycle(rest, "STABLE", name=name)["status"]["jobId"]
    # A source limited to 2,000 rows a batch: a batch a second, and the lag it leaves grows.
    figures = FakeTaskFigures(cluster, rest, job, 15000, 1, max_batch=2000)
    try:
        scaled = wait_for(
            "the deployment STABLE after a scale-up",
            lambda: (lambda st: st if st["parallelism"] > 1 and st["lifecycleState"] == "STABLE" else None)(
                rest.get(f"/deployments/{name}")["status"]
            ),
            timeout_s=90,
        )
    finally:
        figures.stop()
    reasons = [e["reason"] for e in scaled["history"]]
    up = [r for r in reasons if r.startswith("autoscaler: scale-up from 1 to ")]
    assert up and "bounded by the slots a TaskManager can give 4" in up[0], reasons
    assert scaled["parallelism"] == 4 and not any("ROLLED_BACK" == e["to"] for e in scaled["history"]), scaled

    def running_at_4(job: dict) -> bool:
        return job["state"] == "RUNNING" and job["vertices"][0]["parallelism"] == 4

    wait_for("the rescaled job RUNNING at 4", lambda: running_at_4(rest.job(scaled["jobId"])), timeout_s=60)
    assert rest.http.delete(f"/deployments/{name}?savepoint=false").status_code == 202
