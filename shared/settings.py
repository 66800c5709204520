"""Settings: built once in each service's entry point and passed down (no module singletons).

Sources, highest first: explicit arguments (CLI flags), `HEADRACE_*` environment variables,
the YAML file named by `HEADRACE_CONFIG` (_YamlSource, on pydantic-settings' own), then defaults.
The rules between settings are in settings_rules.py; the state directories derived from `home`
(checkpoints, lake, ...) in state_locations.py.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, ClassVar, Literal

import yaml
from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict, YamlConfigSettingsSource

from shared import jars, settings_rules
from shared.driver_contract import WARM_UP_BATCHES
from shared.settings_rules import CommaSeparated
from shared.state_locations import UnderHome


class _YamlSource(YamlConfigSettingsSource):
    """pydantic-settings' YAML source for the file named by HEADRACE_CONFIG, with Headrace's rules:
    the file must exist when named, must hold a mapping, may spell keys with '-' or '.' for '_',
    and keys that are no setting are ignored."""

    def __init__(self, settings_cls: type[BaseSettings], path: str | None):
        self._path = path
        if path and not Path(path).is_file():
            raise ValueError(f"settings file {path} does not exist (HEADRACE_CONFIG)")
        # absolute(): the name is read as given, without the library's expansion of "~".
        super().__init__(settings_cls, yaml_file=Path(path).absolute() if path else None)

    def _read_file(self, file_path: Path) -> dict[str, Any]:
        # The text, not the open file, goes to the parser: its errors name "<unicode string>" as before.
        loaded = yaml.safe_load(file_path.read_text(encoding=self.yaml_file_encoding)) or {}
        if not isinstance(loaded, dict):
            raise ValueError(f"settings file {self._path} must hold a mapping of setting: value")
        return {k.replace("-", "_").replace(".", "_"): v for k, v in loaded.items()}

    def __call__(self) -> dict[str, Any]:
        return {k: v for k, v in super().__call__().items() if k in self.settings_cls.model_fields}


def default_home() -> Path:
    return Path(os.environ.get("HEADRACE_HOME", Path.home() / ".headrace"))


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="HEADRACE_", extra="ignore")

    home: Path = Field(default_factory=default_home, description="state: catalog, artifacts, logs")
    redis_url: str = "redis://127.0.0.1:6379/0"
    redis_auth: bool = Field(
        True,
        description="headrace up/demo: the redis-server they start requires a password and gives each service "
        "its own ACL user (credentials 0600 in $HEADRACE_HOME/redis/); false: no password",
    )
    pipeline_redis_url: str | None = Field(
        None,
        description="the Redis URL a task's pipeline gets by default (ctx.redis_url); default: redis_url. "
        "headrace up sets it to its `pipeline` ACL user, which cannot touch the control plane",
    )
    catalog_url: str | None = Field(
        None, description="SQLAlchemy URL; default: SQLite in home (headrace up --ha: a PostgreSQL server of its own)"
    )
    catalog_port: int = Field(
        0,
        ge=0,
        le=65535,
        description="headrace up --ha without catalog_url: the port of the PostgreSQL catalog it runs (0: a free one)",
    )
    checkpoint_dir: Path | None = Field(None, description="shared by every TaskManager")
    # Where the pipelines' Delta tables live (ctx.sinks.delta / ctx.sources.delta): a relative
    # table path lands here, an absolute one must lie here or under a storage root. Writable by
    # the drivers' user; the TaskManagers create it (connectors/delta_paths.py).
    lake_dir: Path | None = Field(
        None, description="the pipelines' Delta tables (default $HEADRACE_HOME/lake); shared by every TaskManager"
    )
    artifact_dir: Path | None = None

    dispatcher_host: str = "127.0.0.1"
    dispatcher_port: int = 8081
    auth: Literal["off", "required"] | None = Field(
        None,
        description="REST API bearer tokens (headrace token create): off | required; default: required "
        "unless dispatcher_host is a loopback address (services/dispatcher/guards/auth.py)",
    )
    allowed_hosts: CommaSeparated = Field(
        None,
        description="Host header names the dispatcher answers, comma-separated ('*': any); default with "
        "auth on: localhost, loopback and IP literals, dispatcher_host and this machine's names",
    )

    # Prometheus endpoints (docs/runbooks/metrics.md); the dispatcher serves GET /metrics on its
    # REST port. 0: any free port (logged at start); -1: no endpoint.
    metrics_host: str = Field("127.0.0.1", description="address the metrics endpoints listen on")
    jobmanager_metrics_port: int = Field(9250, ge=-1, le=65535)
    resourcemanager_metrics_port: int = Field(9251, ge=-1, le=65535)
    taskmanager_metrics_port: int = Field(9252, ge=-1, le=65535)
    # The JobManager's and TaskManagers' metrics ports also serve their log files (/logs), which
    # the dispatcher fetches for GET /taskmanagers/{id}/logs and /jobmanager/logs. This is the
    # host name the dispatcher is told to use; None: metrics_host, or this machine's host name
    # when metrics_host is a wildcard address (docs/runbooks/logs.md).
    advertised_host: str | None = Field(
        None, description="host name other machines reach this process's metrics and log endpoint by"
    )

    heartbeat_interval_s: float = 2.0
    heartbeat_timeout_s: float = 10.0
    slot_request_timeout_s: float = 300.0
    task_cancel_timeout_s: float = 10.0
    # The JobManager's acknowledgement timers: a deploy the TaskManager never answers (no
    # INITIALIZING) fails the attempt over; a cancel never confirmed is sent again, then the
    # attempt is given up as CANCELED and its slots released (its sinks are fenced anyway).
    deploy_ack_timeout_s: float = 30.0
    cancel_ack_timeout_s: float = 30.0
    # A task whose pipeline has not started (imported, built, restored, query started) this long
    # after its TaskManager took it fails with PipelineStartupTimeout; a job overrides it with
    # `headrace.task.startup-timeout`.
    task_startup_timeout_s: float = Field(300.0, gt=0)
    # Warm drivers that may warm up at once on one machine, across its TaskManagers (None: one per
    # core; 0: no limit): more JVMs warming up together than cores each take three times as long.
    warmup_concurrency: int | None = Field(None, ge=0)
    # The dispatcher refuses larger uploads with 413: bytes, or a size such as "500 MB".
    max_upload_bytes: int | str = 100 * 1024**2
    # Every service logs at this level (Python's names: DEBUG, INFO, WARNING, ...).
    log_level: str = "INFO"
    # This process's main log, served at /logs of its metrics port; None: the regular file its
    # stderr is redirected to, if any (shared/log_files.py).
    log_file: str | None = None
    # What the dispatcher will unpack or parse of an upload (services/dispatcher/guards/archive_bounds.py):
    # a 646 KB zip of a 300 MB .py took it to 1.85 GB. Bytes, or sizes such as "200 MB".
    max_artifact_uncompressed_bytes: int | str = 200 * 1024**2
    max_artifact_members: int = Field(10_000, ge=1)
    max_artifact_source_bytes: int | str = 10 * 1024**2
    # Slow clients (services/dispatcher/guards/slow_clients.py): 408 and the connection closed.
    request_header_timeout_s: float = Field(10.0, gt=0)
    request_body_idle_timeout_s: float = Field(15.0, gt=0)
    request_body_timeout_s: float = Field(300.0, gt=0)
    # How long the dispatcher serves one encoded answer of GET /jobs/overview before building it
    # again (services/dispatcher/views/overview_cache.py): it may lag the catalog by this much, except
    # after this dispatcher's own submissions. 0: built on every request.
    overview_cache_ms: int = Field(
        1000, ge=0, description="GET /jobs/overview is rebuilt at most this often (milliseconds; 0: on every request)"
    )

    restart_strategy: dict[str, Any] = Field(
        default_factory=lambda: {"type": "fixed-delay", "attempts": 3, "delay": 1.0},
        description="cluster default; a submission may override it",
    )
    max_attempts_history: int = 16
    exception_history_size: int = 16

    taskmanager_slots: int = 2
    taskmanager_cores: float = Field(default_factory=lambda: float(os.cpu_count() or 1))
    taskmanager_memory_bytes: int = 8 * 1024**3
    warm_drivers: int = Field(1, description="warm Spark drivers each TaskManager keeps ready")
    # local[N] of the warm drivers; None: the TaskManager's slots, so that with the local engine
    # one warm driver serves a task of any parallelism the TaskManager can hold (drivers/warm_pool.py).
    warm_parallelism: int | None = Field(None, ge=1, description="parallelism of warm drivers (default: slots)")
    # Off: a warm driver in reserve is a started JVM and SparkSession only, about half of a full
    # warm-up's CPU; the task that takes it pays the rest in its first batches (docs/benchmarks.md).
    warm_up_query: bool = Field(True, description="warm drivers run a small query before they report ready")
    # Its micro-batches: enough that the JIT has compiled what every micro-batch runs, so a task's
    # first minute runs at the pace of its later ones (services/taskmanager/runtime/warm_up.py).
    warm_up_batches: int = Field(WARM_UP_BATCHES, ge=1, description="micro-batches of the warm-up query")
    driver_memory: str = "1g"
    # Named for the RSS it was once compared with; compared with the PSS summed over the driver's
    # processes since issue 42, like a task's memory limit (services/taskmanager/memory/limit.py).
    warm_driver_max_rss_bytes: int = Field(
        2 * 1024**3, description="a warm driver whose processes hold more (PSS summed) is discarded"
    )
    # The driver sandbox (services/taskmanager/drivers/user.py, drivers/task_processes.py, memory/limit.py).
    driver_user: str = Field(
        "headrace-driver",
        description="the Spark drivers run as users of their own, "
        "<driver_user>-0..N-1, in the group <driver_user> (the "
        'TaskManager must be root); "": its own user, no '
        "isolation",
    )
    # Every running driver and restore-check planner of the machine holds one (shared/sandbox_users.py).
    driver_users: int = Field(
        32, ge=1, description="how many users the drivers of this machine take in turn (scripts/bootstrap creates them)"
    )
    driver_memory_limit: str | None = Field(
        None,
        description="a task's processes above this (their PSS summed, "
        "or their cgroup's charge) are killed and the task "
        "fails; default driver_memory + 2g; off: none",
    )
    # A job's headrace.task.memory-limit is its author's: the operator's bound on it.
    driver_memory_limit_max: str | None = Field(
        None,
        description="the highest headrace.task.memory-limit a job "
        "may set; default: the larger of "
        "taskmanager_memory_bytes and the cluster's "
        'default limit; off: any, "off" included',
    )
    driver_log_max_bytes: int = Field(50 * 1024**2, ge=4096, description="a driver's log is rotated at this size")
    driver_log_backups: int = Field(3, ge=1, description="rotated driver log files kept")
    driver_cgroups: bool = Field(True, description="a cgroup v2 per driver where this process can create one")
    pipeline_redis_keys: Literal["connectors", "shared", "declared"] = Field(
        "connectors",
        description="connectors: a job that declares no Redis keys (headrace.redis.keys.read/.write) reaches "
        "the streams its Redis sources read and its sinks write, each written by one lineage at a time; "
        "shared: such a job reaches every data key; declared: every job must declare its keys and reaches "
        "only those",
    )
    pipeline_catalog_url: str | None = Field(
        None,
        description="the database a pipeline's SQL sources and sinks use by default (ctx.catalog_url); "
        "never the control catalog; none: a pipeline must name its database",
    )
    pipeline_databases_dir: Path | None = Field(
        None,
        description="without pipeline_catalog_url: each lineage's SQLite database of its own, "
        "<dir>/<lineage>/pipelines.db, reachable only by the driver running its task (headrace up sets "
        "it to $HEADRACE_HOME/pipelines); none: a pipeline must name its database",
    )
    pipeline_kafka_bootstrap_servers: str | None = Field(
        None,
        description="the Kafka brokers (host:port[,host:port]) a pipeline gets by default "
        "(ctx.kafka_bootstrap_servers; per job kafka_bootstrap_servers); headrace up --kafka sets "
        "it to its broker",
    )
    spark_shuffle_partitions: int = 4
    # A class-data-sharing archive of the Spark driver JVM's classes, built once per machine and
    # JDK/PySpark version (services/taskmanager/runtime/class_archive.py): drivers start ~2 s
    # faster. Outside HEADRACE_HOME so that every cluster on the machine shares it; off: false.
    driver_class_archive: bool = Field(True, description="share the driver JVM's classes through an AppCDS archive")
    driver_class_archive_dir: Path = Field(
        default_factory=lambda: Path.home() / ".cache" / "headrace" / "cds",
        description="where the driver class archive is kept",
    )
    # Jars from Maven Central (shared/jars.py), fetched by scripts/bootstrap: never at run time.
    jar_cache_dir: Path = Field(
        default_factory=lambda: jars.DEFAULT_CACHE_DIR,
        description="where scripts/bootstrap put the Kafka, Delta and broker jars",
    )
    # The dispatcher keeps one restore-check planner warm from its start (a JVM of a few hundred MB,
    # started at the lowest CPU priority; services/dispatcher/submission/warm_planner.py): a changed pipeline is
    # checked in about a second instead of a cold Spark's 6-15 s, the first upgrade too. Off: false.
    warm_planner: bool = Field(True, description="keep one restore-check planner warm from the dispatcher's start")
    # A fork server per local driver with PySpark and the connectors imported, which starts the
    # Python process Spark spawns per streaming query of a Python source (~0.5 s sooner:
    # services/taskmanager/runtime/python_forkserver.py). ~45 MB per driver; off: false.
    driver_python_forkserver: bool = Field(
        True, description="fork Spark's per-query Python source runner from a preloaded process"
    )
    # Each task's Spark UI on a free port, linked from the dashboard (sparkUi of
    # GET /jobs/{id}/progress). Off by default: a UI per driver costs memory on a small machine.
    spark_ui: bool = Field(False, description="run the Spark UI in each task's driver (HEADRACE_SPARK_UI)")
    # Where the tasks' drivers send their work: `local` runs it inside the driver (local[p]); a
    # Spark standalone master URL gives each task executors on that cluster's workers, p cores
    # in all (spark.cores.max), allocated while the task runs (docs/architecture.md, "Spark clusters").
    spark_master: str = Field("local", description="local, or spark://host:port[,host:port] (standalone)")
    spark_executor_cores: int = Field(1, ge=1, description="cores per executor (a job may set spark.executor.cores)")
    spark_executor_memory: str = Field("1g", description="heap per executor (a job may set spark.executor.memory)")
    spark_master_ui: str | None = Field(None, description="the Spark master's web UI, linked from the dashboard")

    checkpointing: dict[str, Any] = Field(
        default_factory=lambda: {"execution.checkpointing.interval": "10 s"},
        description="cluster default of the checkpoint options, with Flink's names (see shared/checkpointing.py); "
        "a job's own configuration overrides each of them",
    )
    savepoint_dir: Path | None = Field(None, description="default target of savepoints (state.savepoints.dir)")
    # Directories a savepoint may be written to, restored from or disposed of, and a job's own
    # state.checkpoints.dir may name (shared/storage_roots.py); the services write there as
    # their own user, so a REST caller must not be able to point them at /etc.
    storage_roots: CommaSeparated = Field(
        None,
        description="allowed roots of savepoint targets, restore paths and per-job checkpoint "
        "directories, comma-separated (YAML: a list); always includes the checkpoint and "
        "savepoint dirs",
    )

    stream_maxlen: int = 100_000

    # Message authentication (shared/message_auth.py, docs/runbooks/auth.md "Signed messages").
    cluster_secret: str | None = Field(
        None,
        description="hex; control plane only (JobManager, ResourceManager, dispatcher): every key is derived "
        "from it. Default: $HEADRACE_HOME/secrets/cluster-secret, created 0600 on first use",
    )
    taskmanager_key: str | None = Field(
        None,
        description="hex: this TaskManager's sender key (headrace credentials taskmanager ID); default: "
        "derived from the cluster secret file if this process can read it",
    )
    taskmanager_command_key: str | None = Field(
        None,
        description="hex: the key this TaskManager checks the JobManager's commands with; default as taskmanager_key",
    )

    # `headrace up --kafka`: one Kafka broker in KRaft mode beside the cluster, its data in
    # $HEADRACE_HOME/kafka (services/cluster/kafka_broker.py, docs/runbooks/kafka-broker.md).
    kafka_port: int = Field(9092, ge=1, le=65535, description="headrace up --kafka: the broker's client port")
    kafka_controller_port: int = Field(
        0, ge=0, le=65535, description="headrace up --kafka: the broker's KRaft controller port (0: a free one)"
    )

    high_availability: Literal["none", "zookeeper"] = Field(
        "none", description="none: one JobManager (standalone); zookeeper: leader election among several"
    )
    zookeeper_quorum: str | None = Field(None, description="host:port[,host:port...]")
    zookeeper_root: str = "/headrace"
    zookeeper_session_timeout_s: float = Field(
        10.0, description="a dead leader is replaced after this; a shorter one risks revocations on hiccups"
    )

    @model_validator(mode="after")
    def _check(self) -> "Settings":
        settings_rules.check(self)  # the rules between settings
        return self

    @classmethod
    def settings_customise_sources(
        cls, settings_cls, init_settings, env_settings, dotenv_settings, file_secret_settings
    ):
        return (init_settings, env_settings, _YamlSource(settings_cls, os.environ.get("HEADRACE_CONFIG")))

    # Derived locations (shared/state_locations.py): changing `home` moves them all.
    checkpoints: ClassVar[UnderHome] = UnderHome("checkpoint_dir", "checkpoints")
    savepoints: ClassVar[UnderHome] = UnderHome("savepoint_dir", "savepoints")
    lake: ClassVar[UnderHome] = UnderHome("lake_dir", "lake")
    artifacts: ClassVar[UnderHome] = UnderHome("artifact_dir", "artifacts")
    workdir: ClassVar[UnderHome] = UnderHome(None, "work")

    @property
    def catalog(self) -> str:
        return self.catalog_url or f"sqlite:///{self.home / 'catalog.db'}"


def load_settings(**overrides: Any) -> Settings:
    return Settings(**{k: v for k, v in overrides.items() if v is not None})
