"""An Apache Kafka broker in KRaft mode, one node that is its own controller, run from the jars of
the `kafka-broker` set (shared/jar_sets.toml) that scripts/bootstrap fetched from Maven Central:
no tarball, no shell scripts, nothing fetched at run time.

`headrace up --kafka` runs it beside the cluster and supervises it like its other children; the
tests start throwaway ones on free ports. Its storage is formatted once (a cluster id in
`<data>/cluster-id`, the log directory formatted by Kafka's own StorageTool), so a broker started
again on the same directory, after a kill -9 too, keeps its topics, offsets and transactions.

Settings chosen for one node: every internal topic (consumer offsets, transaction state, share
groups) has one replica and a minimum in-sync count of one; a consumer group's first rebalance
does not wait; topics are not created by producing to or subscribing to a name (a misspelt topic
is an error, not a new topic: `headrace kafka create-topic`)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from shared.errors import ClusterError
from shared.jars import KAFKA_BROKER, JarCache

MAIN_CLASS = "kafka.Kafka"
STORAGE_TOOL = "kafka.tools.StorageTool"
FORMAT_TIMEOUT_S = 120.0
# A broker's JVM starts in ~3 s on a quiet machine of 2 cores; a loaded CI run is several times slower.
START_TIMEOUT_S = 120.0


class KafkaBrokerError(ClusterError, RuntimeError):
    """The broker could not be formatted or did not come up; the message says where to look."""


@dataclass(frozen=True)
class BrokerSpec:
    """Where one broker lives and listens."""

    data_dir: Path
    port: int
    controller_port: int
    host: str = "127.0.0.1"  # what it binds
    advertised_host: str = "127.0.0.1"  # what clients are told to connect to
    heap: str = "512m"

    @property
    def bootstrap(self) -> str:
        return f"{self.advertised_host}:{self.port}"

    @property
    def config_file(self) -> Path:
        return self.data_dir / "server.properties"

    @property
    def log_dirs(self) -> Path:
        return self.data_dir / "logs"

    def server_properties(self) -> str:
        lines = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.bootstrap.servers": f"127.0.0.1:{self.controller_port}",
            "listeners": f"PLAINTEXT://{self.host}:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://{self.bootstrap}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "log.dirs": str(self.log_dirs),
            "num.partitions": "1",
            "auto.create.topics.enable": "false",
            "offsets.topic.replication.factor": "1",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
        }
        return "".join(f"{k}={v}\n" for k, v in lines.items())


# Kafka logs through log4j 2; without a configuration it would print errors only. INFO to the
# broker's stdout (its log file under `headrace up`), the chattiest classes at WARN.
LOG4J2 = """\
status = warn
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = info
rootLogger.appenderRef.out.ref = out
logger.controller.name = org.apache.kafka.controller
logger.controller.level = warn
logger.raft.name = org.apache.kafka.raft
logger.raft.level = warn
logger.coordinator.name = kafka.coordinator
logger.coordinator.level = warn
logger.state.name = state.change.logger
logger.state.level = warn
"""


def java() -> str:
    home = os.environ.get("JAVA_HOME")
    found = os.path.join(home, "bin", "java") if home else shutil.which("java")
    if not found or not os.path.exists(found):
        raise KafkaBrokerError(
            "java is not installed (Kafka needs Java 17 or newer: apt-get install openjdk-17-jre-headless)"
        )
    return found


def class_path(jars: JarCache) -> str:
    """The broker's jars (MissingJars, naming scripts/bootstrap, when they were never fetched)."""
    return ":".join(str(j) for j in jars.jars(KAFKA_BROKER))


def new_cluster_id() -> str:
    """16 random bytes in URL-safe base64 without padding, as Kafka's own ids, and like Kafka's
    Uuid.randomUuid() never starting with '-': the storage tool would read it as an option."""
    import base64

    while True:
        made = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not made.startswith("-"):
            return made


