"""Issue 21 finding 5: a TaskManager's Redis credential rules only itself, and publishers only
publish. Probed on a `headrace up` cluster's real redis-server (its ACL file) as a hostile
TaskManager, or a stolen service password, would: every forbidden command answers NOPERM and
nothing of the streams is lost; Celery's remote control stops no worker; a TaskManager added
with `headrace credentials` works until revoked."""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from typing import Callable

import pytest
import redis
import yaml

from services.cluster import redis_auth
from shared import streams
from tests.clusters import start_cluster
from tests.waiting import wait_for

NOPERM = redis.exceptions.NoPermissionError
PUBLISHED_STREAMS = (streams.JM_STREAM, streams.RM_STREAM, streams.DLQ_STREAM)
APP = "shared.commands:celery_app"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, pg_url_module):
    c = start_cluster(tmp_path_factory.mktemp("acl-home"), catalog_url=pg_url_module, taskmanagers=2, slots=1)
    yield c
    c.stop()


def url_of(cluster, name: str) -> str:
    path = cluster.run_dir / f"{name}.yaml"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    return yaml.safe_load(path.read_text())["redis_url"]


def client(cluster, name: str) -> redis.Redis:
    return redis.Redis.from_url(url_of(cluster, name), socket_timeout=10)


def lengths(admin: redis.Redis) -> dict[str, int]:
    return {s: admin.xlen(s) for s in PUBLISHED_STREAMS}


