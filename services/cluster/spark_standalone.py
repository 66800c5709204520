"""Spark's own standalone cluster manager, started from the jars the `pyspark` package ships: the
commands for a master and its workers, and the readiness checks over the master's JSON status page.

Headrace keeps no executor pool of its own: a TaskManager configured with a master URL has each
task's driver ask this master for executors (docs/architecture.md, "Spark clusters")."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from shared.errors import ClusterError
from shared.import_root import IMPORT_ROOT

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"


class SparkClusterError(ClusterError, RuntimeError):
    """The standalone cluster did not come up as asked; the message says what it waited for."""


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def spark_class() -> str:
    path = spark_home() / "bin" / "spark-class"
    if not path.is_file():
        raise SparkClusterError(f"{path} is missing: the installed pyspark package has no launcher scripts")
    return str(path)


def environment(base: Mapping[str, str], *, host: str, log_dir: Path, work_dir: Path | None = None) -> dict[str, str]:
    """What a master or worker process needs: Spark's home, its own log and scratch folders, and
    the Python every executor's Python workers run (the same as the drivers', or pickled
    functions would not load)."""
    env = dict(
        base,
        SPARK_HOME=str(spark_home()),
        SPARK_LOG_DIR=str(log_dir),
        SPARK_LOCAL_IP=host,
        SPARK_NO_DAEMONIZE="1",
        PYSPARK_PYTHON=sys.executable,
        PYSPARK_DRIVER_PYTHON=sys.executable,
    )
    if work_dir is not None:
        env["SPARK_WORKER_DIR"] = str(work_dir)
    # The executors import Headrace's connectors from where the drivers do.
    root = str(IMPORT_ROOT)
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join([root, *[p for p in paths if p != root]])
    return env


@dataclass(frozen=True)
class MasterAddress:
    host: str
    port: int
    webui_port: int

    @property
    def url(self) -> str:
        return f"spark://{self.host}:{self.port}"

    @property
    def webui(self) -> str:
        return f"http://{self.host}:{self.webui_port}"


def master_command(addr: MasterAddress) -> list[str]:
    return [
        spark_class(),
        MASTER_CLASS,
        "--host",
        addr.host,
        "--port",
        str(addr.port),
        "--webui-port",
        str(addr.webui_port),
    ]


def worker_command(
    master: MasterAddress, *, host: str, cores: int, memory: str, webui_port: int, work_dir: Path
) -> list[str]:
    return [
        spark_class(),
        WORKER_CLASS,
        "--host",
        host,
        "--cores",
        str(cores),
        "--memory",
        memory,
        "--webui-port",
        str(webui_port),
        "--work-dir",
        str(work_dir),
        master.url,
    ]


def master_status(webui: str, *, timeout_s: float = 2.0) -> dict:
    """The master's own status document (`/json/` on its web UI): workers, cores, applications."""
    import httpx  # here: `headrace up` imports this module, and most clusters have no Spark master

    r = httpx.get(f"{webui}/json/", timeout=timeout_s)
    r.raise_for_status()
    return r.json()


def alive_workers(status: dict) -> list[dict]:
    return [w for w in status.get("workers", []) if w.get("state") == "ALIVE"]


def wait_until_ready(master: MasterAddress, workers: int, *, timeout_s: float = 60.0, alive=lambda: True) -> dict:
    """The master answers and `workers` workers registered ALIVE; else SparkClusterError saying
    which of the two it was still waiting for. `alive()` is False once a process it waits for
    exited (the caller knows its children)."""
    import httpx

    deadline = time.monotonic() + timeout_s
    reason = f"the master's status page {master.webui}/json/ to answer"
    while time.monotonic() < deadline:
        if not alive():
            raise SparkClusterError(f"a Spark process exited while waiting for {reason}")
        try:
            status = master_status(master.webui)
        except (httpx.HTTPError, ValueError):
            time.sleep(0.3)
            continue
        if status.get("status") == "ALIVE" and len(alive_workers(status)) >= workers:
            return status
        reason = f"{workers} ALIVE workers at {master.url} (have {len(alive_workers(status))})"
        time.sleep(0.3)
    raise SparkClusterError(
        f"the Spark standalone cluster was not ready within {timeout_s:.0f} s: still waiting for {reason}"
    )
