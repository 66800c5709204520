"""Issue 43, the control plane's part, played on a real cluster (`headrace up`'s redis-server with
its ACL file, two TaskManagers with their own users and keys) by a hostile TaskManager host that
holds one TaskManager's credentials, and by anyone who reaches a metrics port:

- 43.4/43.11: the metrics ports serve /logs only to the control plane's signed requests; the
  dispatcher fetches a TaskManager's logs from the address its signed registration named, and
  forwards nothing of a server that cannot prove to be that TaskManager;
- 43.6: a registration that claims another TaskManager's allocation frees nothing of it;
- 43.7: a TaskManager cannot write another's progress figures, history or storage probe;
- 43.8: a TaskManager cannot trim any stream but its own (`XADD MAXLEN 0`), and a slot request the
  ResourceManager never saw gets a waiting reason, is asked again, and fails after its timeout;
- 43.13: a signed message replayed after the dedup window, or dated in the future, is refused.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

import httpx
import pytest
import redis
import yaml

from shared import job_options, leader_epoch, streams
from shared.catalog import Catalog
from shared.catalog.models import Execution
from shared.commands import CANCEL_TASK
from shared.message_auth import MAX_AGE_S, MAX_CLOCK_SKEW_S, TaskManagerAuth, TaskManagerKeys, control_plane_auth
from shared.messages import (
    CancelTask,
    RegisterTaskManager,
    ReleaseSlots,
    SlotState,
    SubmitJob,
    TaskReport,
    encode,
    wrap,
)
from shared.states import ExecutionState
from shared.transport.redis_streams import RedisStreamsTransport
from tests.clusters import start_cluster
from tests.integration.bus_reading import kombu_item
from tests.waiting import wait_for

NOPERM = redis.exceptions.NoPermissionError


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, pg_url_module):
    c = start_cluster(
        tmp_path_factory.mktemp("reach-home"),
        catalog_url=pg_url_module,
        taskmanagers=2,
        slots=2,
        heartbeat_interval_s=1.0,
        heartbeat_timeout_s=4.0,
    )
    yield c
    c.stop()


@pytest.fixture(scope="module")
def admin(cluster):
    c = redis.Redis.from_url(cluster.redis_url)
    yield c
    c.close()


def config_of(cluster, tm: str) -> dict:
    return yaml.safe_load((cluster.run_dir / f"{tm}.yaml").read_text())


def stolen(cluster, tm: str) -> tuple[redis.Redis, RedisStreamsTransport]:
    """What a compromised TaskManager host holds: its Redis user and its two keys."""
    config = config_of(cluster, tm)
    keys = TaskManagerKeys(bytes.fromhex(config["taskmanager_key"]), bytes.fromhex(config["taskmanager_command_key"]))
    client = redis.Redis.from_url(config["redis_url"], socket_timeout=10)
    auth = TaskManagerAuth([tm], keys={tm: keys})
    return client, RedisStreamsTransport(
        client, sender=f"taskmanager:{tm}", auth=auth, route=streams.taskmanager_routes(tm)
    )


def dead_letters_after(admin, stream: str, mark: str) -> list[dict]:
    return [
        {k.decode(): v.decode("utf-8", "replace") for k, v in f.items()}
        for _, f in admin.xrange(stream, min=f"({mark}")
    ]


def tail(admin, stream: str) -> str:
    newest = admin.xrevrange(stream, count=1)
    return newest[0][0].decode() if newest else "0-0"


def placement(cluster, execution_id: str) -> Execution:
    catalog = Catalog(cluster.settings.catalog)
    try:
        with catalog.session() as s:
            ex = s.get(Execution, execution_id)
            s.expunge(ex)
            return ex
    finally:
        catalog.dispose()


def noop(rest, jar, **body) -> tuple[str, dict]:
    job = rest.run(
        jar, kind="noop", parallelism=1, restartStrategy={"type": "none"}, config={"noop.duration": -1}, **body
    )
    [attempt] = rest.wait_attempt_running(job, 0, timeout_s=30)
    return job, attempt


def test_a_taskmanager_writes_to_no_stream_but_its_own(cluster, admin, rest, jar):
    """43.8: XADD is all a publisher is granted, and Redis cannot refuse its MAXLEN: every stream
    a TaskManager may XADD to is its own. The control plane's streams, the dead letters and the
    other TaskManager's streams all answer NOPERM; the cluster runs on the TaskManagers' streams."""
    tm1, _ = stolen(cluster, "tm-1")
    others = [
        streams.JM_STREAM,
        streams.RM_STREAM,
        streams.RM_HEARTBEAT_STREAM,
        streams.DLQ_STREAM,
        streams.tm_rm_stream("tm-2"),
        streams.tm_jm_stream("tm-2"),
        streams.tm_dead_letters("tm-2"),
    ]
    lengths = {s: admin.xlen(s) for s in others}
    for stream in others:
        with pytest.raises(NOPERM):
            tm1.xadd(stream, {"m": b"x"}, maxlen=0, approximate=False)
        with pytest.raises(NOPERM):
            tm1.xtrim(stream, maxlen=0)
    # Its own: it can cut them short, which only silences itself.
    assert tm1.xadd(streams.tm_dead_letters("tm-1"), {"probe": b"1"}, maxlen=10_000, approximate=True)
    with pytest.raises(NOPERM):  # ... and read nobody's, its own report streams included
        tm1.xrange(streams.tm_jm_stream("tm-2"))
    assert all(admin.xlen(s) >= n for s, n in lengths.items()), lengths
    # The cluster speaks through the TaskManagers' own streams: registrations, heartbeats, reports.
    assert admin.xlen(streams.tm_rm_stream("tm-1")) > 0 and admin.xlen(streams.tm_rm_stream("tm-2")) > 0
    job, attempt = noop(rest, jar)
    on = placement(cluster, attempt["execution-id"]).taskmanager_id
    assert any(b"TaskStateChanged" in f[b"m"] for _, f in admin.xrange(streams.tm_jm_stream(on))), on
    rest.cancel(job)
    rest.wait_state(job, "CANCELED", timeout_s=20)


def test_a_slot_request_the_resourcemanager_never_saw_waits_visibly_is_asked_again_and_times_out(
    cluster, admin, rest, jar
):
    """43.8: the ResourceManager paused, its stream emptied under it (what a TaskManager could do
    before, with XADD MAXLEN 0): the attempt says what it waits for, the JobManager asks again, and
    a request still unanswered at its timeout fails the attempt, as the ResourceManager's would."""
    rm = cluster.child("resourcemanager").proc.pid
    os.killpg(rm, signal.SIGSTOP)
    try:
        before = admin.xlen(streams.RM_STREAM)
        job = rest.run(
            jar,
            kind="noop",
            parallelism=1,
            restartStrategy={"type": "none"},
            config={"noop.duration": -1, job_options.SLOT_REQUEST_TIMEOUT: "9 s"},
        )
        wait_for("the slot request", lambda: admin.xlen(streams.RM_STREAM) > before, timeout_s=20)
        admin.xtrim(streams.RM_STREAM, maxlen=0, approximate=False)  # lost: the ResourceManager never sees it
        seen = wait_for(
            "a waiting reason naming the silent ResourceManager",
            lambda: "has not answered" in (rest.job(job).get("waiting-reason") or "") and rest.job(job),
            timeout_s=20,
        )
        assert "asked again" in seen["waiting-reason"], seen
        assert admin.xlen(streams.RM_STREAM) >= 1  # the request, sent again
        admin.xtrim(streams.RM_STREAM, maxlen=0, approximate=False)  # lost again
        failed = rest.wait_state(job, "FAILED", timeout_s=30)
        causes = rest.get(f"/jobs/{job}/exceptions")
        text = json.dumps(causes)
        assert "NoResourceAvailableException" in text and "never answered" in text, (failed, text[:2000])
    finally:
        os.killpg(rm, signal.SIGCONT)
    # Asked again while the ResourceManager is only slow: it answers the copy, and the job runs.
    os.killpg(rm, signal.SIGSTOP)
    try:
        before = admin.xlen(streams.RM_STREAM)
        job = rest.run(jar, kind="noop", parallelism=1, restartStrategy={"type": "none"}, config={"noop.duration": -1})
        wait_for("the slot request", lambda: admin.xlen(streams.RM_STREAM) > before, timeout_s=20)
        admin.xtrim(streams.RM_STREAM, maxlen=0, approximate=False)
        wait_for("the request asked again", lambda: admin.xlen(streams.RM_STREAM) >= 1, timeout_s=20)
    finally:
        os.killpg(rm, signal.SIGCONT)
    rest.wait_attempt_running(job, 0, timeout_s=30)
    rest.cancel(job)
    rest.wait_state(job, "CANCELED", timeout_s=20)


