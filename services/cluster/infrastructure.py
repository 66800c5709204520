"""What a local cluster runs beside its services: its own redis-server, a ZooKeeper server for
`--ha`, a Spark standalone master and workers for `--spark-workers`, a Kafka broker for `--kafka`.

Each `start_*` starts its processes through the cluster's `spawn` (so they are the cluster's
children: in their own process groups, logged under the run directory, restarted by the
supervisor, stopped by LocalCluster.stop) and returns once they answer, or raises ClusterError
naming the log to read. None of them knows the cluster itself: the seam is `spawn` and what each
returns (addresses and URLs for the services' configuration).
"""

from __future__ import annotations

import os
import shutil
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

import redis

from services.cluster import kafka_broker, redis_auth, spark_standalone, taskmanager_credentials
from shared import errors
from shared.jars import KAFKA_BROKER, JarCache, MissingJars
from shared.message_auth import load_secret
from shared.ports import free_port
from shared.settings import Settings
from shared.transport.redis_streams import wait_for_redis

if TYPE_CHECKING:
    from services.cluster.child_processes import Child

# Starts one supervised child of the cluster: (name, command, environment) -> the child.
Spawn = Callable[[str, list[str], dict], "Child"]


class ClusterError(errors.ClusterError, RuntimeError):
    pass


REDIS_START_TIMEOUT_S = 10
ZOOKEEPER_START_TIMEOUT_S = 30  # its JVM takes a few seconds to listen
# The master, then its workers, each within this: a Spark JVM starts in 5-10 s on a quiet machine
# and took over 90 s in a loaded CI run.
SPARK_START_TIMEOUT_S = 180
ZOOKEEPER_HOME = Path(os.environ.get("HEADRACE_ZOOKEEPER_HOME", "/usr/share/zookeeper"))


def redis_command(data_dir: Path, port: int, aclfile: Path | None, bind: tuple[str, ...] = ("127.0.0.1",)) -> list[str]:
    """redis-server for the control plane: AOF with an fsync every second (a crash loses at
    most the last second), no RDB snapshots, no idle timeout (each TaskManager keeps an idle
    named liveness connection), noeviction (an evicted stream would lose messages silently)."""
    cmd = [
        "redis-server",
        "--port",
        str(port),
        "--bind",
        " ".join(bind),
        "--dir",
        str(data_dir),
        "--save",
        "",
        "--appendonly",
        "yes",
        "--appendfsync",
        "everysec",
        "--timeout",
        "0",
        "--maxmemory-policy",
        "noeviction",
    ]
    return cmd + (["--aclfile", str(aclfile)] if aclfile else [])


def zookeeper_command(data_dir: Path, port: int, bind: str = "127.0.0.1") -> list[str]:
    """A standalone ZooKeeper server from Debian's `zookeeper` package on 127.0.0.1:port, with
    its data under data_dir. Sessions may be as short as 1 s (tests use short ones)."""
    script = ZOOKEEPER_HOME / "bin" / "zkServer.sh"
    if not script.exists():
        raise ClusterError(
            f"ZooKeeper is not installed ({script} missing; Debian: apt-get install zookeeper), "
            "or set HEADRACE_ZOOKEEPER_HOME, or configure zookeeper_quorum"
        )
    (data_dir / "data").mkdir(parents=True, exist_ok=True)
    cfg = data_dir / "zoo.cfg"
    cfg.write_text(
        "\n".join(
            [
                "tickTime=500",
                f"dataDir={data_dir / 'data'}",
                f"clientPort={port}",
                f"clientPortAddress={bind}",
                "admin.enableServer=false",
                "minSessionTimeout=1000",
                "maxSessionTimeout=60000",
                "",
            ]
        )
    )
    return [str(script), "start-foreground", str(cfg)]


@dataclass(frozen=True)
class RedisUrls:
    """The private redis-server's URLs: the admin's, and one per ACL user (each service role,
    the pipelines' user, each TaskManager by its id)."""

    admin: str
    by_user: dict[str, str] = field(default_factory=dict, repr=False)