def prepare(spec: BrokerSpec, jars: JarCache) -> None:
    """Write the broker's configuration and format its storage unless that was done before."""
    spec.data_dir.mkdir(parents=True, exist_ok=True)
    spec.config_file.write_text(spec.server_properties())
    (spec.data_dir / "log4j2.properties").write_text(LOG4J2)
    if (spec.log_dirs / "meta.properties").is_file():
        return  # formatted by an earlier start: its topics and offsets are kept
    id_file = spec.data_dir / "cluster-id"
    if not id_file.is_file() or id_file.read_text().startswith("-"):
        id_file.write_text(new_cluster_id())
    cmd = [
        java(),
        "-Xmx256m",
        "-cp",
        class_path(jars),
        STORAGE_TOOL,
        "format",
        "--standalone",
        "-t",
        id_file.read_text().strip(),
        "-c",
        str(spec.config_file),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=FORMAT_TIMEOUT_S, env=environment(spec))
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-6:])
        raise KafkaBrokerError(f"formatting the Kafka storage in {spec.log_dirs} failed:\n{tail}")


def command(spec: BrokerSpec, jars: JarCache) -> list[str]:
    """The broker's command line (run prepare() first)."""
    return [
        java(),
        f"-Xmx{spec.heap}",
        f"-Xms{spec.heap}",
        "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={spec.data_dir / 'log4j2.properties'}",
        "-cp",
        class_path(jars),
        MAIN_CLASS,
        str(spec.config_file),
    ]


def environment(spec: BrokerSpec, base: dict[str, str] | None = None) -> dict[str, str]:
    # Kafka's own launcher sets LOG_DIR; a bare `java -cp` must too, or its logs land in the cwd.
    return {**(base if base is not None else os.environ), "LOG_DIR": str(spec.data_dir)}


def answers(spec: BrokerSpec, timeout_s: float = 5.0) -> bool:
    """Whether the broker serves metadata (a listening port alone is not enough: a broker whose
    controller has not elected itself yet refuses every request)."""
    from services.cluster.kafka_topics import admin_client

    with socket.socket() as probe:
        probe.settimeout(1.0)
        if probe.connect_ex((spec.advertised_host, spec.port)) != 0:
            return False
    try:
        md = admin_client(spec.bootstrap).list_topics(timeout=timeout_s)
    except Exception:  # noqa: BLE001 - KafkaException while it starts: not ready yet
        return False
    return bool(md.brokers)


def wait_until_ready(
    spec: BrokerSpec, *, alive: Callable[[], bool], log: Path | None = None, timeout_s: float = START_TIMEOUT_S
) -> None:
    """Return once the broker answers; KafkaBrokerError if it exits or does not within timeout_s."""
    deadline = time.monotonic() + timeout_s
    where = f"; see {log}" if log else ""
    while time.monotonic() < deadline:
        if not alive():
            raise KafkaBrokerError(f"the Kafka broker on port {spec.port} exited while starting{where}")
        if answers(spec, timeout_s=2.0):
            return
        time.sleep(0.3)
    raise KafkaBrokerError(f"the Kafka broker on {spec.bootstrap} did not answer within {timeout_s:.0f} s{where}")


class Broker:
    """A broker this process started and stops (tests, benchmarks): by its PID, never by name."""

    def __init__(self, spec: BrokerSpec, jars: JarCache, log: Path):
        self.spec, self.jars, self.log_path = spec, jars, log
        self.proc: subprocess.Popen | None = None

    @property
    def bootstrap(self) -> str:
        return self.spec.bootstrap

    def start(self, timeout_s: float = START_TIMEOUT_S) -> "Broker":
        prepare(self.spec, self.jars)
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen(
                command(self.spec, self.jars),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=environment(self.spec),
                start_new_session=True,
            )
        proc = self.proc
        wait_until_ready(self.spec, alive=lambda: proc.poll() is None, log=self.log_path, timeout_s=timeout_s)
        return self

    def kill(self) -> None:
        """kill -9, as a crash would."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, 9)
            self.proc.wait(30)

    def stop(self, timeout_s: float = 30.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, 15)
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, 9)
            self.proc.wait(30)
