"""The compose stack (deploy/docker-compose.yml), checked as far as a machine without a Docker
engine allows: the `docker-compose` tool (Debian's, 1.29) validates and normalises it, and every
process it runs is one that `headrace up --ha --spark-workers 2 --kafka` also runs, so the two
topologies cannot drift apart. Also: a healthcheck on every service, Redis with AOF, one checkpoint
volume shared by every TaskManager and Spark worker at the path the settings name, the Kafka broker's
data on a volume and its address given to every Headrace service."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections import Counter
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

from services.cluster import redis_auth
from services.cluster.compose_credentials import SECRET_VARIABLE, compose_files
from services.cluster.local_cluster import LocalCluster
from shared import cluster_keys
from shared.settings import Settings

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
# In the stack but not started by `headrace up`, and why: Prometheus and Flower are tools pointed at
# a cluster (docs/runbooks/metrics.md, README: celery flower), not part of it. (`headrace up --ha`
# runs a PostgreSQL catalog as the stack does, unless HEADRACE_CATALOG_URL names one.)
NOT_IN_LOCAL_TOPOLOGY = {"prometheus", "flower"}
IMAGE_ROLES = {
    "redis": "redis",
    "zookeeper": "zookeeper",
    "postgres": "postgres",
    "prom/prometheus": "prometheus",
    "mher/flower": "flower",
    "apache/kafka": "kafka",
}


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> dict:
    tool = shutil.which("docker-compose")
    if tool is None:
        pytest.skip(
            "docker-compose is not installed (Debian: apt-get install docker-compose; scripts/bootstrap installs it)"
        )
    work = tmp_path_factory.mktemp("compose") / "deploy"
    shutil.copytree(DEPLOY, work, ignore=shutil.ignore_patterns(".env", "secrets"))
    # What `headrace redis-auth deploy` writes: passwords, the cluster secret, each TaskManager's keys.
    compose_files(work)
    out = subprocess.run(
        [tool, "-f", str(work / "docker-compose.yml"), "config"], capture_output=True, text=True, cwd=work, timeout=60
    )
    assert out.returncode == 0, out.stderr
    stack = yaml.safe_load(out.stdout)
    stack["x-deploy-dir"] = work
    return stack


def role(name: str, service: dict) -> str:
    image = service.get("image", "")
    if image.startswith("headrace"):
        return service["command"][0]
    return IMAGE_ROLES[image.split(":")[0]]


def test_every_process_of_the_stack_is_one_headrace_up_runs(stack):
    services = stack["services"]
    compose = Counter(role(n, s) for n, s in services.items())
    local = LocalCluster(
        Settings(), taskmanagers=2, jobmanagers=2, ha=True, spark_workers=2, kafka=True
    ).planned_children()
    local_roles = Counter(re.sub(r"-\d+$", "", n) for n in local)
    assert compose - Counter(NOT_IN_LOCAL_TOPOLOGY) == local_roles, (
        f"compose runs {dict(compose)}, headrace up --ha --spark-workers 2 --kafka runs {dict(local_roles)}; "
        f"add the process to both, or to NOT_IN_LOCAL_TOPOLOGY with the reason"
    )
    assert set(compose) >= NOT_IN_LOCAL_TOPOLOGY


def test_healthchecks_aof_and_one_shared_checkpoint_volume(stack):
    services = stack["services"]
    assert [n for n, s in services.items() if "healthcheck" not in s] == []
    assert "--appendonly" in services["redis"]["command"] and "yes" in services["redis"]["command"]
    needs_checkpoints = [
        n
        for n, s in services.items()
        if s.get("image", "").startswith("headrace") and role(n, s) in ("taskmanager", "spark-worker")
    ]
    assert len(needs_checkpoints) == 4
    for name in needs_checkpoints:
        s = services[name]
        path = s["environment"]["HEADRACE_CHECKPOINT_DIR"]
        mounts = {(v["source"], v["target"]) for v in s["volumes"] if isinstance(v, dict)} | {
            tuple(v.split(":")[:2]) for v in s["volumes"] if isinstance(v, str)
        }
        assert ("checkpoints", path) in mounts, f"{name} does not mount the checkpoints volume at {path}: {mounts}"
        if role(name, s) == "taskmanager":
            assert s["environment"]["HEADRACE_SPARK_MASTER"] == "spark://spark-master:7077"
            assert s["environment"]["HEADRACE_ADVERTISED_HOST"] == s["hostname"]
    assert "checkpoints" in stack["volumes"]


def test_each_taskmanager_gets_only_its_own_credentials_and_the_control_plane_the_secret(stack):
    services = stack["services"]
    env = dict(line.split("=", 1) for line in (stack["x-deploy-dir"] / ".env").read_text().splitlines() if "=" in line)
    secret = cluster_keys.parse_secret(env[SECRET_VARIABLE])
    acl = (stack["x-deploy-dir"] / "secrets" / "redis-users.acl").read_text()
    assert "user taskmanager " not in acl  # no shared TaskManager user any more
    taskmanagers = [
        s for s in services.values() if s.get("image", "").startswith("headrace") and s["command"][0] == "taskmanager"
    ]
    assert len(taskmanagers) == 2
    for s in taskmanagers:
        tm = s["command"][s["command"].index("--id") + 1]
        e = s["environment"]
        assert SECRET_VARIABLE not in e, f"{tm} must not hold the cluster secret"
        url = urlsplit(e["HEADRACE_REDIS_URL"])
        assert url.username == redis_auth.taskmanager_user(tm)
        assert url.password == cluster_keys.redis_password(secret, tm)
        assert e["HEADRACE_TASKMANAGER_KEY"] == cluster_keys.sender_key(secret, tm).hex()
        assert e["HEADRACE_TASKMANAGER_COMMAND_KEY"] == cluster_keys.command_key(secret, tm).hex()
        assert f"user {url.username} on #{redis_auth.password_hash(url.password)} " in acl
        assert url.password not in acl
    for name, s in services.items():
        if s.get("image", "").startswith("headrace") and s["command"][0] in (
            "jobmanager",
            "resourcemanager",
            "dispatcher",
        ):
            assert s["environment"][SECRET_VARIABLE] == env[SECRET_VARIABLE], name
        elif s.get("image", "").startswith("headrace"):
            assert SECRET_VARIABLE not in s["environment"], name
    # Run again: the secret and every password stay (a running stack keeps working).
    before = (stack["x-deploy-dir"] / ".env").read_text()
    compose_files(stack["x-deploy-dir"])
    assert (stack["x-deploy-dir"] / ".env").read_text() == before
    compose_files(stack["x-deploy-dir"], rotate=True)
    rotated = dict(
        line.split("=", 1) for line in (stack["x-deploy-dir"] / ".env").read_text().splitlines() if "=" in line
    )
    assert rotated[SECRET_VARIABLE] != env[SECRET_VARIABLE]
    assert rotated["HEADRACE_TASKMANAGER_KEY_TM_1"] != env["HEADRACE_TASKMANAGER_KEY_TM_1"]


def test_the_kafka_broker_keeps_its_data_on_a_volume_and_every_service_knows_it(stack):
    services = stack["services"]
    kafka = services["kafka"]
    assert "kafka-data" in stack["volumes"]
    targets = {v["target"] if isinstance(v, dict) else v.split(":")[1] for v in kafka["volumes"]}
    assert kafka["environment"]["KAFKA_LOG_DIRS"] in targets, targets
    assert kafka["environment"]["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false"
    advertised = kafka["environment"]["KAFKA_ADVERTISED_LISTENERS"].split("//", 1)[1]
    for name, s in services.items():
        if s.get("image", "").startswith("headrace"):
            assert s["environment"]["HEADRACE_PIPELINE_KAFKA_BOOTSTRAP_SERVERS"] == advertised, name
