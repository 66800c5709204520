"""`headrace up --redis-port P --zookeeper-port Q --metrics-port-base B`: the ports it would
otherwise choose free, fixed (firewalls, shared hosts). Which member gets which metrics port, and
the refusals before anything starts: a pinned port that is taken, asked for twice, or pins a
server that this cluster does not start. tests/integration/test_up_pinned_ports.py starts one."""

from __future__ import annotations

import socket

import pytest

from services.cluster.infrastructure import ClusterError, check_pinned_ports
from services.cluster.local_cluster import LocalCluster
from shared.settings import Settings


def cluster(tmp_path, **kw) -> LocalCluster:
    settings = Settings(home=tmp_path, **kw.pop("settings", {}))
    return LocalCluster(settings, **kw)


def test_metrics_ports_follow_the_base_in_start_order(tmp_path):
    c = cluster(
        tmp_path,
        taskmanagers=2,
        jobmanagers=2,
        ha=True,
        redis_port=16379,
        zookeeper_port=12181,
        metrics_port_base=19250,
    )
    assert c.pinned_ports() == {
        "redis (--redis-port)": 16379,
        "zookeeper (--zookeeper-port)": 12181,
        "resourcemanager's metrics (--metrics-port-base)": 19250,
        "jobmanager's metrics (--metrics-port-base)": 19251,
        "jobmanager-2's metrics (--metrics-port-base)": 19252,
        "taskmanager-1's metrics (--metrics-port-base)": 19253,
        "taskmanager-2's metrics (--metrics-port-base)": 19254,
    }
    env = c._metrics_env("taskmanager-2", {})
    assert env == {"HEADRACE_TASKMANAGER_METRICS_PORT": "19254"}
    assert c.metrics_urls["taskmanager-2"] == "http://127.0.0.1:19254/metrics"


def test_metrics_turned_off_take_no_port(tmp_path):
    c = cluster(tmp_path, taskmanagers=1, metrics_port_base=19250, settings={"jobmanager_metrics_port": -1})
    assert set(c.pinned_ports().values()) == {19250, 19251}  # the ResourceManager, then tm-1
    assert c._metrics_env("jobmanager", {}) == {}


def test_nothing_pinned_pins_nothing(tmp_path):
    assert cluster(tmp_path).pinned_ports() == {}


def test_a_pinned_server_the_cluster_does_not_start_is_refused(tmp_path):
    with pytest.raises(ClusterError, match="HEADRACE_REDIS_URL"):
        cluster(tmp_path, redis_port=16379, settings={"redis_url": "redis://127.0.0.1:6379/0"}).pinned_ports()
    with pytest.raises(ClusterError, match="--ha"):
        cluster(tmp_path, zookeeper_port=12181).pinned_ports()


def test_a_taken_or_twice_asked_port_is_refused_before_anything_starts():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ClusterError, match=f"port {port} for redis .* is taken"):
            check_pinned_ports({"redis (--redis-port)": port})
    with pytest.raises(ClusterError, match="asked for twice"):
        check_pinned_ports({"redis (--redis-port)": 16379, "zookeeper (--zookeeper-port)": 16379})