def test_a_registration_claiming_another_taskmanagers_allocation_frees_nothing(cluster, admin, rest, jar):
    """43.6: a validly signed registration of one TaskManager that lists the other's running
    allocation as its own. Dead-lettered naming both; the victim keeps its slots and task; the
    next jobs are placed where slots are free and run."""
    job, attempt = noop(rest, jar)
    ex = placement(cluster, attempt["execution-id"])
    victim = ex.taskmanager_id
    hostile = "tm-2" if victim == "tm-1" else "tm-1"
    assert rest.wait_free_slots(3) == 3
    mark = tail(admin, streams.DLQ_STREAM)
    _, transport = stolen(cluster, hostile)
    endpoint = json.loads(admin.hget(streams.RM_TM_ENDPOINTS_KEY, hostile))  # kept, as its process would
    transport.publish(
        streams.RM_STREAM,
        RegisterTaskManager(
            taskmanager_id=hostile,
            host="evil",
            slots=2,
            cores=2,
            memory_bytes=1 << 30,
            queue=streams.tm_queue(hostile),
            log_endpoint=endpoint["address"],
            main_log=endpoint.get("log"),
            slot_report=(SlotState(index=0, allocation_id=ex.allocation_id, job_id=ex.job_id, execution_id=ex.id),),
            running=(
                TaskReport(
                    execution_id=ex.id, job_id=ex.job_id, state=ExecutionState.RUNNING, allocation_id=ex.allocation_id
                ),
            ),
        ),
    )
    letters = wait_for(
        "the claim dead-lettered",
        lambda: [d for d in dead_letters_after(admin, streams.DLQ_STREAM, mark) if "claims allocations" in d["error"]],
        timeout_s=20,
    )
    assert ex.allocation_id in letters[0]["error"] and f"placed on {victim}" in letters[0]["error"], letters
    time.sleep(2)  # what a freed allocation would show by now (the ResourceManager writes every 0.5 s)
    assert rest.free_slots() == 3
    assert rest.attempts(job)[-1]["status"] == "RUNNING"
    second, _ = noop(rest, jar)
    third, attempt3 = noop(rest, jar)
    assert placement(cluster, attempt3["execution-id"]).allocation_id != ex.allocation_id
    for j in (job, second, third):
        rest.cancel(j)
        assert rest.wait_state(j, "CANCELED", timeout_s=20)["state"] == "CANCELED"
    assert rest.wait_free_slots(4, timeout_s=15) == 4


