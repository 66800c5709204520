"""Issue 21 findings 1, 3 and 4 on a real cluster, as a hostile client with a stolen TaskManager
credential (tm-1's derived keys, and the Redis access any TaskManager has) would try them.

Everything forged is written straight into Redis with the admin connection, so what is tested is
the message layer alone (Redis ACLs are a second fence, tested elsewhere): each forgery must end
up in the dead letters with its reason, and nothing of it may happen: no file runs, no job
finishes or is cancelled, no TaskManager registers, and the real JobManager is still obeyed.
"""

from __future__ import annotations

import hashlib
import json
import time
import urllib.request

import pytest
import redis

from shared import cluster_keys, leader_epoch, streams
from shared.commands import CANCEL_TASK, DEPLOY_TASK, CommandGateway, make_celery
from shared.ids import new_allocation_id, new_execution_id, new_job_id, new_vertex_id
from shared.message_auth import TaskManagerAuth, TaskManagerKeys, control_plane_auth, load_secret
from shared.messages import (
    CancelJob,
    CancelTask,
    DeployTask,
    RegisterTaskManager,
    TaskManagerHeartbeat,
    TaskStateChanged,
    encode,
    wrap,
)
from shared.states import ExecutionState as ES
from shared.task_protocol import TaskSpec
from tests.clusters import start_cluster
from tests.integration.bus_reading import dead_letters_since, dlq_tail, reports_since, tails, wait_for_at_least


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, pg_url_module):
    c = start_cluster(tmp_path_factory.mktemp("signed-home"), catalog_url=pg_url_module, taskmanagers=2, slots=2)
    yield c
    c.stop()


@pytest.fixture(scope="module")
def client(cluster):
    c = redis.Redis.from_url(cluster.redis_url)
    yield c
    c.close()


@pytest.fixture(scope="module")
def stolen(cluster):
    """What a compromised tm-1 holds: its own two derived keys, never the cluster secret."""
    secret = load_secret(cluster.settings, create=False)
    return TaskManagerAuth(["tm-1"], keys={"tm-1": TaskManagerKeys.derive(secret, "tm-1")})


def pipeline_writing(directory, marker) -> str:
    """A pipeline file that leaves `marker` behind the moment anything imports it."""
    path = directory / "evil.py"
    path.write_text(f"open({str(marker)!r}, 'w').write('ran')\n\ndef build(ctx):\n    pass\n")
    return str(path)


def deploy_for(tm: str, artifact_path: str, sha256: str | None) -> DeployTask:
    ex = new_execution_id()
    spec = TaskSpec(
        job_id=new_job_id(),
        vertex_id=new_vertex_id(),
        execution_id=ex,
        attempt=0,
        parallelism=1,
        kind="pyspark",
        artifact_path=artifact_path,
        artifact_sha256=sha256,
        checkpoint_dir=f"/tmp/{ex}",
        catalog_url="sqlite://",
        redis_url="redis://",
    )
    return DeployTask(taskmanager_id=tm, allocation_id=new_allocation_id(), slot_indices=(0,), spec=spec)


def send_command(cluster, task: str, queue: str, args: list) -> None:
    app = make_celery(cluster.redis_url, "forger")
    try:
        app.send_task(task, args=args, queue=queue, routing_key=queue, expires=60)
    finally:
        app.close()


def xadd(client, stream: str, body, *, sender: str, signature: str | None = None, epoch: int = 0) -> bytes:
    raw = encode(wrap(body, sender=sender, epoch=epoch))
    client.xadd(stream, {b"m": raw, **({b"s": signature} if signature else {})})
    return raw


def signed_xadd(client, stream: str, body, *, sender: str, auth) -> None:
    raw = encode(wrap(body, sender=sender))
    client.xadd(stream, {b"m": raw, b"s": auth.sign(stream, sender, raw)})


def jm_reports(client, since: dict[str, str], kind: str) -> list:
    return reports_since(client, since, kind)


def noop(rest, jar) -> tuple[str, dict]:
    job = rest.run(jar, kind="noop", parallelism=1, restartStrategy={"type": "none"}, config={"noop.duration": -1})
    [attempt] = rest.wait_attempt_running(job, 0, timeout_s=20)
    return job, attempt


def cancel_and_free(rest, job) -> None:
    rest.cancel(job)
    assert rest.wait_state(job, "CANCELED", timeout_s=15)["state"] == "CANCELED"
    assert rest.wait_free_slots(4, timeout_s=10) == 4


