"""Outages and random faults under a counting job fed from outside, on a supervised HA cluster.

The cluster: two JobManagers (ZooKeeper mode), a ResourceManager, two TaskManagers with warm
drivers, the dispatcher, its own Redis (AOF, ACL users) and ZooKeeper, all supervised as
`headrace up` does (a killed process is started again). The catalog and the job's sink are a
PostgreSQL database reached through a TCP proxy the test switches off and on: for the cluster
that is PostgreSQL going away. The source is a Redis stream in a separate redis-server that an
outside producer writes numbered events into, at a steady rate, through every fault.

  test_outages: Redis SHUTDOWN and start, ZooKeeper killed and started, PostgreSQL away for
                30 s, one after the other.
  test_chaos:   10 random faults (HEADRACE_CHAOS_FAULTS): kill -9 or SIGSTOP of the leading JobManager, kill -9
                of a TaskManager, the ResourceManager or the dispatcher, restarts of Redis,
                ZooKeeper and PostgreSQL. HEADRACE_CHAOS_FAULTS=N for a longer run.
  test_control_plane_kills_under_load: kill -9 of the leading JobManager, the ResourceManager
                and the dispatcher in turn, with a busy process per core beside the cluster
                (HEADRACE_CHAOS_HOGS=N for more): none may restart the task.

Each ends with the producer stopped and the sink holding exactly the count and sum of every key:
nothing lost, nothing counted twice, whatever restarted in between.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import redis
from kazoo.client import KazooClient
from sqlalchemy.engine import make_url

from services.cluster.process_supervisor import RestartPolicy
from shared.ports import free_port
from tests.clusters import Rest, start_cluster
from tests.e2e.counting import CHECKPOINT_INTERVAL, TRIGGER, Producer, expected_totals, sql_totals
from tests.kafka_support import Feeder
from tests.netproxy import TcpProxy
from tests.servers import missing, redis_pings
from tests.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
FAULTS = int(os.environ.get("HEADRACE_CHAOS_FAULTS", "10"))
SEED = int(os.environ.get("HEADRACE_CHAOS_SEED", str(int(time.time()))))
TASKMANAGER_LOSS_CAUSES = {"TaskManagerLost", "TaskLostException", "DeploymentTimeoutException"}


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """The outside world's Redis, where the producer writes: never faulted."""
    if not shutil.which("redis-server"):
        missing("redis-server")
    port = free_port()
    d = tmp_path_factory.mktemp("source-redis")
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
            str(d),
        ],
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )
    url = f"redis://127.0.0.1:{port}/0"
    wait_for("the source redis-server", lambda: redis_pings(url), 10, poll_s=0.25)
    yield url
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)


@pytest.fixture(scope="module")
def env(tmp_path_factory, pg_url_module, source):
    from services.cluster.infrastructure import ZOOKEEPER_HOME

    if not (ZOOKEEPER_HOME / "bin" / "zkServer.sh").exists():
        missing("ZooKeeper (Debian package zookeeper)")
    pg = make_url(pg_url_module)
    proxy = TcpProxy((pg.host or "127.0.0.1", pg.port or 5432))
    proxy.start()
    proxied = pg.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
    home = tmp_path_factory.mktemp("chaos-home")
    c = start_cluster(
        home,
        catalog_url=proxied,
        taskmanagers=2,
        slots=2,
        warm_drivers=1,
        ha=True,
        jobmanagers=2,
        zookeeper_session_timeout_s=4,
        restart_strategy={"type": "fixed-delay", "attempts": 1000, "delay": "1 s"},
    )
    # As `headrace up` does, with a short backoff: a fault every few seconds must not leave a
    # process down for half a minute.
    c.supervise(policy=RestartPolicy(initial_s=0.5, max_s=2.0, reset_after_s=20.0))
    yield c, proxy, proxied, source, pg_url_module
    c.stop()
    proxy.stop()
    # Killed TaskManagers' drivers end by themselves (runner.py's parent watchdog): none of this
    # cluster's runners, JVMs or Python workers may outlive it.
    left = _processes_under(home)
    deadline = time.monotonic() + 30
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        left = _processes_under(home)
    for pid, _ in left:  # stop them before failing: they would load the rest of the suite
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert not left, f"processes of the chaos cluster left behind: {left}"


