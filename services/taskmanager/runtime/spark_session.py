"""The driver's SparkSession: the environment every Spark process of ours needs and the session
itself (local, or a driver of a standalone cluster). Used by the runner and by the class archive
builder (class_archive.py); what a session runs before any task arrives is warm_up.py."""

from __future__ import annotations

import atexit
import os
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from shared import local_fs_jar
from shared.driver_contract import python_socket_dir
from shared.import_root import IMPORT_ROOT
from shared.jars import DEFAULT_CACHE_DIR, JarCache

from .cluster_mode import Engine

# Spark's default checkpoint file manager goes through Hadoop's FileContext, which without
# Hadoop's native library forks `chmod` and `readlink` processes for every file it writes: 12
# forks, ~45 ms per file, and every micro-batch writes at least three (its offsets, its commit,
# a state delta per state partition). The FileSystem-based manager writes the same files with 2
# forks (~14 ms); a rename is atomic on the local and shared POSIX file systems checkpoints live
# on (docs/benchmarks.md, "Where a small micro-batch's time goes").
CHECKPOINT_FILE_MANAGER = "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"
# Spark talks to its Python workers over loopback TCP by default, where small writes meet
# delayed acknowledgements: a Python source's read task of a few rows took 55 ms, 15 ms over a
# Unix domain socket (same section). A socket's path is limited to 107 bytes and Spark adds 43 to
# the directory, so the directory is a short one in /tmp (not $TMPDIR: a driver's is its long work
# directory), named after the driver's work directory (its TaskManager removes both).
# Set by the TaskManager when its `spark_ui` setting is on (services/taskmanager/__main__.py).
SPARK_UI_ENV = "HEADRACE_SPARK_UI"


def prepare_env(host: str = "127.0.0.1") -> None:
    """Environment every Spark process of ours needs; must run before the JVM starts. `host`:
    the address this driver listens on (executors on other machines connect to it)."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = host
    # Python workers are spawned by the JVM with its environment: they must be able to import
    # `services.*` to unpickle our data sources.
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(IMPORT_ROOT) not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([str(IMPORT_ROOT), *paths])


def spark_ui_wanted(environ: Mapping[str, str] = os.environ) -> bool:
    return environ.get(SPARK_UI_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def build_spark(
    parallelism: int,
    workdir: str | Path,
    *,
    shuffle_partitions: int = 2,
    driver_memory: str = "1g",
    app_name: str = "headrace-driver",
    ui: bool = False,
    engine: Engine = Engine(),
    extra_java_options: str = "",
    python_forkserver: bool = False,
    jars: JarCache | None = None,
) -> Any:
    """A SparkSession whose scratch files all live under `workdir` (the caller cleans it): local,
    or a driver of a standalone cluster (`engine`, cluster_mode.py). `ui`: run the Spark UI on a
    free port (several drivers share a host); its kill links are off, a task is cancelled
    through Headrace. `extra_java_options`: for the driver's JVM only (class_archive.py).
    `python_forkserver`: with a local engine, Spark's Python processes start through a fork
    server's launcher (python_forkserver.py); executors elsewhere could not run it. `jars`: the
    cache of Spark's Kafka connector and Delta Lake (shared/jars.py; default: this user's), on
    the class path of the driver and its executors; MissingJars if they were never fetched. With
    a local engine, file: paths go through Headrace's local file system where its jar was built
    (shared/local_fs_jar.py: no process forked per file)."""
    cache = jars or JarCache(DEFAULT_CACHE_DIR)
    jar_conf = cache.spark_conf()
    if engine.local:  # executors in this JVM: Headrace's local file system reaches them too
        jar_conf.update(local_fs_jar.spark_conf(cache.root))
    prepare_env(engine.host)
    if python_forkserver and engine.local:
        from . import python_forkserver as forkserver

        launcher, _server = forkserver.start(str(Path(workdir).resolve() / "forkserver"))
        os.environ["PYSPARK_PYTHON"] = launcher  # SparkContext reads it once, when it is created
        # The JVM starts the data source lookup's daemon with the driver's Python.
        os.environ["PYSPARK_DRIVER_PYTHON"] = launcher
    from pyspark.sql import SparkSession

    work = Path(workdir).resolve()
    local_dir, tmp_dir = work / "spark-local", work / "tmp"
    local_dir.mkdir(parents=True, exist_ok=True)
    tmp_dir.mkdir(parents=True, exist_ok=True)
    java_opts = f"-Djava.io.tmpdir={tmp_dir}"
    builder = SparkSession.builder
    for key, value in {**jar_conf, **engine.spark_conf(parallelism)}.items():
        builder = builder.config(key, value)
    if engine.local:
        sockets = python_socket_dir(work)
        sockets.mkdir(mode=0o700, exist_ok=True)
        # A session in a process that ends normally (tests, benchmarks); a driver's runner ends
        # with os._exit and removes it itself, its TaskManager after a kill.
        atexit.register(shutil.rmtree, sockets, ignore_errors=True)
        builder = builder.config("spark.python.unix.domain.socket.enabled", "true")
        builder = builder.config("spark.python.unix.domain.socket.dir", str(sockets))
    else:
        # Executors import Headrace's connectors to unpickle the data sources, as the drivers do.
        builder = builder.config("spark.executorEnv.PYTHONPATH", os.environ["PYTHONPATH"])
    # Hadoop's files and directories writable by their group (0664 / 0775, which Hadoop sets
    # itself): below the lake directory that group is the drivers' (setgid there), so a table an
    # attempt made stays writable by the next attempt, another pool user; elsewhere a file's group
    # is its driver's own (its primary group). Others keep reading, as with Hadoop's default 022:
    # executors on Spark standalone workers, other users, write state the driver snapshots.
    builder = builder.config("spark.hadoop.fs.permissions.umask-mode", "002")
    spark = (
        builder.master(engine.master_url(parallelism))
        .appName(app_name)
        .config("spark.local.dir", str(local_dir))
        .config("spark.driver.extraJavaOptions", java_opts + extra_java_options)
        .config("spark.executor.extraJavaOptions", java_opts)
        .config("spark.driver.memory", driver_memory)
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.ui.enabled", "true" if ui else "false")
        .config("spark.ui.port", "0")
        .config("spark.ui.killEnabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", engine.host)
        .config("spark.driver.bindAddress", engine.host)
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.streaming.checkpointFileManagerClass", CHECKPOINT_FILE_MANAGER)
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("WARN")
    from .connectors import register_data_sources

    register_data_sources(spark)
    return spark