def test_a_taskmanager_cannot_write_another_ones_figures_history_or_probe(cluster, admin):
    """43.7: each TaskManager's progress figures, their history and its storage-probe value are
    under its own prefix; the other's answer NOPERM (a future-id XADD that would freeze a
    history included); the old shared keys are gone from its rules."""
    tm1, _ = stolen(cluster, "tm-1")
    execution = "e" * 32
    future = f"{int(time.time() * 1000) + 10**9}-0"
    for forbidden in (
        lambda: tm1.hset(streams.progress_key("tm-2", execution), "input_rows_per_second", 1e9),
        lambda: tm1.xadd(streams.progress_history_key("tm-2", execution), {"batch_id": 1}, id=future),
        lambda: tm1.set(streams.tm_storage_probe_key("tm-2"), "forged"),
        lambda: tm1.hset("hr:tm:storage-probe", "tm-2", "forged"),
        lambda: tm1.hset(f"hr:tm:progress:{execution}", "batch_id", 1),
    ):
        with pytest.raises(NOPERM):
            forbidden()
    assert admin.get(streams.tm_storage_probe_key("tm-2")) is not None  # tm-2 probed at its start
    # Its own figures are its own to write.
    tm1.hset(streams.progress_key("tm-1", execution), "batch_id", 1)
    tm1.delete(streams.progress_key("tm-1", execution))


