"""`headrace dispatcher|jobmanager|resourcemanager|taskmanager|spark-master|spark-worker`: one
process of the cluster in the foreground.

Each service's composition root is imported when its command runs, so `headrace list` never loads
Spark or Celery."""

from __future__ import annotations

import os
import re
import sys
from typing import Optional

import typer

from services.cli.common import fail, settings_or_fail

commands = typer.Typer()


@commands.command()
def dispatcher(port: Optional[int] = typer.Option(None, help="REST/UI port (default 8081)")) -> None:
    """Start the dispatcher: REST API and web UI."""
    from services.dispatcher.__main__ import run

    run(settings_or_fail(dispatcher_port=port))


@commands.command()
def jobmanager() -> None:
    """Start a JobManager."""
    from services.jobmanager.__main__ import run

    run(settings_or_fail())


@commands.command()
def resourcemanager() -> None:
    """Start the ResourceManager."""
    from services.resourcemanager.__main__ import run

    run(settings_or_fail())


@commands.command()
def taskmanager(
    slots: Optional[int] = typer.Option(None, "--slots", "-s", help="number of slots"),
    id: Optional[str] = typer.Option(None, "--id", help="TaskManager id (default: host-random)"),
) -> None:
    """Start a TaskManager."""
    if slots is not None and slots < 1:
        fail("--slots must be at least 1", 2)
    from services.taskmanager.__main__ import run

    run(settings_or_fail(), slots=slots, taskmanager_id=id)


@commands.command("spark-master")
def spark_master(
    host: str = typer.Option("0.0.0.0", help="address to listen on (and to advertise)"),
    port: int = typer.Option(7077, help="the master's port (spark://host:PORT)"),
    webui_port: int = typer.Option(8080, "--webui-port", help="its web UI"),
) -> None:
    """Run a Spark standalone master from pyspark's own jars (replaces this process)."""
    from services.cluster import spark_standalone as ss

    addr = ss.MasterAddress(host, port, webui_port)
    log_dir = settings_or_fail().home / "spark" / "master"
    _exec(ss.master_command(addr), ss.environment(os.environ, host=host, log_dir=log_dir))


@commands.command("spark-worker")
def spark_worker(
    master: str = typer.Argument(..., help="spark://host:port of the master"),
    host: str = typer.Option("0.0.0.0", help="address to listen on"),
    cores: int = typer.Option(1, min=1, help="cores this worker offers to executors"),
    memory: str = typer.Option("1g", help="memory this worker offers to executors"),
    webui_port: int = typer.Option(8081, "--webui-port", help="its web UI"),
) -> None:
    """Run a Spark standalone worker from pyspark's own jars (replaces this process). It must see
    the checkpoint directory at the same path as the TaskManagers (docs/runbooks/shared-storage.md)."""
    from services.cluster import spark_standalone as ss

    m = re.fullmatch(r"spark://([^:/]+):(\d+)", master)
    if not m:
        fail(f"the master must be a URL such as spark://spark-master:7077, got {master!r}", 2)
    addr = ss.MasterAddress(m.group(1), int(m.group(2)), 0)
    work = settings_or_fail().home / "spark" / "worker"
    work.mkdir(parents=True, exist_ok=True)
    _exec(
        ss.worker_command(addr, host=host, cores=cores, memory=memory, webui_port=webui_port, work_dir=work),
        ss.environment(os.environ, host=host, log_dir=work, work_dir=work),
    )


def _exec(cmd: list[str], env: dict) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvpe(cmd[0], cmd, env)
