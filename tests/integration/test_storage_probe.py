"""The checkpoint directory must be one shared filesystem: a TaskManager that sees another
directory under the same path (a host-local disk) refuses to start, naming the TaskManager whose
probe file it cannot see."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml

from services.taskmanager import storage_probe
from services.taskmanager.__main__ import EXIT_STORAGE_NOT_SHARED
from shared import streams
from tests.clusters import start_cluster
from tests.waiting import wait_for


def alive(client, tm: str) -> None:
    client.set(streams.tm_endpoint_key(tm), '{"address": "http://tm:1"}', px=60_000)


def test_the_same_directory_passes_and_a_host_local_one_is_named(redis_server, tmp_path):
    import redis

    client = redis.Redis.from_url(redis_server.url)
    shared, local = tmp_path / "shared", tmp_path / "local-disk-of-host-b"
    assert storage_probe.check_shared(shared, "tm-1", client) == []
    alive(client, "tm-1")
    assert storage_probe.check_shared(shared, "tm-2", client) == ["tm-1"]
    alive(client, "tm-2")
    with pytest.raises(storage_probe.StorageNotShared) as err:
        storage_probe.check_shared(local, "tm-3", client)
    text = str(err.value)
    assert "not shared" in text and "TaskManager tm-1" in text and "is missing here" in text
    assert str(local) in text
    # A stopped TaskManager (no endpoint key) is not held against a newcomer.
    client.delete(streams.tm_endpoint_key("tm-1"), streams.tm_endpoint_key("tm-2"))
    assert storage_probe.check_shared(local, "tm-4", client) == []


def test_a_taskmanager_misstating_its_own_probe_keeps_no_newcomer_from_starting(redis_server, tmp_path, caplog):
    """43.7: tm-1's Redis credential may write tm-1's own probe value; with only tm-1 running, a
    forged value must not make tm-2 refuse the shared directory (it crash-looped with exit 4)."""
    import redis

    client = redis.Redis.from_url(redis_server.url)
    shared = tmp_path / "shared"
    storage_probe.check_shared(shared, "tm-1", client)
    alive(client, "tm-1")
    client.set(streams.tm_storage_probe_key("tm-1"), "forged")  # as tm-1's credential may
    with caplog.at_level("WARNING", logger="headrace.taskmanager"):
        assert storage_probe.check_shared(shared, "tm-2", client) == []
    assert "tm-1" in caplog.text and "holds another value" in caplog.text
    # A directory without tm-1's file is still refused: the forged value proves nothing there.
    with pytest.raises(storage_probe.StorageNotShared, match="is missing here"):
        storage_probe.check_shared(tmp_path / "local-disk-of-host-b", "tm-3", client)


def test_an_unusable_directory_says_so(redis_server, tmp_path):
    import redis

    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with pytest.raises(storage_probe.StorageNotShared, match="is not usable by TaskManager tm-1"):
        storage_probe.check_shared(blocker / "checkpoints", "tm-1", redis.Redis.from_url(redis_server.url))


def test_a_taskmanager_process_with_a_host_local_directory_exits_with_the_reason(tmp_path, pg_url):
    cluster = start_cluster(tmp_path / "home", catalog_url=pg_url, taskmanagers=1, slots=1)
    try:
        path = tmp_path / "tm-2.yaml"
        env = {k: v for k, v in os.environ.items() if not k.startswith("HEADRACE_")}
        # tm-2's own credentials, as an operator adds a TaskManager (docs/runbooks/auth.md).
        made = subprocess.run(
            [sys.executable, "-m", "services.cli", "credentials", "taskmanager", "tm-2", "--out", str(path)],
            env=env | {"HEADRACE_CONFIG": str(cluster.run_dir / "config.yaml")},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert made.returncode == 0, made.stderr
        config = yaml.safe_load(path.read_text())
        config["checkpoint_dir"] = str(tmp_path / "elsewhere")
        config["taskmanager_metrics_port"] = 0
        path.write_text(yaml.safe_dump(config))
        wait_for("tm-1's endpoint", lambda: cluster_redis(cluster).exists(streams.tm_endpoint_key("tm-1")))
        env |= {"HEADRACE_CONFIG": str(path)}
        proc = subprocess.run(
            [sys.executable, "-m", "services.cli", "taskmanager", "--id", "tm-2"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == EXIT_STORAGE_NOT_SHARED, proc.stderr[-2000:]
        assert "is not shared: TaskManager tm-1 wrote its probe" in proc.stderr + proc.stdout
    finally:
        cluster.stop()


def cluster_redis(cluster):
    import redis

    return redis.Redis.from_url(cluster.redis_url)
