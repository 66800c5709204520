"""The real servers the suite's fixtures start (tests/conftest.py) and that modules starting their
own import: a throwaway redis-server, PostgreSQL database, ZooKeeper or Kafka broker, and `missing`,
which skips a test whose server is absent (fails it under CI, CI=true: a missing install step can
never pass silently)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import uuid
from pathlib import Path

import pytest

from shared.ports import free_port

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
PG_ADMIN_URL = os.environ.get("HEADRACE_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")


def redis_pings(url: str) -> bool:
    """Whether a redis-server answers at `url` (within a second) yet: for wait_for."""
    import redis

    try:
        with redis.Redis.from_url(url, socket_timeout=1) as client:
            return bool(client.ping())
    except redis.RedisError:
        return False


def missing(what: str) -> None:
    if IN_CI:
        pytest.fail(f"{what} is required in CI")
    pytest.skip(f"{what} not available")


class RedisServer:
    def __init__(self, tmp: Path):
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(tmp),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        from shared.transport.redis_streams import wait_for_redis

        wait_for_redis(self.url, timeout_s=10).close()

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


@contextlib.contextmanager
def fresh_pg_database(template: str | None = None):
    """A fresh PostgreSQL database (a copy of `template`, if given), dropped afterwards."""
    try:
        import psycopg

        admin = psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=3)
    except Exception:  # noqa: BLE001 - whatever keeps the server from answering, it is missing
        missing("PostgreSQL")
    name = f"headrace_test_{uuid.uuid4().hex[:10]}"
    admin.execute(f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}"' if template else ""))
    base = PG_ADMIN_URL.rsplit("/", 1)[0]
    try:
        yield f"{base}/{name}"
    finally:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


class ZooKeeperServer:
    """A throwaway standalone ZooKeeper (Debian's package) on a free port."""

    def __init__(self, tmp: Path):
        from services.cluster.infrastructure import zookeeper_command

        self.port = free_port()
        self.quorum = f"127.0.0.1:{self.port}"
        self.log = tmp / "zookeeper.log"
        self._cmd = zookeeper_command(tmp, self.port)
        self.start()

    def start(self) -> None:
        from kazoo.client import KazooClient

        with open(self.log, "ab") as f:
            self.proc = subprocess.Popen(self._cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        zk = KazooClient(hosts=self.quorum)
        try:
            zk.start(timeout=30)
        finally:
            zk.stop()
            zk.close()

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, 15)
            self.proc.wait(20)


class KafkaServer:
    """A throwaway single-node Kafka broker (KRaft) on free ports, from the bootstrap's jars."""

    def __init__(self, tmp: Path):
        from services.cluster import kafka_broker
        from shared.jars import DEFAULT_CACHE_DIR, JarCache

        spec = kafka_broker.BrokerSpec(
            data_dir=tmp / "kafka", port=free_port(), controller_port=free_port(), heap="384m"
        )
        self.broker = kafka_broker.Broker(spec, JarCache(DEFAULT_CACHE_DIR), tmp / "kafka.log")
        self.bootstrap = spec.bootstrap

    def start(self) -> "KafkaServer":
        self.broker.start()
        return self

    def create_topic(self, name: str, partitions: int = 1) -> str:
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": self.bootstrap})  # kept: its futures die with it
        futures = admin.create_topics(
            [NewTopic(name, num_partitions=partitions, replication_factor=1)], operation_timeout=30
        )
        for future in futures.values():
            future.result(60)
        return name
