"""TaskManagers on other hosts, and network partitions, under jobs fed from outside.

The TaskManager `tm-ns` runs on a host of its own: a Linux network namespace joined to this machine
by a veth pair (tests/netns.py), so it has its own address and reaches Redis and PostgreSQL only by
the addresses it is configured with (this machine's end of the link).

1. It registers, runs the clickstream example with exact counts in PostgreSQL, and the dispatcher
   reads its logs at the address it advertises.
2. Its link goes down for 20 s under a stateful streaming task (keyed counts from a Redis stream
   into PostgreSQL): the ResourceManager declares it lost at the heartbeat timeout, the task moves
   to `tm-host` on this machine, tm-ns comes back, the sink ends exact.
3. Only its control plane (Redis) is cut, its data path stays up: the old driver keeps working
   and is refused by the sink's fence; the sink ends exact.

Needs root (network namespaces); skipped with the reason elsewhere."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psutil
import pytest
import yaml

from services.cluster import spark_standalone
from shared.ports import free_port
from tests.clusters import Rest, start_cluster
from tests.e2e.counting import CHECKPOINT_INTERVAL, TRIGGER, Producer, expected_totals, sql_totals
from tests.e2e.drills import ARGS, TOTAL, expected_counts, sink_counts
from tests.netns import NetnsHost, cleanup_stale, netns_unavailable
from tests.netproxy import TcpProxy
from tests.servers import redis_pings
from tests.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
WHY_NOT = netns_unavailable()
if WHY_NOT:
    pytest.skip(f"network namespaces unavailable: {WHY_NOT}", allow_module_level=True)

HEARTBEAT_TIMEOUT_S = 6.0
ZOOKEEPER_SESSION_S = 4.0
CUT_S = 20.0


class Env:
    def __init__(self, home: Path, pg_url: str):
        cleanup_stale()
        self.home = home
        self.host = NetnsHost(2).create()
        gw = self.host.gateway
        self.procs: list[subprocess.Popen] = []
        self.tms: dict[str, subprocess.Popen] = {}
        # The outside world, reachable from both hosts at this machine's address on the link.
        port = free_port()
        self.source_proc = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(port),
                "--bind",
                f"127.0.0.1 {gw}",
                "--save",
                "",
                "--appendonly",
                "no",
                "--protected-mode",
                "no",
                "--dir",
                str(home),
            ],
            stdout=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.source_url = f"redis://{gw}:{port}/0"
        wait_for("the source redis-server", lambda: redis_pings(self.source_url), timeout_s=10)
        self.pg = TcpProxy(("127.0.0.1", 5432), listen_host=gw)
        self.pg.start()
        self.sink_url = with_host(pg_url, gw, self.pg.port)  # for the tasks, on either host
        self.sink_direct = pg_url  # for the test's own checks
        # ZooKeeper mode with no JobManager of the cluster's own: the test starts them, one of
        # them on tm-ns's host, to cut the leader off.
        self.cluster = start_cluster(
            home / "cluster",
            catalog_url=pg_url,
            taskmanagers=0,
            ha=True,
            jobmanagers=0,
            redis_bind=("127.0.0.1", gw),
            zookeeper_bind="0.0.0.0",
            zookeeper_session_timeout_s=ZOOKEEPER_SESSION_S,
            heartbeat_timeout_s=HEARTBEAT_TIMEOUT_S,
            heartbeat_interval_s=1.0,
            restart_strategy={"type": "fixed-delay", "attempts": 100, "delay": "1 s"},
        )
        self.catalog_remote = with_host(pg_url, gw, self.pg.port)
        self.rest = Rest(self.cluster.dispatcher_url)
        self.jms: dict[str, subprocess.Popen] = {}
        self.jobmanager("jm-host", remote=False)
        wait_for("a leading JobManager", self.leader, timeout_s=60)

    def jobmanager(self, name: str, *, remote: bool) -> subprocess.Popen:
        config = yaml.safe_load((self.cluster.run_dir / "jobmanager.yaml").read_text())
        if remote:
            config.update(
                redis_url=with_host(config["redis_url"], self.host.gateway),
                zookeeper_quorum=f"{self.host.gateway}:{self.cluster.zookeeper_quorum.rsplit(':', 1)[1]}",
                catalog_url=self.catalog_remote,
                advertised_host=self.host.address,
                metrics_host="0.0.0.0",
            )
        config["jobmanager_metrics_port"] = 0
        path = self.home / f"{name}.yaml"
        path.write_text(yaml.safe_dump(config))
        env = {k: v for k, v in os.environ.items() if not k.startswith("HEADRACE_")} | {"HEADRACE_CONFIG": str(path)}
        cmd = [sys.executable, "-m", "services.cli", "jobmanager"]
        with open(self.home / f"{name}.log", "ab") as log:
            kw = dict(env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            proc = self.host.popen(cmd, **kw) if remote else subprocess.Popen(cmd, **kw)
        self.procs.append(proc)
        self.jms[name] = proc
        return proc

    def stop_jobmanager(self, name: str) -> None:
        _kill_group(self.jms.pop(name))

    def leader(self) -> tuple[str, int] | None:
        """(name, epoch) of the leading JobManager, as the dispatcher sees it."""
        info = self.rest.get("/jobmanager/leader")
        lead = info.get("leader") or {}
        pid = int(str(lead.get("id", ":0")).rsplit(":", 1)[1] or 0)
        name = next((n for n, p in self.jms.items() if p.pid == pid), None)
        return (name, int(lead["epoch"])) if name else None

    def credentials(self, tm_id: str) -> dict:
        """tm_id's own config (Redis user and keys), as `headrace credentials taskmanager` writes it."""
        path = self.home / f"{tm_id}.credentials.yaml"
        env = {k: v for k, v in os.environ.items() if not k.startswith("HEADRACE_")}
        made = subprocess.run(
            [sys.executable, "-m", "services.cli", "credentials", "taskmanager", tm_id, "--out", str(path)],
            env=env | {"HEADRACE_CONFIG": str(self.cluster.run_dir / "config.yaml")},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert made.returncode == 0, made.stderr
        return yaml.safe_load(path.read_text())

    def taskmanager(self, tm_id: str, *, remote: bool, slots: int = 1, **settings) -> subprocess.Popen:
        """Start TaskManager `tm_id` (on tm-ns's host if `remote`) unless it runs already."""
        if tm_id in self.tms and self.tms[tm_id].poll() is None:
            return self.tms[tm_id]
        config = self.credentials(tm_id) | settings
        config.update(
            checkpoint_dir=str(self.cluster.settings.checkpoints),
            artifact_dir=str(self.cluster.settings.artifacts),
            home=str(self.home / tm_id),
            taskmanager_metrics_port=0,
        )
        if remote:
            config.update(
                redis_url=with_host(config["redis_url"], self.host.gateway),
                advertised_host=self.host.address,
                metrics_host="0.0.0.0",
            )
        path = self.home / f"{tm_id}.yaml"
        path.write_text(yaml.safe_dump(config))
        env = {k: v for k, v in os.environ.items() if not k.startswith("HEADRACE_")} | {"HEADRACE_CONFIG": str(path)}
        cmd = [sys.executable, "-m", "services.cli", "taskmanager", "--id", tm_id, "--slots", str(slots)]
        with open(self.home / f"{tm_id}.log", "ab") as log:
            kw = dict(env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            proc = self.host.popen(cmd, **kw) if remote else subprocess.Popen(cmd, **kw)
        self.procs.append(proc)
        self.tms[tm_id] = proc
        wait_for(f"{tm_id} registered", lambda: tm_id in self.live_taskmanagers(), timeout_s=60)
        return proc

    def counting_job_on(self, tm_id: str | None, table: str) -> tuple[str, Producer]:
        """keyed_counts over an outside producer's stream (named as the table), one checkpoint a
        second, running on `tm_id`."""
        jar = self.rest.upload(ROOT / "examples" / "keyed_counts.py")
        producer = Producer(self.source_url, table, rate=100.0).start()
        args = [
            "--stream",
            table,
            "--source-url",
            self.source_url,
            "--sink",
            "sql",
            "--table",
            table,
            "--sink-url",
            self.sink_url,
            "--trigger",
            TRIGGER,
        ]
        job = self.rest.run(
            jar,
            parallelism=1,
            jobName=table,
            programArgsList=args,
            flinkConfiguration={"execution.checkpointing.interval": CHECKPOINT_INTERVAL},
        )
        self.rest.wait_attempt_running(job, 0, timeout_s=300)
        if tm_id is not None:
            assert self.rest.attempts(job)[-1]["taskmanager-id"] == tm_id
        return job, producer

    def finish_exactly(self, job: str, producer: Producer, table: str) -> None:
        """Stop the producer; the sink must reach exactly its counts with the job still RUNNING."""
        produced = producer.stop()
        wait_for(
            f"the sink to hold exactly {produced} events",
            lambda: sql_totals(self.sink_direct, table) == expected_totals(produced),
            timeout_s=180,
        )
        assert self.rest.job(job)["state"] == "RUNNING"
        self.rest.cancel(job)
        assert self.rest.wait_state(job, ("CANCELED",), timeout_s=60)["state"] == "CANCELED"

    def live_taskmanagers(self) -> set[str]:
        return {t["id"] for t in self.rest.get("/taskmanagers")["taskmanagers"]}

    def stop(self) -> None:
        for p in self.procs:
            _kill_group(p)
        self.cluster.stop()
        self.pg.stop()
        _kill_group(self.source_proc)
        self.host.remove()


def with_host(url: str, host: str, port: int | None = None) -> str:
    """`url` with another host (and port), its user and password kept."""
    parts = urlsplit(url)
    userinfo = parts.netloc.rpartition("@")[0]
    netloc = f"{host}:{port or parts.port}"
    return urlunsplit(
        (parts.scheme, f"{userinfo}@{netloc}" if userinfo else netloc, parts.path, parts.query, parts.fragment)
    )


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(20)
    except ProcessLookupError:
        return
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def counted(pg: str, table: str) -> int:
    try:
        return sum(count for count, _ in sql_totals(pg, table).values())
    except Exception:  # noqa: BLE001 - the sink table is created by the first batch
        return 0


def driver_processes(tm: subprocess.Popen) -> list[psutil.Process]:
    # `ip netns exec` execs the TaskManager: the Popen pid is the TaskManager process itself.
    out = []
    for p in psutil.Process(tm.pid).children(recursive=True):
        try:
            if "services.taskmanager.runtime.runner" in " ".join(p.cmdline()):
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


@pytest.fixture(scope="module")
def env(tmp_path_factory, pg_url_module):
    e = Env(tmp_path_factory.mktemp("partition"), pg_url_module)
    yield e
    e.stop()


def test_spark_executors_on_a_worker_on_another_host(env):
    """A Spark standalone master on this machine (at its address on the link), its one worker on
    the namespace host; `tm-spark` here sends its tasks' work there. The executors reach the
    driver at the TaskManager's advertised address: exact counts."""
    gw = env.host.gateway
    master = spark_standalone.MasterAddress(gw, free_port(), free_port())
    logs = env.home / "spark"
    with open(env.home / "spark-master.log", "ab") as log:
        env.procs.append(
            subprocess.Popen(
                spark_standalone.master_command(master),
                stdout=log,
                stderr=subprocess.STDOUT,
                env=spark_standalone.environment(os.environ, host=gw, log_dir=logs / "m"),
                start_new_session=True,
            )
        )
    work = env.home / "spark-worker"
    work.mkdir()
    with open(env.home / "spark-worker.log", "ab") as log:
        env.procs.append(
            env.host.popen(
                spark_standalone.worker_command(
                    master, host=env.host.address, cores=2, memory="2g", webui_port=free_port(), work_dir=work
                ),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=spark_standalone.environment(os.environ, host=env.host.address, log_dir=work, work_dir=work),
            )
        )
    status = spark_standalone.wait_until_ready(master, 1, timeout_s=120)
    assert spark_standalone.alive_workers(status)[0]["host"] == env.host.address
    rest = env.rest
    env.taskmanager("tm-spark", remote=False, slots=2, spark_master=master.url, advertised_host=gw)
    jar = rest.upload(ROOT / "examples" / "clickstream.py")
    job = rest.run(
        jar,
        parallelism=2,
        jobName="clickstream-remote-executors",
        programArgsList=[a if a != "e2e_clicks" else "remote_executor_clicks" for a in ARGS],
        flinkConfiguration={"catalog_url": env.sink_url},
    )
    final = rest.wait_state(job, ("FINISHED", "FAILED", "CANCELED"), timeout_s=300)
    assert final["state"] == "FINISHED", rest.get(f"/jobs/{job}/exceptions")
    assert rest.attempts(job)[0]["taskmanager-id"] == "tm-spark"
    got = sink_counts(env.sink_direct, "remote_executor_clicks")
    assert got == expected_counts() and sum(got.values()) == TOTAL
    assert list(work.glob("app-*/*/stderr")), "no executor ran on the worker in the namespace"
    _kill_group(env.tms.pop("tm-spark"))  # the next tests place their tasks on the other TaskManagers


def test_a_taskmanager_on_another_host_runs_a_task_with_exact_output(env):
    rest = env.rest
    env.taskmanager("tm-ns", remote=True)
    jar = rest.upload(ROOT / "examples" / "clickstream.py")
    job = rest.run(
        jar,
        parallelism=1,
        jobName="clickstream-netns",
        programArgsList=[a if a != "e2e_clicks" else "netns_clicks" for a in ARGS],
        flinkConfiguration={"catalog_url": env.sink_url},
    )  # its sink, at the address tm-ns reaches
    final = rest.wait_state(job, ("FINISHED", "FAILED", "CANCELED"), timeout_s=300)
    assert final["state"] == "FINISHED", rest.get(f"/jobs/{job}/exceptions")
    assert rest.attempts(job)[0]["taskmanager-id"] == "tm-ns"
    got = sink_counts(env.sink_direct, "netns_clicks")
    assert got == expected_counts() and sum(got.values()) == TOTAL
    # The dispatcher reads the other host's logs at the address it advertises.
    names = [entry["name"] for entry in rest.get("/taskmanagers/tm-ns/logs")["logs"]]
    assert any(n.startswith("driver-") for n in names), names
    main_log = rest.http.get("/taskmanagers/tm-ns/log")
    assert main_log.status_code == 200 and "tm-ns" in main_log.text


def test_a_partitioned_taskmanager_is_declared_lost_its_task_moves_and_its_old_driver_counts_nothing(env):
    rest, table = env.rest, "partition_counts"
    remote = env.taskmanager("tm-ns", remote=True)
    job, producer = env.counting_job_on("tm-ns", table)
    env.taskmanager("tm-host", remote=False)
    wait_for("batches committed from tm-ns", lambda: counted(env.sink_direct, table) > 0, timeout_s=120)

    cut_at = time.monotonic()
    env.host.cut()
    try:
        wait_for("tm-ns declared lost", lambda: "tm-ns" not in env.live_taskmanagers(), timeout_s=CUT_S)
        lost_after = time.monotonic() - cut_at
        attempts = rest.wait_attempt_running(job, 1, timeout_s=CUT_S + 120)
        assert attempts[-1]["taskmanager-id"] == "tm-host"
        remaining = CUT_S - (time.monotonic() - cut_at)
        if remaining > 0:
            time.sleep(remaining)
    finally:
        env.host.heal()
    assert lost_after <= HEARTBEAT_TIMEOUT_S + 4, f"declared lost after {lost_after:.1f} s"

    # Back on the network: tm-ns registers again and its old driver is stopped.
    wait_for("tm-ns back", lambda: "tm-ns" in env.live_taskmanagers(), timeout_s=60)
    wait_for("the old driver on tm-ns stopped", lambda: not driver_processes(remote), timeout_s=60)

    env.finish_exactly(job, producer, table)


def test_cut_off_the_control_plane_only_its_still_running_driver_is_fenced(env, tmp_path):
    """The harder case: tm-ns loses the control plane's Redis but keeps its data path (the source
    and PostgreSQL). Declared lost, its task moves, yet its old driver keeps reading and tries to
    commit: the sink's fence refuses it (the old attempt ends there). When the link returns tm-ns
    registers again; the sink holds exactly the produced counts."""
    rest, table = env.rest, "control_cut_counts"
    remote = env.taskmanager("tm-ns", remote=True)
    env.taskmanager("tm-host", remote=False)
    blocker = occupy_all_but(env, "tm-ns", tmp_path)  # so the job lands on tm-ns
    job, producer = env.counting_job_on("tm-ns", table)
    rest.cancel(blocker)  # tm-host's slot is free for the failover
    rest.wait_state(blocker, ("CANCELED",), timeout_s=60)
    wait_for("batches committed from tm-ns", lambda: counted(env.sink_direct, table) > 0, timeout_s=120)
    assert driver_processes(remote), "the task's driver on tm-ns"

    redis_port = int(env.cluster.redis_url.rsplit(":", 1)[1].split("/")[0])
    env.host.block(redis_port)
    try:
        wait_for("tm-ns declared lost", lambda: "tm-ns" not in env.live_taskmanagers(), timeout_s=CUT_S)
        attempts = rest.wait_attempt_running(job, 1, timeout_s=120)
        assert attempts[-1]["taskmanager-id"] == "tm-host"
        # Both attempts read the same stream now; the old one's next commit is refused.
        wait_for("the old driver refused by the sink's fence", lambda: fence_refusals(env, "tm-ns"), timeout_s=60)
        wait_for("the old driver gone", lambda: not driver_processes(remote), timeout_s=60)
    finally:
        env.host.unblock(redis_port)
    wait_for("tm-ns back", lambda: "tm-ns" in env.live_taskmanagers(), timeout_s=60)

    env.finish_exactly(job, producer, table)


def occupy_all_but(env, tm_id: str, tmp_path: Path) -> str:
    """Run endless no-op jobs until the only free slot is `tm_id`'s; returns the blocker's job id."""
    jar = env.rest.upload_noop_pipeline(tmp_path)
    extra = []
    while True:
        job = env.rest.run(jar, kind="noop", jobName="blocker", flinkConfiguration={"noop.duration": -1})
        env.rest.wait_attempt_running(job, 0, timeout_s=60)
        if env.rest.attempts(job)[-1]["taskmanager-id"] != tm_id:
            break
        extra.append(job)
    for other in extra:
        env.rest.cancel(other)
        env.rest.wait_state(other, ("CANCELED",), timeout_s=60)
    return job


def fence_refusals(env, tm_id: str) -> bool:
    logs = (env.home / tm_id / "work" / "taskmanagers" / tm_id / "logs").glob("driver-*.log")
    return any("SinkFencedError" in p.read_text(errors="replace") for p in logs)


def test_a_leader_cut_off_zookeeper_or_redis_hands_over_and_one_leader_acts(env, tmp_path):
    """The leading JobManager runs on tm-ns's host. Cut off ZooKeeper (Redis still reachable): its
    lease is revoked at once and the standby leads after the session timeout. Cut off Redis
    (ZooKeeper still reachable): it gives the leadership up after the heartbeat timeout and the
    standby leads. Each time the new leader schedules a new job, the epoch rises (receivers obey
    only the newest), and a counting job running throughout ends exact."""
    rest, table = env.rest, "leader_cut_counts"
    if "tm-ns" in env.tms:  # the job must not run on the host whose links this test cuts
        _kill_group(env.tms.pop("tm-ns"))
        wait_for("tm-ns gone", lambda: "tm-ns" not in env.live_taskmanagers(), timeout_s=30)
    env.taskmanager("tm-host", remote=False)
    job, producer = env.counting_job_on("tm-host", table)
    env.taskmanager("tm-spare", remote=False)  # a free slot for the jobs that prove a new leader acts
    noop = rest.upload_noop_pipeline(tmp_path)
    zk_port = int(env.cluster.zookeeper_quorum.rsplit(":", 1)[1])
    redis_port = int(env.cluster.redis_url.rsplit(":", 1)[1].split("/")[0])
    epochs = []

    for cut, port in (("ZooKeeper", zk_port), ("Redis", redis_port)):
        # Lead from the other host: start a JobManager there, stop this machine's one, start it again.
        env.jobmanager("jm-ns", remote=True)
        env.stop_jobmanager("jm-host")
        name, epoch = wait_for(
            "jm-ns leading", lambda: (env.leader() or (None,))[0] == "jm-ns" and env.leader(), timeout_s=60
        )
        env.jobmanager("jm-host", remote=False)
        epochs.append(epoch)
        env.host.block(port)
        try:
            name, epoch = wait_for(
                f"jm-host leading after jm-ns lost {cut}",
                lambda: (env.leader() or (None,))[0] == "jm-host" and env.leader(),
                timeout_s=60,
            )
            assert epoch > epochs[-1]
            epochs.append(epoch)
            probe = rest.run(noop, kind="noop", jobName=f"during-{cut}-cut", flinkConfiguration={"noop.duration": 0.5})
            assert rest.wait_state(probe, ("FINISHED", "FAILED"), timeout_s=60)["state"] == "FINISHED"
        finally:
            env.host.unblock(port)
        log = (env.home / "jm-ns.log").read_text(errors="replace")
        said = "revoked" if cut == "ZooKeeper" else "giving up the leadership"
        assert said in log, f"jm-ns never said it stopped leading ({said!r}) after losing {cut}"
        env.stop_jobmanager("jm-ns")

    assert epochs == sorted(epochs) and len(set(epochs)) == len(epochs), epochs
    assert len(rest.attempts(job)) == 1, "a leader change restarted the task"
    env.finish_exactly(job, producer, table)
