"""`headrace up|redis-auth|demo`: a whole local cluster (services/cluster/), the compose stack's
credentials, and the clickstream demo on a local cluster."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path
from typing import Optional

import typer

from services.cli.common import fail, settings_or_fail

commands = typer.Typer()


@commands.command()
def up(
    taskmanagers: int = typer.Option(2, "--taskmanagers", "-n", help="how many TaskManagers"),
    slots: Optional[int] = typer.Option(None, "--slots", help="slots per TaskManager"),
    port: Optional[int] = typer.Option(None, metavar="PORT", help="dispatcher port (default 8081)"),
    ha: bool = typer.Option(
        False,
        "--ha",
        help="ZooKeeper mode: two JobManagers elect a leader (starts a local "
        "ZooKeeper unless zookeeper_quorum is set, and a PostgreSQL "
        "catalog unless catalog_url is set)",
    ),
    spark_workers: int = typer.Option(
        0,
        "--spark-workers",
        min=0,
        max=16,
        help="also start a Spark standalone master and this many workers; the tasks' executors run on them",
    ),
    spark_worker_cores: int = typer.Option(1, "--spark-worker-cores", min=1, help="cores each Spark worker offers"),
    spark_worker_memory: str = typer.Option("1g", "--spark-worker-memory", help="memory each Spark worker offers"),
    catalog_port: Optional[int] = typer.Option(
        None,
        "--catalog-port",
        min=0,
        max=65535,
        help="with --ha: the port of the PostgreSQL catalog it runs "
        "(default a free one; none runs when catalog_url is set)",
    ),
    kafka: bool = typer.Option(
        False,
        "--kafka",
        help="also run a Kafka broker (KRaft, one node) on kafka_port "
        "(9092), its data in $HEADRACE_HOME/kafka; pipelines get its "
        "address as ctx.kafka_bootstrap_servers",
    ),
    redis_port: Optional[int] = typer.Option(
        None,
        "--redis-port",
        min=1,
        max=65535,
        metavar="PORT",
        help="the port of the Redis it starts (default: a free one)",
    ),
    zookeeper_port: Optional[int] = typer.Option(
        None,
        "--zookeeper-port",
        min=1,
        max=65535,
        metavar="PORT",
        help="with --ha: the port of the ZooKeeper it starts (default: a free one)",
    ),
    metrics_port_base: Optional[int] = typer.Option(
        None,
        "--metrics-port-base",
        min=1,
        max=65535 - 64,
        metavar="PORT",
        help="the ResourceManager's metrics port; the JobManagers' and then the TaskManagers' follow it "
        "(default: free ones)",
    ),
) -> None:
    """Start a whole local cluster as supervised child processes; Ctrl-C stops it."""
    from services.cluster.local_cluster import ClusterError, LocalCluster
    from services.cluster.redis_auth import masked

    settings = settings_or_fail(dispatcher_port=port, catalog_port=catalog_port)
    ha = ha or settings.high_availability == "zookeeper"
    cluster = LocalCluster(
        settings,
        taskmanagers=taskmanagers,
        slots=slots,
        jobmanagers=2 if ha else 1,
        ha=ha,
        spark_workers=spark_workers,
        spark_worker_cores=spark_worker_cores,
        spark_worker_memory=spark_worker_memory,
        kafka=kafka,
        redis_port=redis_port,
        zookeeper_port=zookeeper_port,
        metrics_port_base=metrics_port_base,
    )
    stop = stop_event()
    try:
        cluster.start()
    except ClusterError as exc:
        cluster.stop()
        fail(str(exc))
    # Supervised from here on: a child that exits is restarted with a backoff, and said so here.
    cluster.supervise(notify=typer.echo)
    typer.echo(f"Headrace is up. Dashboard: {cluster.dispatcher_url}/  (logs: {cluster.run_dir}/logs)")
    from services.dispatcher.guards.auth_mode import describe_mode

    typer.echo(describe_mode(settings))
    typer.echo(
        f"Redis: {masked(cluster.redis_url)}"
        + (
            f"  (AOF and passwords in {settings.home / 'redis'}; redis-cli: REDISCLI_AUTH from credentials.json)"
            if "redis_url" not in settings.model_fields_set and settings.redis_auth
            else ""
        )
    )
    if cluster.pipeline_databases is not None:
        typer.echo(
            f"Pipelines' databases (ctx.catalog_url, SQL sinks without url=): one SQLite file per job and the jobs "
            f"that continue it, {cluster.pipeline_databases}/<lineage>/pipelines.db; a job's details name its file"
        )
    else:
        configured = masked(cluster.settings.pipeline_catalog_url or "")
        typer.echo(f"Pipelines' database (ctx.catalog_url, SQL sinks without url=): {configured}")
    if cluster.zookeeper_quorum:
        typer.echo(
            f"High availability: 2 JobManagers, ZooKeeper at {cluster.zookeeper_quorum}, catalog "
            f"{masked(cluster.catalog_url)}"
        )
    if cluster.spark_master is not None:
        typer.echo(
            f"Spark standalone: master {cluster.spark_master.url} with {spark_workers} worker(s); "
            f"its web UI at {cluster.spark_master.webui}"
        )
    if cluster.kafka_spec is not None:
        typer.echo(
            f"Kafka: {cluster.kafka_spec.bootstrap} (ctx.kafka_bootstrap_servers; data in "
            f"{cluster.kafka_spec.data_dir}; topics: headrace kafka create-topic NAME)"
        )
    typer.echo("Press Ctrl-C to stop.")
    announce_warm_drivers(cluster, settings, stop)
    try:
        stop.wait()
    finally:
        typer.echo("stopping the cluster ...")
        cluster.stop()


# A warm driver runs 150 warm-up micro-batches before it is ready: ~85 s on an idle machine of
# two cores (docs/benchmarks.md), minutes on a loaded one; past this, `up` says so and goes on.
WARM_DRIVERS_WAIT_S = 300.0


def announce_warm_drivers(cluster, settings, stop: threading.Event) -> None:
    """Say when every TaskManager has a warm Spark driver ready: from then on a submission, and a
    failover to another TaskManager, starts in about a second; before, it may wait for a driver
    still warming up."""
    from services.cluster.readiness import wait_for_warm_drivers

    if settings.warm_drivers <= 0:
        return
    taskmanagers = [f"tm-{i + 1}" for i in range(cluster.taskmanagers)]
    typer.echo(
        f"Warming up a Spark driver on each TaskManager (up to {WARM_DRIVERS_WAIT_S:.0f} s); "
        "jobs may be submitted meanwhile."
    )
    started = time.monotonic()
    waiting = wait_for_warm_drivers(cluster.redis_url, taskmanagers, WARM_DRIVERS_WAIT_S, stopped=stop.is_set)
    if stop.is_set():
        return
    if waiting:
        typer.echo(
            f"No warm driver ready on {', '.join(waiting)} after {WARM_DRIVERS_WAIT_S:.0f} s: tasks there "
            f"start on a driver still warming up (see {cluster.run_dir}/logs and "
            'docs/runbooks/slow-pipeline.md, "Warm drivers").'
        )
    else:
        typer.echo(
            f"Warm drivers ready on every TaskManager ({time.monotonic() - started:.1f} s later): "
            "submissions and failovers start in about a second."
        )


@commands.command("redis-auth")
def redis_auth_files(
    directory: Path = typer.Argument(Path("deploy"), help="where docker-compose.yml is"),
    rotate: bool = typer.Option(False, "--rotate", help="new passwords and cluster secret (restart the whole stack)"),
) -> None:
    """Write the compose stack's credentials: DIR/.env (Redis passwords, the cluster secret and
    each TaskManager's derived keys; 0600) and DIR/secrets/redis-users.acl (ACL users with
    password hashes). Existing passwords and the secret are kept."""
    from services.cluster.compose_credentials import compose_files

    if not directory.is_dir():
        fail(f"{directory}: no such directory", 2)
    try:
        env_file, acl = compose_files(directory, rotate=rotate)
    except (OSError, ValueError) as exc:
        fail(str(exc))
    typer.echo(f"wrote {env_file} (passwords, mode 0600) and {acl} (hashes only)")


def stop_event() -> threading.Event:
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    return stop


@commands.command()
def demo(
    once: bool = typer.Option(False, "--once", help="stop the cluster after printing the result"),
    port: Optional[int] = typer.Option(None, help="dispatcher port (default 8081)"),
    spark_workers: int = typer.Option(
        0,
        "--spark-workers",
        min=0,
        max=16,
        help="run the example's executors on a local Spark standalone cluster with this many workers",
    ),
) -> None:
    """Start a local cluster, run the clickstream example, print its per-window counts."""
    from services.cluster.demo import run_demo

    run_demo(
        settings_or_fail(dispatcher_port=port),
        once=once,
        echo=typer.echo,
        fail=fail,
        stop=stop_event(),
        spark_workers=spark_workers,
    )