def _processes_under(home) -> list[tuple[int, str]]:
    """Living processes whose command line names a path under `home` (drivers' --workdir, their
    JVMs' java.io.tmpdir)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if str(home) in cmd and state != "Z":
            found.append((int(proc.name), cmd[:160]))
    return found


class Chaos:
    def __init__(self, c, proxy: TcpProxy, rest: Rest, rng: random.Random, kafka=None):
        self.c, self.proxy, self.rest, self.rng = c, proxy, rest, rng
        self.kafka = kafka  # a broker the job reads from: killed among the faults too
        self.log: list[str] = []

    def pid(self, name: str) -> int:
        return self.c.child(name).proc.pid

    def leader(self) -> str:
        """The child name of the leading JobManager (from ZooKeeper's leader node)."""

        def find():
            zk = KazooClient(hosts=self.c.zookeeper_quorum)
            try:
                zk.start(timeout=5)
                data, _ = zk.get("/headrace/jobmanager/leader")
                pid = int(json.loads(data)["id"].rsplit(":", 1)[1])
            except Exception:  # noqa: BLE001 - no leader yet, or ZooKeeper restarting
                return None
            finally:
                zk.stop()
                zk.close()
            return next(
                (ch.name for ch in self.c.children if ch.name.startswith("jobmanager") and ch.proc.pid == pid), None
            )

        return wait_for("a leading JobManager", find, 60, poll_s=0.25)

    def kill(self, name: str) -> None:
        self.log.append(f"kill -9 {name}")
        try:
            os.killpg(self.pid(name), signal.SIGKILL)
        except ProcessLookupError:
            pass

    def freeze(self, name: str, seconds: float) -> None:
        self.log.append(f"SIGSTOP {name} for {seconds:.0f} s")
        pid = self.pid(name)
        os.killpg(pid, signal.SIGSTOP)
        try:
            time.sleep(seconds)
        finally:
            os.killpg(pid, signal.SIGCONT)

    def restart_redis(self) -> None:
        self.log.append("Redis SHUTDOWN (the supervisor starts it again)")
        try:
            redis.Redis.from_url(self.c.redis_url).shutdown()
        except redis.ConnectionError:
            pass  # it closed the connection as it went

    def restart_zookeeper(self) -> None:
        self.kill("zookeeper")

    def pg_outage(self, seconds: float) -> None:
        self.log.append(f"PostgreSQL away for {seconds:.0f} s")
        self.proxy.stop()
        try:
            time.sleep(seconds)
        finally:
            self.proxy.start()

    def restart_kafka(self) -> None:
        self.log.append("kill -9 of the Kafka broker, started again 3 s later")
        self.kafka.broker.kill()
        time.sleep(3)
        self.kafka.broker.start()

    def random_fault(self) -> None:
        kinds = [
            "kill-leader",
            "freeze-leader",
            "kill-tm",
            "kill-tm",
            "kill-rm",
            "kill-dispatcher",
            "redis",
            "zookeeper",
            "postgres",
        ]
        kind = self.rng.choice(kinds + (["kafka", "kafka"] if self.kafka is not None else []))
        if kind == "kafka":
            self.restart_kafka()
        elif kind == "kill-leader":
            self.kill(self.leader())
        elif kind == "freeze-leader":
            self.freeze(self.leader(), self.rng.uniform(2, 6))
        elif kind == "kill-tm":
            self.kill(self.rng.choice(["taskmanager-1", "taskmanager-2"]))
        elif kind == "kill-rm":
            self.kill("resourcemanager")
        elif kind == "kill-dispatcher":
            self.kill("dispatcher")
        elif kind == "redis":
            self.restart_redis()
        elif kind == "zookeeper":
            self.restart_zookeeper()
        else:
            self.pg_outage(self.rng.uniform(3, 10))


def start_kafka_counting_job(env, kafka, table: str) -> tuple[Rest, str, Feeder]:
    """The counting job on a Kafka source (examples/kafka_to_postgres.py) fed from outside."""
    c, _, proxied, _, _ = env
    rest = Rest(c.dispatcher_url)
    topic = kafka.create_topic(table, partitions=2)
    jar = rest.upload(ROOT / "examples" / "kafka_to_postgres.py")
    feeder = Feeder(kafka.bootstrap, topic, rate=100.0, json_events=True).start()
    args = [
        "--topic",
        topic,
        "--bootstrap-servers",
        kafka.bootstrap,
        "--table",
        table,
        "--sink-url",
        proxied,
        "--trigger",
        TRIGGER,
    ]
    job = rest.run(
        jar,
        parallelism=1,
        jobName=table,
        programArgsList=args,
        flinkConfiguration={"execution.checkpointing.interval": CHECKPOINT_INTERVAL},
    )
    rest.wait_attempt_running(job, 0, timeout_s=300)
    return rest, job, feeder


def start_counting_job(env, stream: str, table: str) -> tuple[Rest, str, Producer]:
    c, _, proxied, source_url, _ = env
    rest = Rest(c.dispatcher_url)
    jar = rest.upload(ROOT / "examples" / "keyed_counts.py")
    producer = Producer(source_url, stream, rate=100.0).start()
    args = [
        "--stream",
        stream,
        "--source-url",
        source_url,
        "--sink",
        "sql",
        "--table",
        table,
        "--sink-url",
        proxied,
        "--trigger",
        TRIGGER,
    ]
    job = rest.run(
        jar,
        parallelism=1,
        jobName=table,
        programArgsList=args,
        flinkConfiguration={"execution.checkpointing.interval": CHECKPOINT_INTERVAL},
    )
    rest.wait_attempt_running(job, 0, timeout_s=300)
    return rest, job, producer


def robust(call, timeout_s: float = 120):
    """A REST read through faults: the dispatcher may be restarting, the catalog away (503)."""
    return wait_for("the REST API to answer", lambda: _try(call), timeout_s, poll_s=0.25)


def _try(call):
    try:
        return call()
    except Exception:  # noqa: BLE001 - connection refused, 503 while the catalog is away
        return None


def finish_exactly(env, rest: Rest, job: str, producer: Producer | Feeder, table: str, faults: list[str]) -> list[str]:
    """The sink holds exactly what was produced, the job still runs; the failures that restarted
    its task, oldest first."""
    produced = producer.stop()
    _, _, _, _, pg_direct = env
    expected = expected_totals(produced)
    try:
        wait_for(
            f"the sink to hold exactly {produced} events",
            lambda: sql_totals(pg_direct, table) == expected,
            300,
            poll_s=0.25,
        )
    finally:
        attempts = robust(lambda: rest.attempts(job)) or []
        causes = [
            e.get("exceptionName")
            for e in (robust(lambda: rest.get(f"/jobs/{job}/exceptions")) or {})
            .get("exceptionHistory", {})
            .get("entries", [])
        ]
        print(f"faults ({len(faults)}): {'; '.join(faults)}")
        print(
            f"events: {produced}; attempts: {len(attempts)} (restarted by: {', '.join(reversed(causes)) or 'none'}); "
            f"job: {robust(lambda: rest.job(job))['state']}"
        )
    assert robust(lambda: rest.job(job))["state"] == "RUNNING"
    rest.cancel(job)
    assert rest.wait_state(job, ("CANCELED",), timeout_s=120)["state"] == "CANCELED"
    return list(reversed(causes))


def test_outages_of_redis_zookeeper_and_postgresql_lose_and_double_nothing(env):
    c, proxy, *_ = env
    rest, job, producer = start_counting_job(env, "outages", "outage_counts")
    chaos = Chaos(c, proxy, rest, random.Random(0))
    for outage in (chaos.restart_redis, chaos.restart_zookeeper, lambda: chaos.pg_outage(30)):
        time.sleep(5)
        outage()
        # Back to RUNNING (or still there) before the next one.
        robust(lambda: rest.job(job)["state"] == "RUNNING" or None, 180)
    restarted_by = finish_exactly(env, rest, job, producer, "outage_counts", chaos.log)
    # None of these outages is the task's failure: the SQL sink waits out the database (up to
    # sink.max-retry-time), the TaskManager holds its reports through Redis and ZooKeeper.
    assert restarted_by == [], f"the outages restarted the task: {restarted_by}"


def test_chaos_random_faults_under_a_counting_job(env):
    c, proxy, *_ = env
    rest, job, producer = start_counting_job(env, "chaos", "chaos_counts")
    rng = random.Random(SEED)
    chaos = Chaos(c, proxy, rest, rng)
    print(f"chaos seed {SEED} (HEADRACE_CHAOS_SEED to replay), {FAULTS} faults")
    for _ in range(FAULTS):
        time.sleep(rng.uniform(2, 5))
        chaos.random_fault()
    restarted_by = finish_exactly(env, rest, job, producer, "chaos_counts", chaos.log)
    # Only a lost TaskManager restarts the task (when it ran it): noticed as lost, found without
    # the task when it registers again, or silent to the deploy of the next attempt.
    tm_kills = sum(1 for f in chaos.log if "taskmanager" in f)
    assert set(restarted_by) <= TASKMANAGER_LOSS_CAUSES and len(restarted_by) <= tm_kills, (
        f"restarts not explained by the {tm_kills} TaskManager kills: {restarted_by}"
    )


def test_chaos_with_a_kafka_source_and_the_broker_among_the_faults(env, kafka):
    """The counting job reads Kafka: the broker is killed (-9) among the random faults, and the
    sink still ends with every event counted once (the offsets are in the checkpoints)."""
    c, proxy, *_ = env
    rest, job, feeder = start_kafka_counting_job(env, kafka, "kafka_chaos_counts")
    rng = random.Random(SEED + 1)
    chaos = Chaos(c, proxy, rest, rng, kafka=kafka)
    for _ in range(max(4, FAULTS // 2)):
        time.sleep(rng.uniform(2, 5))
        chaos.random_fault()
    if not any("Kafka" in f for f in chaos.log):
        chaos.restart_kafka()  # the broker's fault happens in every run
    finish_exactly(env, rest, job, feeder, "kafka_chaos_counts", chaos.log)


class CpuHogs:
    """Busy processes that keep every core's run queue long, as on a loaded production host."""

    def __init__(self, count: int) -> None:
        self.procs = [
            subprocess.Popen(["python3", "-c", "while True: pass"], start_new_session=True) for _ in range(count)
        ]

    def stop(self) -> None:
        for proc in self.procs:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def test_control_plane_kills_under_load_restart_nothing(env):
    """kill -9 of the leading JobManager, the ResourceManager and the dispatcher, with every core
    busy besides: the task is no part of the control plane, so none of these may restart it."""
    c, proxy, *_ = env
    rest, job, producer = start_counting_job(env, "control_plane", "control_plane_counts")
    rng = random.Random(SEED + 2)
    chaos = Chaos(c, proxy, rest, rng)
    # One per core: the other xdist worker's tests run beside this one and must not time out.
    hogs = CpuHogs(int(os.environ.get("HEADRACE_CHAOS_HOGS", str(os.cpu_count() or 2))))
    try:
        for n in range(max(6, FAULTS)):
            time.sleep(rng.uniform(3, 6))
            [
                lambda: chaos.kill(chaos.leader()),
                lambda: chaos.kill("resourcemanager"),
                lambda: chaos.kill("dispatcher"),
            ][n % 3]()
    finally:
        hogs.stop()
    restarted_by = finish_exactly(env, rest, job, producer, "control_plane_counts", chaos.log)
    assert restarted_by == [], f"control-plane kills restarted the task: {restarted_by}"
