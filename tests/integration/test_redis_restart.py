"""The control-plane Redis that `headrace up` starts: persistent (AOF) across a restart, and
closed to anyone without a password (one ACL user per service)."""

from __future__ import annotations

import json
import stat
import time
from urllib.parse import urlsplit

import pytest
import redis
import yaml

from services.cluster import redis_auth
from shared import streams
from tests.clusters import start_cluster
from tests.waiting import wait_for

TASKMANAGERS = 2
# Waits across the restart poll every 0.2 s, and a Redis that is still down means "not yet".
ACROSS_RESTART = {"poll_s": 0.2, "ignoring": (redis.RedisError,)}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, pg_url_module):
    c = start_cluster(
        tmp_path_factory.mktemp("redis-restart-home"), catalog_url=pg_url_module, taskmanagers=TASKMANAGERS, slots=2
    )
    c.supervise()
    yield c
    c.stop()


def noop(rest, jar, duration):
    return rest.run(
        jar,
        kind="noop",
        parallelism=1,
        restartStrategy={"type": "fixed-delay", "attempts": 3, "delay": "200 ms"},
        config={"noop.duration": duration},
    )


def groups(client, stream: str) -> dict[str, bytes]:
    return {g["name"].decode(): g["last-delivered-id"] for g in client.xinfo_groups(stream)}


def entry_id(raw: bytes) -> tuple[int, int]:
    ms, seq = raw.decode().split("-")
    return int(ms), int(seq)


def restart_redis(cluster) -> redis.Redis:
    """SHUTDOWN, as an operator or a crash would end it; the supervisor starts the same server
    (same port, same AOF directory) again."""
    old = cluster.child("redis").proc.pid
    with redis.Redis.from_url(cluster.redis_url) as admin:
        try:
            admin.shutdown()
        except redis.ConnectionError:
            pass
    wait_for(
        "the old redis-server to exit",
        lambda: cluster.child("redis").proc.pid != old or cluster.child("redis").proc.poll() is not None,
        timeout_s=10,
        **ACROSS_RESTART,
    )
    client = redis.Redis.from_url(cluster.redis_url)
    wait_for(
        "redis-server restarted by the supervisor",
        lambda: cluster.child("redis").proc.pid != old and client.ping(),
        timeout_s=20,
        **ACROSS_RESTART,
    )
    return client


def test_a_redis_restart_loses_no_stream_group_pending_entry_dead_letter_or_job(cluster, rest, jar):
    admin = redis.Redis.from_url(cluster.redis_url)
    job = noop(rest, jar, duration=-1)
    before = rest.wait_attempt_running(job, 0)
    # A dead letter (the JobManager cannot decode this entry), and an operator's consumer group
    # on the dead letters holding it unacknowledged.
    admin.xadd(streams.JM_STREAM, {"m": b"not an envelope"})
    wait_for("the bad entry dead-lettered", lambda: admin.xlen(streams.DLQ_STREAM) >= 1, **ACROSS_RESTART)
    admin.xgroup_create(streams.DLQ_STREAM, "operators", id="0")
    admin.xreadgroup("operators", "me", {streams.DLQ_STREAM: ">"}, count=1)
    kept = {
        stream: groups(admin, stream) for stream in (streams.JM_STREAM, streams.RM_STREAM, streams.RM_HEARTBEAT_STREAM)
    }
    dead_letters = admin.xlen(streams.DLQ_STREAM)
    epoch = admin.get(streams.JM_EPOCH_KEY)
    time.sleep(1.2)  # AOF fsyncs every second: what is older than that must come back

    admin = restart_redis(cluster)

    for stream, before_groups in kept.items():
        after = groups(admin, stream)
        assert set(after) == set(before_groups), f"consumer groups of {stream} lost: {after}"
        for name, last in before_groups.items():
            assert entry_id(after[name]) >= entry_id(last), f"{stream}/{name} went back"
    assert admin.xlen(streams.DLQ_STREAM) >= dead_letters
    assert admin.xpending(streams.DLQ_STREAM, "operators")["pending"] == 1
    assert admin.get(streams.JM_EPOCH_KEY) == epoch

    # Every TaskManager reconnects and registers again.
    wait_for(
        f"{TASKMANAGERS} TaskManager liveness connections",
        lambda: (
            sum(1 for c in admin.client_list(_type="normal") if c.get("name", "").startswith("hr-tm-")) == TASKMANAGERS
        ),
        **ACROSS_RESTART,
    )
    wait_for(
        "both TaskManagers registered",
        lambda: all(rest.get(f"/taskmanagers/tm-{i + 1}")["state"] == "REGISTERED" for i in range(TASKMANAGERS)),
        **ACROSS_RESTART,
    )
    # The job's first attempt runs on: a restart drops every connection at once, which is no
    # TaskManager's death (services/resourcemanager/liveness.py), and the heartbeats resume
    # well within their timeout.
    attempts = rest.wait_attempt_running(job, 0, timeout_s=30)
    assert [a["execution-id"] for a in attempts] == [before[0]["execution-id"]], attempts
    assert rest.job(job)["state"] == "RUNNING"
    # And the control plane works: a job submitted now runs to its end.
    after = noop(rest, jar, duration=0.3)
    assert rest.wait_state(after, ("FINISHED", "FAILED", "CANCELED"), timeout_s=40)["state"] == "FINISHED"
    rest.cancel(job)
    assert rest.wait_state(job, "CANCELED", timeout_s=20)["state"] == "CANCELED"
    assert cluster.supervisor.view()["redis"]["restarts"] == 1