def test_logs_are_served_to_the_control_plane_only_from_where_the_taskmanager_registered(cluster, admin, rest):
    """43.4 and 43.11: the metrics ports answer /logs only to a signed request; a TaskManager that
    rewrites its endpoint key does not move where the dispatcher fetches; one that registers a
    foreign address gets the dispatcher's request sent there, never that server's answer back."""
    for name in ("taskmanager-1", "jobmanager", "resourcemanager"):
        base = cluster.metrics_urls[name].rsplit("/", 1)[0]
        for path in ("/logs", "/logs/taskmanager-1.log", "/logs/jobmanager.log"):
            r = httpx.get(base + path, timeout=5)
            assert r.status_code == 403 and "only to the dispatcher" in r.text, (name, path, r.text)
        assert httpx.get(base + "/metrics", timeout=5).status_code == 200
    assert "taskmanager-1.log" in {f["name"] for f in rest.get("/taskmanagers/tm-1/logs")["logs"]}
    assert "jobmanager.log" in {f["name"] for f in rest.get("/jobmanager/logs")["logs"]}

    # A server the hostile TaskManager points at: it records what it is asked and answers a secret.
    asked: list[str] = []

    class Secret(BaseHTTPRequestHandler):
        def do_GET(self):
            asked.append(self.path)
            body = b'{"logs": [{"name": "SECRET-INTERNAL", "size": 1, "mtime": 1}]}'
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Secret)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    internal = f"http://127.0.0.1:{server.server_port}"
    tm1, transport = stolen(cluster, "tm-1")
    real = json.loads(admin.hget(streams.RM_TM_ENDPOINTS_KEY, "tm-1"))
    try:
        tm1.set(streams.tm_endpoint_key("tm-1"), json.dumps({"address": internal}), px=60_000)
        assert rest.get("/taskmanagers/tm-1/logs")["logs"] and not asked  # the key is not where it fetches

        mark = tail(admin, streams.DLQ_STREAM)
        for bad in ("file:///etc/passwd", "http://user:pw@127.0.0.1:1", "gopher://127.0.0.1:70", "http://127.0.0.1"):
            transport.publish(streams.RM_STREAM, registration("tm-1", bad))
        wait_for(
            "the bad endpoints dead-lettered",
            lambda: (
                len(
                    [
                        d
                        for d in dead_letters_after(admin, streams.DLQ_STREAM, mark)
                        if "names log endpoint" in d["error"]
                    ]
                )
                == 4
            ),
            timeout_s=20,
        )
        wait_for("no endpoint kept", lambda: admin.hget(streams.RM_TM_ENDPOINTS_KEY, "tm-1") is None, timeout_s=10)
        r = rest.http.get("/taskmanagers/tm-1/logs")
        assert r.status_code == 503 and "registered no log endpoint" in r.text, r.text

        transport.publish(streams.RM_STREAM, registration("tm-1", internal))
        wait_for(
            "the foreign endpoint kept",
            lambda: internal in (admin.hget(streams.RM_TM_ENDPOINTS_KEY, "tm-1") or b"").decode(),
            timeout_s=20,
        )
        for path in ("/taskmanagers/tm-1/logs", "/taskmanagers/tm-1/logs/x.log", "/taskmanagers/tm-1/log"):
            r = rest.http.get(path)
            assert r.status_code == 502 and "did not prove" in r.text and "SECRET" not in r.text, (path, r.text)
        assert asked and all(p.startswith("/logs") for p in asked), asked
    finally:
        transport.publish(streams.RM_STREAM, registration("tm-1", real["address"], real.get("log")))
        server.shutdown()
    wait_for("tm-1's logs again", lambda: rest.http.get("/taskmanagers/tm-1/logs").status_code == 200, timeout_s=20)


