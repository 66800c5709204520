"""Hostile input on a running cluster (issue 7, gap 10) and a Redis that restarts empty (gap 8).

Everything here is written straight into Redis, as another local process could: items on a
TaskManager's Celery queue that are not JSON, not kombu messages or not our commands; commands
whose spec does not validate; undecodable entries on a TaskManager's inbox stream; dead letters
of 10 MB. None of it may stop a service, and each must end up in the dead-letter stream with
its error, kept small.
"""

from __future__ import annotations

import base64
import json
import subprocess
import time

import pytest
import redis

from shared import leader_epoch, streams
from shared.commands import CANCEL_TASK, DEPLOY_TASK, make_celery
from shared.ids import new_allocation_id, new_execution_id, new_job_id, new_vertex_id
from shared.message_auth import control_plane_auth
from shared.messages import DeployTask, SubmitJob, encode, wrap
from shared.task_protocol import TaskSpec
from shared.transport import dead_letters
from shared.transport.redis_streams import RedisStreamsTransport, wait_for_redis
from tests.clusters import start_cluster
from tests.integration.bus_reading import (
    dead_letters_since,
    dlq_tail,
    kombu_item,
    reports_since,
    tails,
    wait_for_at_least,
)
from tests.waiting import wait_for

TM = "tm-1"
QUEUE = streams.tm_queue(TM)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, pg_url_module):
    c = start_cluster(tmp_path_factory.mktemp("hostile-home"), catalog_url=pg_url_module, taskmanagers=1, slots=2)
    yield c
    c.stop()


@pytest.fixture(scope="module")
def client(cluster):
    c = redis.Redis.from_url(cluster.redis_url)
    yield c
    c.close()


def assert_taskmanager_alive(cluster, pid: int | None = None):
    proc = cluster.child("taskmanager-1").proc
    assert proc.poll() is None, f"the TaskManager exited with code {proc.returncode}"
    assert pid is None or proc.pid == pid, "the TaskManager was restarted"


def command_rejections(client, mark: dict[str, str]) -> list:
    return reports_since(client, mark, "CommandRejected")


def test_garbage_on_a_taskmanager_queue_is_dead_lettered_and_the_worker_survives(cluster, rest, jar, client):
    mark, pid = dlq_tail(client), cluster.child("taskmanager-1").proc.pid
    hostile = [
        b"garbage",  # not JSON (the worker used to exit)
        b"123",  # JSON, not a message
        b'{"a": 1}',  # an object, not a kombu message
        kombu_item(DEPLOY_TASK, [], body="!!! not base64 !!!"),  # body does not decode
        kombu_item(DEPLOY_TASK, [], body=base64.b64encode(b"{not json").decode()),
        kombu_item(DEPLOY_TASK, [], body=base64.b64encode(b"[]").decode()),  # JSON, not [args, kwargs, embed]
        kombu_item(DEPLOY_TASK, [], body=base64.b64encode(b"123").decode()),  # JSON Celery cannot even look into
        kombu_item(DEPLOY_TASK, ["x"], content_type="application/x-python-serialize"),  # pickle: never decoded
        kombu_item("headrace.no_such_task", ["x"]),  # not one of our commands
        kombu_item(CANCEL_TASK, [1, 2]),  # our command, wrong arguments
        kombu_item(CANCEL_TASK, ["not an envelope"]),  # our command, payload not an envelope
        b"x" * (10 * 1024 * 1024),  # 10 MB of garbage
    ]
    for item in hostile:
        client.lpush(QUEUE, item)
    wait_for("the queue drained", lambda: client.llen(QUEUE) == 0)
    letters = wait_for_at_least("dead letter", lambda: dead_letters_since(client, mark), len(hostile))
    assert all(d["queue"] == QUEUE.encode() and d["error"] for d in letters), letters
    assert max(len(d.get("orig.item", b"")) for d in letters) <= dead_letters.PAYLOAD_KEEP_BYTES
    assert any("truncated" in d for d in letters)
    time.sleep(0.5)
    assert_taskmanager_alive(cluster, pid)
    # And it still obeys the real JobManager.
    job = rest.run(jar, kind="noop", parallelism=1, restartStrategy={"type": "none"}, config={"noop.duration": -1})
    rest.wait_attempt_running(job, 0, timeout_s=20)
    rest.cancel(job)
    assert rest.wait_state(job, "CANCELED", timeout_s=15)["state"] == "CANCELED"