def test_without_the_password_nobody_writes_to_the_streams(cluster):
    url = urlsplit(cluster.redis_url)
    with redis.Redis(host=url.hostname, port=url.port) as anonymous:
        with pytest.raises(redis.AuthenticationError):
            anonymous.xadd(streams.JM_STREAM, {"m": b"{}"})
        with pytest.raises(redis.AuthenticationError):
            anonymous.lpush("tm.tm-1", b"garbage")
    with redis.Redis(host=url.hostname, port=url.port, username="taskmanager.tm-1", password="guess") as guessing:
        with pytest.raises(redis.AuthenticationError):
            guessing.ping()


def test_each_service_connects_as_its_own_user_with_only_what_it_needs(cluster):
    urls = {}
    for role in redis_auth.SERVICES:
        config = cluster.run_dir / f"{role}.yaml"
        assert stat.S_IMODE(config.stat().st_mode) == 0o600
        urls[role] = yaml.safe_load(config.read_text())["redis_url"]
        assert urlsplit(urls[role]).username == role
    for i in range(TASKMANAGERS):  # one user per TaskManager (tests/integration/test_redis_acl_taskmanagers.py)
        config = cluster.run_dir / f"tm-{i + 1}.yaml"
        assert stat.S_IMODE(config.stat().st_mode) == 0o600
        urls[f"tm-{i + 1}"] = yaml.safe_load(config.read_text())["redis_url"]
        assert urlsplit(urls[f"tm-{i + 1}"]).username == f"taskmanager.tm-{i + 1}"
    urls["pipeline"] = yaml.safe_load((cluster.run_dir / "jobmanager.yaml").read_text())["pipeline_redis_url"]
    with redis.Redis.from_url(urls["dispatcher"]) as dispatcher:
        dispatcher.xadd("hr:stream:jm", {"probe": 1}, maxlen=100_000, approximate=True)
        assert dispatcher.get(streams.JM_LEADER_KEY) is not None  # it reads what it shows
        with pytest.raises(redis.exceptions.NoPermissionError):
            dispatcher.xadd(streams.RM_STREAM, {"m": b"{}"})
        with pytest.raises(redis.exceptions.NoPermissionError):
            dispatcher.lpush("tm.tm-1", b"garbage")
    with redis.Redis.from_url(urls["tm-1"]) as tm:
        with pytest.raises(redis.exceptions.NoPermissionError):
            tm.set(streams.JM_EPOCH_KEY, 10**12)  # forging a leader epoch
        with pytest.raises(redis.exceptions.NoPermissionError):
            tm.flushall()
    with redis.Redis.from_url(urls["pipeline"]) as pipeline:
        pipeline.xadd("clicks", {"url": "/"})  # a pipeline's own streams
        # The sinks' bookkeeping is each lineage's own user's (tests/integration/test_pipeline_redis_isolation.py).
        with pytest.raises(redis.exceptions.NoPermissionError):
            pipeline.set("headrace:sink:job-1:out:last_batch", 3)
        for key in (streams.JM_STREAM, "tm.tm-1", "_kombu.binding.tm.tm-1", "unacked"):
            with pytest.raises(redis.exceptions.NoPermissionError):
                pipeline.xadd(key, {"m": b"{}"})


def test_no_password_is_printed_or_readable_by_others(cluster):
    home = cluster.settings.home
    passwords = json.loads((home / "redis" / "credentials.json").read_text())
    assert set(passwords) == set(redis_auth.USERS)
    tm_configs = [yaml.safe_load((cluster.run_dir / f"tm-{i + 1}.yaml").read_text()) for i in range(TASKMANAGERS)]
    for i, config in enumerate(tm_configs):
        passwords[f"tm-{i + 1}"] = urlsplit(config["redis_url"]).password
        passwords[f"tm-{i + 1} key"] = config["taskmanager_key"]
        passwords[f"tm-{i + 1} command key"] = config["taskmanager_command_key"]
    for private in (
        home / "redis" / "credentials.json",
        home / "redis" / "users.acl",
        cluster.run_dir / "config.yaml",
        cluster.run_dir / "cluster.json",
        *(cluster.run_dir / f"tm-{i + 1}.yaml" for i in range(TASKMANAGERS)),
    ):
        assert stat.S_IMODE(private.stat().st_mode) == 0o600, private
    assert stat.S_IMODE((home / "redis").stat().st_mode) == 0o700
    shown = [(cluster.run_dir / "cluster.json").read_text(), (home / "redis" / "users.acl").read_text()]
    shown += [log.read_text(errors="replace") for log in (cluster.run_dir / "logs").glob("*.log")]
    for user, password in passwords.items():
        assert not any(password in text for text in shown), f"the password of {user} was printed"
    assert json.loads(shown[0])["redis"].endswith(f"default:****@127.0.0.1:{urlsplit(cluster.redis_url).port}/0")