def start_redis(
    settings: Settings,
    spawn: Spawn,
    env: dict,
    *,
    taskmanager_ids: Sequence[str],
    bind: tuple[str, ...],
    port: int | None = None,
) -> RedisUrls:
    """A redis-server on `port` (None: a free one) with its data (AOF) in $HEADRACE_HOME/redis;
    unless `redis_auth` is off, with a password and an ACL user per service and TaskManager."""
    if not shutil.which("redis-server"):
        raise ClusterError(
            "redis-server is not installed (Debian: apt-get install redis-server), "
            "or set HEADRACE_REDIS_URL to a running Redis"
        )
    data_dir = settings.home / "redis"
    data_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(data_dir, 0o700)
    port = port or free_port()
    base = f"redis://127.0.0.1:{port}/0"
    aclfile = None
    if settings.redis_auth:
        passwords = redis_auth.load_or_create_passwords(data_dir)
        aclfile = data_dir / "users.acl"
        # TaskManagers added by `headrace credentials` (saved in the file) keep their users.
        tms = taskmanager_credentials.passwords(
            load_secret(settings, create=True),
            dict.fromkeys([*taskmanager_ids, *taskmanager_credentials.ids_in_acl_file(aclfile)]),
        )
        redis_auth.write_private(aclfile, redis_auth.acl_file(passwords, tms))
        users = {u: redis_auth.url_for(base, u, passwords[u]) for u in (*redis_auth.SERVICES, redis_auth.PIPELINE)}
        users |= {tm: redis_auth.url_for(base, redis_auth.taskmanager_user(tm), pw) for tm, pw in tms.items()}
        urls = RedisUrls(admin=redis_auth.url_for(base, redis_auth.ADMIN, passwords[redis_auth.ADMIN]), by_user=users)
    else:
        urls = RedisUrls(admin=base, by_user=dict.fromkeys(redis_auth.SERVICES, base))
    child = spawn("redis", redis_command(data_dir, port, aclfile, bind), env)
    try:
        wait_for_redis(urls.admin, timeout_s=REDIS_START_TIMEOUT_S).close()
    except redis.ConnectionError:
        raise ClusterError(f"redis-server did not start; see {child.log}") from None
    return urls


def start_zookeeper(spawn: Spawn, env: dict, data_dir: Path, bind: str, port: int | None = None) -> str:
    """A standalone ZooKeeper server on `port` (None: a free one); its quorum string (host:port)."""
    port = port or free_port()
    child = spawn("zookeeper", zookeeper_command(data_dir, port, bind), env)
    deadline = time.monotonic() + ZOOKEEPER_START_TIMEOUT_S
    while time.monotonic() < deadline:
        if child.proc.poll() is not None:
            break
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return f"127.0.0.1:{port}"
        time.sleep(0.2)
    raise ClusterError(f"ZooKeeper did not start; see {child.log}")


def start_spark(
    spawn: Spawn, env: dict, run_dir: Path, *, workers: int, worker_cores: int, worker_memory: str
) -> spark_standalone.MasterAddress:
    """A Spark standalone master and `workers` workers on loopback, registered with it."""
    host = "127.0.0.1"
    master = spark_standalone.MasterAddress(host, free_port(), free_port())
    spark_dir = run_dir / "spark"
    started = [
        spawn(
            "spark-master",
            spark_standalone.master_command(master),
            spark_standalone.environment(env, host=host, log_dir=spark_dir / "master"),
        )
    ]
    # Workers start once the master answers: a worker that finds no master retries at 5-15 s
    # intervals six times, then once a minute, so on a loaded machine a worker started beside a
    # slow master could register minutes late.
    _wait_spark(master, 0, started, run_dir)
    for i in range(workers):
        work = spark_dir / f"worker-{i + 1}"
        work.mkdir(parents=True, exist_ok=True)
        started.append(
            spawn(
                f"spark-worker-{i + 1}",
                spark_standalone.worker_command(
                    master, host=host, cores=worker_cores, memory=worker_memory, webui_port=free_port(), work_dir=work
                ),
                spark_standalone.environment(env, host=host, log_dir=work, work_dir=work),
            )
        )
    _wait_spark(master, workers, started, run_dir)
    return master