def test_invalid_command_of_the_current_leader_is_dead_lettered_and_rejected(cluster, client):
    epoch = leader_epoch.current(client)
    mark, jm_len = dlq_tail(client), tails(client, streams.JM_STREAM)
    ex1, job1, ex2, job2, ex3 = new_execution_id(), new_job_id(), new_execution_id(), new_job_id(), new_execution_id()
    # A spec without vertex, attempt, parallelism, ...: the envelope does not decode (the spec
    # is typed), and it still names its attempt.
    bad_spec = deploy_with_spec(epoch, {"execution_id": ex1, "job_id": job1, "kind": "noop"})
    # An envelope that does not decode for another reason (allocation_id missing).
    undecodable = deploy_with_spec(epoch, {"execution_id": ex2, "job_id": job2})
    del undecodable["body"]["allocation_id"]
    app = make_celery(cluster.redis_url, "forger")
    # Signed with the cluster's keys: a JobManager's own bad command (the unsigned kind is
    # tests/integration/test_signed_messages.py's).
    auth = control_plane_auth(cluster.settings)
    try:
        # The last: the same bad spec from an older epoch: dead-lettered, nobody is told.
        for envelope in (bad_spec, undecodable, deploy_with_spec(epoch - 1, {"execution_id": ex3})):
            payload = json.dumps(envelope)
            app.send_task(
                DEPLOY_TASK,
                args=[payload, auth.sign_command(TM, payload.encode())],
                queue=QUEUE,
                routing_key=QUEUE,
                expires=60,
            )
    finally:
        app.close()
    rejected = wait_for_at_least("CommandRejected", lambda: command_rejections(client, jm_len), 2)
    by_execution = {r.execution_id: r for r in rejected}
    assert set(by_execution) == {ex1, ex2}, rejected
    assert by_execution[ex1].job_id == job1 and by_execution[ex1].command == "DeployTask"
    assert by_execution[ex2].job_id == job2
    assert all(r.taskmanager_id == TM and r.reason for r in rejected)
    letters = wait_for_at_least("dead letter", lambda: dead_letters_since(client, mark), 3)
    assert len(letters) == 3 and all(d["queue"] == QUEUE.encode() for d in letters)
    time.sleep(0.5)
    assert ex3 not in {r.execution_id for r in command_rejections(client, jm_len)}
    assert_taskmanager_alive(cluster)


def deploy_with_spec(epoch: int, raw_spec: dict) -> dict:
    """A JobManager's DeployTask envelope carrying `raw_spec` as it is (one that does not
    validate cannot be built as a DeployTask)."""
    spec = TaskSpec(
        job_id=new_job_id(),
        vertex_id=new_vertex_id(),
        execution_id=new_execution_id(),
        attempt=0,
        parallelism=1,
        kind="noop",
        checkpoint_dir="/tmp/x",
        redis_url="redis://",
    )
    envelope = json.loads(
        encode(
            wrap(
                DeployTask(taskmanager_id=TM, allocation_id=new_allocation_id(), slot_indices=(0,), spec=spec),
                sender="jobmanager",
                epoch=epoch,
            )
        )
    )
    envelope["body"]["spec"] = raw_spec
    return envelope


def test_undecodable_entry_on_a_taskmanager_inbox_is_dead_lettered(cluster, client):
    mark = dlq_tail(client)
    inbox = streams.tm_inbox(TM)
    client.xadd(inbox, {b"m": b"{not an envelope"})
    client.xadd(inbox, {b"other": b"field"})
    letters = wait_for_at_least("dead letter", lambda: dead_letters_since(client, mark), 2)
    assert {d["stream"] for d in letters} == {inbox.encode()}
    assert all(d["error"] for d in letters)
    assert_taskmanager_alive(cluster)


# --- the dead-letter stream itself, and a Redis that restarts empty (no cluster needed) --------------


def test_dead_letters_are_capped_in_size_and_length(redis_url):
    t = RedisStreamsTransport.from_url(redis_url, sender="test", maxlen=100_000)
    try:
        big = b"{" + b"x" * (10 * 1024 * 1024)
        for _ in range(3):
            t.client.xadd(streams.JM_STREAM, {b"m": big})
        t.poll(streams.JM_STREAM, "g", "c", lambda env: None, block_ms=10)
        letters = t.dead_letters()
        assert len(letters) == 3
        assert all(b"10485761 bytes" in d["truncated"] for d in letters), letters[0].get("truncated")
        assert t.client.memory_usage(streams.DLQ_STREAM) < 1024 * 1024
        # Length: the stream never holds many more than DLQ_MAXLEN dead letters.
        pipe = t.client.pipeline(transaction=False)
        for i in range(streams.DLQ_MAXLEN + 500):
            pipe.xadd(streams.JM_STREAM, {b"m": b"garbage %d" % i})
        pipe.execute()
        while t.poll(streams.JM_STREAM, "g", "c", lambda env: None, count=1000, block_ms=10):
            pass
        while t.client.xinfo_groups(streams.JM_STREAM)[0]["lag"]:
            t.poll(streams.JM_STREAM, "g", "c", lambda env: None, count=1000, block_ms=10)
        assert t.client.xlen(streams.DLQ_STREAM) <= streams.DLQ_MAXLEN
    finally:
        t.close()


def _start_redis(port: int, directory) -> subprocess.Popen:
    proc = subprocess.Popen(
        [
            "redis-server",
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(directory),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    wait_for_redis(f"redis://127.0.0.1:{port}/0", timeout_s=10).close()
    return proc


def test_consumer_recreates_its_group_after_redis_restarted_empty(redis_server, tmp_path):
    t = RedisStreamsTransport.from_url(redis_server.url, sender="test")
    seen: list[str] = []
    try:
        t.publish(streams.JM_STREAM, SubmitJob(job_id="before"))
        t.poll(streams.JM_STREAM, "g", "c", lambda env: seen.append(env.body.job_id), block_ms=10)
        assert seen == ["before"]
        redis_server.stop()  # no persistence: stream, group and pending entries are gone
        redis_server.proc = _start_redis(redis_server.port, tmp_path)
        for _ in range(3):  # the first command after the restart may meet the dead connection
            try:
                t.publish(streams.JM_STREAM, SubmitJob(job_id="after"))
                break
            except redis.ConnectionError:
                time.sleep(0.2)
        # The group is gone: the next poll creates it again and delivers, without an error.
        t.poll(streams.JM_STREAM, "g", "c", lambda env: seen.append(env.body.job_id), block_ms=10)
        assert seen == ["before", "after"]
    finally:
        t.close()