def test_a_forged_deploy_never_runs_whatever_it_is_signed_with(cluster, client, stolen, tmp_path):
    """(a) Finding 1: a DeployTask for tm-2 built like the JobManager's (current epoch) naming a
    file outside the artifact directory. Unsigned, or signed with what tm-1 holds: dead-lettered,
    nobody told, nothing runs. Signed as the leader itself: refused for its artifact."""
    marker = tmp_path / "ran"
    evil = pipeline_writing(tmp_path, marker)
    digest = hashlib.sha256(open(evil, "rb").read()).hexdigest()
    epoch = leader_epoch.current(client)
    queue = streams.tm_queue("tm-2")
    mark, jm_len = dlq_tail(client), tails(client, streams.JM_STREAM)
    forged = [
        encode(wrap(deploy_for("tm-2", evil, digest), sender="jobmanager", epoch=epoch)).decode() for _ in range(3)
    ]
    send_command(cluster, DEPLOY_TASK, queue, [forged[0]])  # unsigned
    send_command(cluster, DEPLOY_TASK, queue, [forged[1], stolen.sign_command("tm-1", forged[1].encode())])
    send_command(
        cluster,
        DEPLOY_TASK,
        queue,
        [forged[2], cluster_keys.sign(stolen.sender_key("taskmanager:tm-1"), forged[2].encode())],
    )  # its sender key
    letters = wait_for_at_least("dead letter", lambda: dead_letters_since(client, mark), 3)
    errors = sorted(d["error"].decode() for d in letters)
    assert len(letters) == 3 and all(d["queue"] == queue.encode() for d in letters)
    assert errors[0].startswith("bad signature") and errors[1].startswith("bad signature"), errors
    assert errors[2].startswith("unsigned command"), errors
    # The leader's own key, an artifact outside the artifact directory: refused, reported, not run.
    outside = deploy_for("tm-2", evil, digest)
    app = make_celery(cluster.redis_url, "leader-twin")
    try:
        CommandGateway(app, sender="jobmanager", epoch=epoch, auth=control_plane_auth(cluster.settings)).deploy(
            queue, outside
        )
    finally:
        app.close()
    [rejected] = wait_for_at_least("CommandRejected", lambda: jm_reports(client, jm_len, "CommandRejected"), 1)
    assert rejected.execution_id == outside.spec.execution_id and rejected.taskmanager_id == "tm-2"
    assert "outside this TaskManager's artifact directory" in rejected.reason, rejected.reason
    time.sleep(2)  # a driver started for any of them would have imported the file by now
    assert not marker.exists(), "a forged deploy ran its file"
    assert len(jm_reports(client, jm_len, "CommandRejected")) == 1  # the forgeries told nobody
    assert jm_reports(client, jm_len, "TaskStateChanged") == []
    assert all(cluster.child(f"taskmanager-{i}").proc.poll() is None for i in (1, 2))


def test_an_artifact_changed_after_upload_is_refused_and_the_job_fails_with_the_reason(cluster, rest, tmp_path):
    """(b) The leader's own deploy of a catalog artifact whose bytes no longer match the sha256
    recorded at upload (someone wrote into the artifact directory): rejected, nothing runs."""
    marker = tmp_path / "ran"
    source = tmp_path / "pipeline.py"
    source.write_text("def build(ctx):\n    pass\n")
    jar = rest.upload(source)
    # stored under its artifact id (services/dispatcher/submission/artifacts.py)
    stored = cluster.settings.artifacts / jar
    assert stored.is_file()
    stored.write_text(f"open({str(marker)!r}, 'w').write('ran')\n\ndef build(ctx):\n    pass\n")
    job = rest.run(jar, parallelism=1, restartStrategy={"type": "none"})
    assert rest.wait_state(job, "FAILED", timeout_s=30)["state"] == "FAILED"
    root = rest.get(f"/jobs/{job}/exceptions")["root-exception"]
    assert "not the" in root and "the catalog recorded at upload" in root, root
    assert not marker.exists()
    assert rest.wait_free_slots(4, timeout_s=10) == 4


def test_a_state_report_from_a_taskmanager_that_does_not_hold_the_execution_is_refused(cluster, rest, jar, client):
    """(c) Finding 3: FINISHED for the execution of one TaskManager, sent by the other with its
    own valid keys (or naming the holder): dead-lettered; the job stays RUNNING and cancels."""
    job, attempt = noop(rest, jar)
    holder = attempt["taskmanager-id"]
    other = "tm-2" if holder == "tm-1" else "tm-1"
    secret = load_secret(cluster.settings, create=False)
    thief = TaskManagerAuth([other], keys={other: TaskManagerKeys.derive(secret, other)})
    mark = dlq_tail(client)
    for named in (other, holder):
        signed_xadd(
            client,
            streams.JM_STREAM,
            TaskStateChanged(execution_id=attempt["execution-id"], job_id=job, taskmanager_id=named, state=ES.FINISHED),
            sender=f"taskmanager:{other}",
            auth=thief,
        )
    letters = wait_for_at_least("dead letter", lambda: dead_letters_since(client, mark), 2)
    errors = [d["error"].decode() for d in letters]
    assert any(f"execution {attempt['execution-id']} is held by {holder}, not by {other}" in e for e in errors), errors
    assert any(f"names TaskManager '{holder}' but was sent by TaskManager '{other}'" in e for e in errors), errors
    time.sleep(1)
    assert rest.job(job)["state"] == "RUNNING"
    assert [(a["attempt"], a["status"]) for a in rest.attempts(job)] == [(0, "RUNNING")]
    cancel_and_free(rest, job)