def _wait_spark(master: spark_standalone.MasterAddress, workers: int, started: Sequence[Child], run_dir: Path) -> None:
    """The master answers and `workers` workers registered, while every process started lives."""

    def alive() -> bool:
        return all(c.proc.poll() is None for c in started)

    try:
        spark_standalone.wait_until_ready(master, workers, timeout_s=SPARK_START_TIMEOUT_S, alive=alive)
    except spark_standalone.SparkClusterError as exc:
        raise ClusterError(f"{exc}; see {run_dir / 'spark'} and {run_dir}/logs/spark-*.log") from None


def kafka_spec(settings: Settings) -> kafka_broker.BrokerSpec:
    """The broker of `headrace up --kafka`: its data in $HEADRACE_HOME/kafka, kept from one run to
    the next as Redis's is (a new controller port each run is fine: a single node votes for itself)."""
    return kafka_broker.BrokerSpec(
        data_dir=settings.home / "kafka",
        port=settings.kafka_port,
        controller_port=settings.kafka_controller_port or free_port(),
    )


def check_kafka(settings: Settings, spec: kafka_broker.BrokerSpec) -> None:
    """Before anything starts: the broker's jars are in the cache and its ports are free (a broker
    already listening there would answer in its place)."""
    try:
        JarCache(settings.jar_cache_dir).jars(KAFKA_BROKER)
    except MissingJars as exc:
        raise ClusterError(str(exc)) from None
    for port, setting in ((spec.port, "kafka_port"), (spec.controller_port, "kafka_controller_port")):
        if port_taken(spec.host, port):
            raise ClusterError(
                f"the Kafka broker's port {port} ({setting}) is taken on {spec.host}: another broker "
                f"or process listens there (ss -ltnp 'sport = :{port}'); stop it or set "
                f"HEADRACE_{setting.upper()} to a free port"
            )


def start_kafka(settings: Settings, spec: kafka_broker.BrokerSpec, spawn: Spawn, env: dict) -> Child:
    """Format the broker's storage on its first start, then start it (wait_kafka waits for it)."""
    jars = JarCache(settings.jar_cache_dir)
    try:
        kafka_broker.prepare(spec, jars)
        cmd = kafka_broker.command(spec, jars)
    except (kafka_broker.KafkaBrokerError, MissingJars) as exc:
        raise ClusterError(str(exc)) from None
    return spawn("kafka", cmd, kafka_broker.environment(spec, env))


def wait_kafka(spec: kafka_broker.BrokerSpec, child: Child) -> None:
    """Until the broker serves metadata; ClusterError naming its log if it exits or is late."""
    try:
        kafka_broker.wait_until_ready(spec, alive=lambda: child.proc.poll() is None, log=child.log)
    except kafka_broker.KafkaBrokerError as exc:
        raise ClusterError(str(exc)) from None


def check_pinned_ports(ports: dict[str, int], host: str = "127.0.0.1") -> None:
    """Before anything starts: every port the caller fixed (`what` -> port) is free, and no two
    are the same; one line naming the first that is not."""
    seen: dict[int, str] = {}
    for what, port in ports.items():
        if port in seen:
            raise ClusterError(f"port {port} is asked for twice: {seen[port]} and {what}")
        seen[port] = what
        if port_taken(host, port):
            raise ClusterError(
                f"port {port} for {what} is taken on {host}: another process listens there "
                f"(ss -ltnp 'sport = :{port}'); stop it or choose another port"
            )


def port_taken(host: str, port: int) -> bool:
    """Whether something listens on host:port (a port some closed connection still holds in
    TIME_WAIT is free: the broker reuses it as this probe does)."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return True
    return False