def celery(cluster, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HEADRACE_")}
    env["HEADRACE_REDIS_URL"] = cluster.redis_url  # the admin user: the only one that may publish to the pidbox
    return subprocess.run(
        [sys.executable, "-m", "celery", "-A", APP, *args], env=env, capture_output=True, text=True, timeout=60
    )


def test_each_taskmanager_has_its_own_user_and_the_shared_one_is_gone(cluster):
    admin = redis.Redis.from_url(cluster.redis_url)
    for tm in ("tm-1", "tm-2"):
        assert redis.Redis.from_url(url_of(cluster, tm)).acl_whoami() == redis_auth.taskmanager_user(tm)
        config = yaml.safe_load((cluster.run_dir / f"{tm}.yaml").read_text())
        assert not config.get("cluster_secret")
    assert admin.acl_getuser("taskmanager") is None
    assert not (cluster.run_dir / "taskmanager.yaml").exists()


def test_a_taskmanager_cannot_touch_another_ones_queue_or_inbox(cluster):
    admin = redis.Redis.from_url(cluster.redis_url)
    tm1 = client(cluster, "tm-1")
    queued = admin.llen("tm.tm-2")
    for forged in (
        lambda: tm1.lpush("tm.tm-2", b"forged cancel"),
        lambda: tm1.rpop("tm.tm-2"),
        lambda: tm1.brpop(["tm.tm-2"], timeout=1),
        lambda: tm1.delete("tm.tm-2"),
        lambda: tm1.lpush("tm.tm-10", b"x"),  # a longer id that starts like its own
        lambda: tm1.xreadgroup("taskmanager", "me", {streams.tm_inbox("tm-2"): ">"}),
        lambda: tm1.xread({streams.tm_inbox("tm-2"): "0"}),
        lambda: tm1.delete(streams.tm_inbox("tm-2")),
        lambda: tm1.set(streams.tm_endpoint_key("tm-2"), "{}"),
        lambda: tm1.set(streams.JM_EPOCH_KEY, 10**12),
    ):
        with pytest.raises(NOPERM):
            forged()
    assert admin.llen("tm.tm-2") == queued
    # Its own are its own.
    assert tm1.llen("tm.tm-1") >= 0 and tm1.xlen(streams.tm_inbox("tm-1")) >= 0


def stream_changes_a_publisher_may_not_make(user: redis.Redis, stream: str) -> list[Callable[[], object]]:
    return [
        lambda: user.delete(stream),
        lambda: user.xtrim(stream, maxlen=0),
        lambda: user.xgroup_destroy(stream, "jobmanager"),
        lambda: user.xgroup_create(stream, "mine", id="0"),
        lambda: user.xdel(stream, "0-1"),
        lambda: user.execute_command("XSETID", stream, "0-1"),
        lambda: user.xclaim(stream, "jobmanager", "me", 0, ["0-1"]),
        lambda: user.xautoclaim(stream, "jobmanager", "me", 0),
        lambda: user.rename(stream, "mine"),
        lambda: user.expire(stream, 1),
    ]


def test_a_taskmanager_only_xadds_to_the_streams_it_reports_on(cluster):
    admin = redis.Redis.from_url(cluster.redis_url)
    tm1 = client(cluster, "tm-1")
    before = lengths(admin)
    # Its reports go to streams of its own (an XADD may trim: no stream is shared with another
    # writer). The JobManager dead-letters this unsigned entry, so the dead letters grow by one.
    tm1.xadd(streams.tm_jm_stream("tm-1"), {"m": b"not an envelope"}, maxlen=100_000, approximate=True)
    for stream in PUBLISHED_STREAMS:
        with pytest.raises(NOPERM):
            tm1.xadd(stream, {"m": b"x"}, maxlen=100_000, approximate=True)
        for forbidden in stream_changes_a_publisher_may_not_make(tm1, stream):
            with pytest.raises(NOPERM):
                forbidden()
    for stream in (streams.tm_rm_stream("tm-1"), streams.tm_jm_stream("tm-1")):
        for forbidden in stream_changes_a_publisher_may_not_make(tm1, stream):
            with pytest.raises(NOPERM):
                forbidden()
    # Nothing was lost: every stream is at least as long as before.
    after = lengths(admin)
    assert all(after[s] >= before[s] for s in PUBLISHED_STREAMS), (before, after)
    # Celery's remote control: a TaskManager listens, it never commands.
    with pytest.raises(NOPERM):
        tm1.publish("/0.celery.pidbox", b"{}")
    sub = tm1.pubsub()
    sub.psubscribe("/0.celery.pidbox")  # what its worker does
    sub.close()


@pytest.mark.parametrize(
    "service, streams_it_publishes_to",
    [
        ("dispatcher", (streams.JM_STREAM, streams.DLQ_STREAM)),
        ("jobmanager", (streams.RM_STREAM, streams.DLQ_STREAM)),
        ("resourcemanager", (streams.JM_STREAM, streams.tm_inbox("tm-1"), streams.DLQ_STREAM)),
    ],
)
def test_services_only_xadd_to_streams_they_do_not_consume(cluster, service, streams_it_publishes_to):
    admin = redis.Redis.from_url(cluster.redis_url)
    user = client(cluster, service)
    for stream in streams_it_publishes_to:
        before = admin.xlen(stream)
        user.xadd(stream, {"probe": b"1"}, maxlen=100_000, approximate=True)
        for forbidden in stream_changes_a_publisher_may_not_make(user, stream):
            with pytest.raises(NOPERM):
                forbidden()
        # (the probe may already be consumed and acknowledged, never deleted)
        assert admin.xlen(stream) >= min(before, 1)
    if service == "jobmanager":
        # It pushes commands onto the TaskManagers' queues and does nothing else with them.
        with pytest.raises(NOPERM):
            user.delete("tm.tm-1")
        with pytest.raises(NOPERM):
            user.rpop("tm.tm-1")


def worker_name(tm: str) -> str:
    return f"{tm}@{socket.gethostname()}"


def test_celery_remote_control_cannot_stop_a_taskmanager_even_from_the_admin(cluster, rest, jar):
    pid = cluster.child("taskmanager-1").proc.pid
    for command in (["shutdown"], ["add_consumer", "tm.tm-2"], ["pool_restart"], ["revoke", "some-task-id"]):
        out = celery(cluster, "control", *command, "-d", worker_name("tm-1"), "--timeout", "3", "--json")
        assert "disabled on Headrace TaskManagers" in out.stdout + out.stderr, out.stdout + out.stderr
    time.sleep(2)
    assert cluster.child("taskmanager-1").proc.poll() is None and cluster.child("taskmanager-1").proc.pid == pid
    ping = celery(cluster, "inspect", "ping", "-d", worker_name("tm-1"), "--timeout", "3", "--json")
    assert json.loads(ping.stdout.strip().splitlines()[-1]) == {worker_name("tm-1"): {"ok": "pong"}}, ping.stderr
    queues = celery(cluster, "inspect", "active_queues", "-d", worker_name("tm-1"), "--timeout", "3", "--json")
    names = {q["name"] for qs in json.loads(queues.stdout.strip().splitlines()[-1]).values() for q in qs}
    assert names == {"tm.tm-1"}
    log = cluster.child("taskmanager-1").log.read_text(errors="replace")
    assert "refused Celery remote control command 'shutdown'" in log
    # And it still takes work.
    job = rest.run(jar, kind="noop", parallelism=1, restartStrategy={"type": "none"}, config={"noop.duration": 0.3})
    assert rest.wait_state(job, ("FINISHED", "FAILED", "CANCELED"), timeout_s=60)["state"] == "FINISHED"


def credentials(cluster, *args: str, cwd=None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HEADRACE_")}
    env["HEADRACE_CONFIG"] = str(cluster.run_dir / "config.yaml")  # the control plane's (admin) settings
    return subprocess.run(
        [sys.executable, "-m", "services.cli", "credentials", "taskmanager", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
    )


def test_bad_ids_and_a_service_users_url_get_a_clear_error(cluster, tmp_path):
    bad = credentials(cluster, "tm-*", "--out", str(tmp_path / "x.yaml"))
    assert bad.returncode == 2 and "must be 1-100 letters, digits" in bad.stderr
    env = {k: v for k, v in os.environ.items() if not k.startswith("HEADRACE_")}
    env["HEADRACE_CONFIG"] = str(cluster.run_dir / "jobmanager.yaml")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "services.cli",
            "credentials",
            "taskmanager",
            "tm-9",
            "--out",
            str(tmp_path / "tm-9.yaml"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 1 and "may not manage ACL users" in out.stderr, out.stderr
    assert not (tmp_path / "tm-9.yaml").exists()


def test_a_taskmanager_added_by_hand_works_survives_an_acl_reload_and_is_revoked(cluster, rest, tmp_path):
    admin = redis.Redis.from_url(cluster.redis_url)
    path = tmp_path / "tm-3.yaml"
    made = credentials(cluster, "tm-3", "--out", str(path))
    assert made.returncode == 0, made.stderr
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    config = yaml.safe_load(path.read_text())
    secret_file = cluster.settings.home / "secrets" / "cluster-secret"
    assert "cluster_secret" not in config and secret_file.read_text().strip() not in path.read_text()
    assert config["taskmanager_key"] and config["taskmanager_command_key"]
    # ACL SAVE put it in the server's ACL file: what a restarted redis-server (and the next
    # `headrace up`) reads.
    acl_file = cluster.settings.home / "redis" / "users.acl"
    assert "user taskmanager.tm-3 " in acl_file.read_text()
    admin.execute_command("ACL", "LOAD")
    assert admin.acl_getuser("taskmanager.tm-3") is not None

    env = {k: v for k, v in os.environ.items() if not k.startswith("HEADRACE_")} | {
        "HEADRACE_CONFIG": str(path),
        "HEADRACE_TASKMANAGER_METRICS_PORT": "0",
    }
    with open(tmp_path / "tm-3.log", "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "services.cli", "taskmanager", "--id", "tm-3", "--slots", "1"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_for("tm-3 registered", lambda: _state(rest, "tm-3") == "REGISTERED", timeout_s=60)
        with redis.Redis.from_url(config["redis_url"]) as tm3:
            with pytest.raises(NOPERM):
                tm3.rpop("tm.tm-1")

        revoked = credentials(cluster, "tm-3", "--revoke")
        assert revoked.returncode == 0 and "revoked taskmanager.tm-3" in revoked.stdout, revoked.stderr
        assert admin.acl_getuser("taskmanager.tm-3") is None
        assert "taskmanager.tm-3" not in acl_file.read_text()
        # Its connections were closed, and it cannot log in again.
        wait_for(
            "tm-3's connections closed",
            lambda: not [c for c in admin.client_list() if c.get("user") == "taskmanager.tm-3"],
            timeout_s=10,
        )
        with pytest.raises(redis.AuthenticationError):
            redis.Redis.from_url(config["redis_url"]).ping()
        wait_for("tm-3 no longer registered", lambda: _state(rest, "tm-3") != "REGISTERED", timeout_s=30)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(10)


def _state(rest, tm: str) -> str | None:
    r = rest.http.get(f"/taskmanagers/{tm}")
    return r.json().get("state") if r.status_code == 200 else None


def test_on_a_redis_without_an_acl_file_the_user_works_and_the_operator_is_warned(redis_server, tmp_path):
    from shared import cluster_keys

    secret = cluster_keys.new_secret()
    env = {k: v for k, v in os.environ.items() if not k.startswith("HEADRACE_")} | {
        "HEADRACE_REDIS_URL": redis_server.url,
        "HEADRACE_CLUSTER_SECRET": secret,
        "HEADRACE_HOME": str(tmp_path),
    }
    path = tmp_path / "tm-5.yaml"
    out = subprocess.run(
        [sys.executable, "-m", "services.cli", "credentials", "taskmanager", "tm-5", "--out", str(path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert "warning: this Redis has no ACL file: the change lasts until this Redis restarts" in out.stderr
    assert secret not in path.read_text()
    with redis.Redis.from_url(yaml.safe_load(path.read_text())["redis_url"]) as tm5:
        assert tm5.acl_whoami() == "taskmanager.tm-5"
        tm5.lpush("tm.tm-5", b"its own queue")
        with pytest.raises(NOPERM):
            tm5.lpush("tm.tm-1", b"another's")