def registration(tm: str, endpoint: str, main_log: str | None = None) -> RegisterTaskManager:
    return RegisterTaskManager(
        taskmanager_id=tm,
        host="h",
        slots=2,
        cores=2,
        memory_bytes=1 << 30,
        queue=streams.tm_queue(tm),
        log_endpoint=endpoint,
        main_log=main_log,
    )


def test_a_signed_message_replayed_after_the_dedup_window_or_from_the_future_is_refused(cluster, admin, rest, jar):
    """43.13: envelopes validly signed by the control plane (and a command by the JobManager's
    key), but sent more than the window ago or from too far ahead: dead letters saying why."""
    auth = control_plane_auth(cluster.settings)
    job, attempt = noop(rest, jar)
    on = placement(cluster, attempt["execution-id"]).taskmanager_id
    mark, tm_mark = tail(admin, streams.DLQ_STREAM), tail(admin, streams.tm_dead_letters(on))
    for age in (MAX_AGE_S + 60, -(MAX_CLOCK_SKEW_S + 120)):
        env = wrap(SubmitJob(job_id="0" * 32), sender="dispatcher").model_copy(update={"sent_at": time.time() - age})
        raw = encode(env)
        admin.xadd(streams.JM_STREAM, {b"m": raw, b"s": auth.sign(streams.JM_STREAM, "dispatcher", raw)})
    letters = wait_for(
        "two refusals",
        lambda: (lambda d: d if len(d) >= 2 else None)(
            [d for d in dead_letters_after(admin, streams.DLQ_STREAM, mark) if "SubmitJob" in d["error"]]
        ),
        timeout_s=20,
    )
    assert letters[0]["error"].startswith("stale:") and "min ago" in letters[0]["error"], letters
    assert letters[1]["error"].startswith("from the future:"), letters

    # A cancel of the running task, signed with its TaskManager's command key, but three hours old.
    epoch = leader_epoch.current(admin)
    env = wrap(
        CancelTask(taskmanager_id=on, execution_id=attempt["execution-id"], job_id=job),
        sender="jobmanager",
        epoch=epoch,
    ).model_copy(update={"sent_at": time.time() - 3 * 3600})
    payload = encode(env).decode()
    admin.lpush(
        streams.tm_queue(on),
        kombu_item(CANCEL_TASK, [payload, auth.sign_command(on, payload.encode())], queue=streams.tm_queue(on)),
    )
    wait_for(
        "the stale command dead-lettered",
        lambda: [
            d
            for d in dead_letters_after(admin, streams.tm_dead_letters(on), tm_mark)
            if d["error"].startswith("stale:")
        ],
        timeout_s=20,
    )
    # And on the ResourceManager's stream: a release of the running task's slots, three hours old.
    held = placement(cluster, attempt["execution-id"]).allocation_id
    env = wrap(ReleaseSlots(allocation_id=held, reason="replayed"), sender="jobmanager", epoch=epoch).model_copy(
        update={"sent_at": time.time() - 3 * 3600}
    )
    raw = encode(env)
    admin.xadd(streams.RM_STREAM, {b"m": raw, b"s": auth.sign(streams.RM_STREAM, "jobmanager", raw)})
    wait_for(
        "the stale release dead-lettered",
        lambda: [
            d
            for d in dead_letters_after(admin, streams.DLQ_STREAM, mark)
            if "ReleaseSlots" in d["error"] and d["error"].startswith("stale:")
        ],
        timeout_s=20,
    )
    assert rest.attempts(job)[-1]["status"] == "RUNNING"
    assert placement(cluster, attempt["execution-id"]).allocation_id == held
    rest.cancel(job)
    rest.wait_state(job, "CANCELED", timeout_s=20)