def test_an_unknown_taskmanager_cannot_register_and_gets_nothing(cluster, rest, jar, client, stolen):
    """(d) Finding 4: RegisterTaskManager("evil") and its heartbeats, unsigned, signed with tm-1's
    key, or sent as tm-1: refused and counted; no slots offered, nothing deployed to tm.evil."""
    mark = dlq_tail(client)
    evil = RegisterTaskManager(taskmanager_id="evil", host="h", slots=8, cores=8, memory_bytes=1, queue="tm.evil")
    beat = TaskManagerHeartbeat(taskmanager_id="evil", slot_report=())
    for stream, body in ((streams.RM_STREAM, evil), (streams.RM_HEARTBEAT_STREAM, beat)):
        xadd(client, stream, body, sender="taskmanager:evil")  # unsigned
        raw = encode(wrap(body, sender="taskmanager:evil"))
        client.xadd(stream, {b"m": raw, b"s": cluster_keys.sign(stolen.sender_key("taskmanager:tm-1"), raw)})
        signed_xadd(client, stream, body, sender="taskmanager:tm-1", auth=stolen)  # as tm-1
    letters = wait_for_at_least("dead letter", lambda: dead_letters_since(client, mark), 6)
    errors = [d["error"].decode() for d in letters]
    assert sum(e.startswith("unsigned message") for e in errors) == 2, errors
    assert sum(e.startswith("bad signature") for e in errors) == 2, errors
    assert sum("names TaskManager 'evil' but was sent by TaskManager 'tm-1'" in e for e in errors) == 2, errors
    time.sleep(1)
    assert {tm["id"] for tm in rest.get("/taskmanagers")["taskmanagers"]} == {"tm-1", "tm-2"}
    assert rest.free_slots() == 4
    jobs = [noop(rest, jar)[0] for _ in range(2)]
    assert client.llen("tm.evil") == 0 and not client.exists(streams.tm_inbox("evil"))
    assert {rest.attempts(job)[0]["taskmanager-id"] for job in jobs} <= {"tm-1", "tm-2"}
    for job in jobs:
        rest.cancel(job)
    assert all(rest.wait_state(job, "CANCELED", timeout_s=15)["state"] == "CANCELED" for job in jobs)
    assert rest.wait_free_slots(4, timeout_s=10) == 4
    with urllib.request.urlopen(cluster.metrics_urls["resourcemanager"], timeout=5) as r:
        scraped = r.read().decode()
    refused = [
        line
        for line in scraped.splitlines()
        if line.startswith("headrace_messages_refused_total") and 'type="RegisterTaskManager"' in line
    ]
    assert refused and float(refused[0].rsplit(" ", 1)[1]) >= 3, refused


def test_a_forged_cancel_job_as_the_dispatcher_is_refused(cluster, rest, jar, client, stolen):
    """(e) CancelJob claiming sender "dispatcher" without the dispatcher's key, or sent as tm-1:
    dead-lettered; the job keeps running. So is a CancelTask of its task sent to its
    TaskManager's queue by the other TaskManager, signed with the command key that one holds."""
    job, attempt = noop(rest, jar)
    holder = attempt["taskmanager-id"]
    other = "tm-2" if holder == "tm-1" else "tm-1"
    thief = TaskManagerAuth(
        [other], keys={other: TaskManagerKeys.derive(load_secret(cluster.settings, create=False), other)}
    )
    mark = dlq_tail(client)
    xadd(client, streams.JM_STREAM, CancelJob(job_id=job), sender="dispatcher")
    raw = encode(wrap(CancelJob(job_id=job), sender="dispatcher"))
    client.xadd(streams.JM_STREAM, {b"m": raw, b"s": cluster_keys.sign(stolen.sender_key("taskmanager:tm-1"), raw)})
    signed_xadd(client, streams.JM_STREAM, CancelJob(job_id=job), sender="taskmanager:tm-1", auth=stolen)
    cancel = encode(
        wrap(
            CancelTask(taskmanager_id=holder, execution_id=attempt["execution-id"], job_id=job),
            sender="jobmanager",
            epoch=leader_epoch.current(client),
        )
    ).decode()
    send_command(cluster, CANCEL_TASK, streams.tm_queue(holder), [cancel, thief.sign_command(other, cancel.encode())])
    letters = wait_for_at_least("dead letter", lambda: dead_letters_since(client, mark), 4)
    errors = [d["error"].decode() for d in letters]
    assert any(e.startswith("unsigned message from 'dispatcher'") for e in errors), errors
    assert any(e.startswith("bad signature: this CancelJob claims sender 'dispatcher'") for e in errors), errors
    assert any("a TaskManager (taskmanager:tm-1) may not send CancelJob" in e for e in errors), errors
    assert any(e.startswith(f"bad signature: the command is not signed with TaskManager '{holder}'") for e in errors)
    time.sleep(1)
    assert rest.job(job)["state"] == "RUNNING"
    assert [(a["attempt"], a["status"]) for a in rest.attempts(job)] == [(0, "RUNNING")]
    cancel_and_free(rest, job)
    # The dead letters say where each forgery came in and keep it for the operator.
    assert {d["stream"] for d in letters if "stream" in d} == {streams.JM_STREAM.encode()}
    assert all(json.loads(d["orig.m"])["body"]["type"] in ("CancelJob", "CancelTask") for d in letters)
