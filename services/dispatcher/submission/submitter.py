"""Submitting a job, the one way every route does it (`POST /jars/{id}/run`; schedules and
deployments reuse its checks): validate the options, the restart strategy and the entry function,
check that the pipeline can start from the snapshot it restores (before the job exists), create
the job row, then publish SubmitJob, failing the job if the JobManager cannot be told.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.exc import IntegrityError

from services.dispatcher.errors import ApiError, Problem, short_value
from services.dispatcher.guards.archive_bounds import ArtifactLimits
from services.dispatcher.schemas import stored_restart_strategy
from services.dispatcher.submission import (
    artifacts,
    checkpoint_dir_option,
    entry_check,
    redis_key_writers,
    restore,
    restore_check,
)
from services.dispatcher.submission.warm_planner import WarmPlanner
from services.dispatcher.views.overview_cache import OverviewCache
from shared import checkpointing, kafka_delivery, redis_key_grants
from shared import job_options as job_config
from shared.catalog import Catalog, repository
from shared.catalog.repository import NotFound
from shared.ids import ArtifactId, JobId, new_job_id
from shared.job_lineage import Lineages
from shared.messages import SubmitJob
from shared.restart import InvalidRestartStrategy
from shared.settings import Settings
from shared.states import JobStatus
from shared.streams import JM_STREAM
from shared.transport.base import Transport

log = logging.getLogger("headrace.dispatcher")


@dataclass(frozen=True)
class Request:
    """What a submission asks for, its fields already taken from the body or the query."""

    jarid: str
    entry: str
    args: list[str]
    config: dict
    parallelism: int = 1
    restart: object = None  # the request's restartStrategy, if any
    kind: str = "pyspark"
    job_id: str | None = None
    name: str | None = None
    savepoint_path: str | None = None
    allow_non_restored: bool | None = None
    mode: str | None = None
    mode_field: str = "restoreMode"


@dataclass(frozen=True)
class Submitter:
    settings: Settings
    catalog: Catalog
    transport: Transport
    default_restart: dict
    overview: OverviewCache  # invalidated: a client that submits, then lists, sees its job
    bounds: ArtifactLimits
    warm: WarmPlanner | None = None

    def submit(self, req: Request) -> JobId:
        """The new job's id; ApiError (4xx, 503) for what cannot be submitted, nothing created."""
        settings, catalog = self.settings, self.catalog
        check_config(req.config, settings)
        checkpoint_dir_option.check(req.config, settings)
        restart = resolve_restart_strategy(req.restart, req.config, self.default_restart)
        job_id = JobId(req.job_id) if req.job_id else new_job_id()
        with catalog.session() as s:
            try:
                art = repository.get_artifact(s, ArtifactId(req.jarid))
            except NotFound:
                raise unknown_jar(req.jarid) from None
        if req.kind == "pyspark":
            check_entry(catalog, art, req.entry, req.config, self.bounds)
        snapshot = restore.prepare(
            req.config,
            settings,
            savepoint_path=req.savepoint_path,
            path_field="savepointPath",
            allow_non_restored=req.allow_non_restored,
            mode=req.mode,
            mode_field=req.mode_field,
        )
        lineage = self._continued_lineage(snapshot.path, job_id) if snapshot is not None else None
        redis_key_writers.check_no_other_writer(catalog, req.config, lineage)
        if snapshot is not None and req.kind == "pyspark":
            _check_restore(
                settings,
                art,
                entry=req.entry,
                args=req.args,
                config=req.config,
                parallelism=req.parallelism,
                snapshot=snapshot,
                warm=self.warm,
                lineage=lineage,
            )
        self._create(req, job_id, art, restart)
        self.overview.invalidate()
        # Published only after the commit, so the JobManager always finds the row it is told about.
        try:
            self.transport.publish(JM_STREAM, SubmitJob(job_id=job_id))
        except Exception as exc:  # noqa: BLE001 - any transport failure
            _fail_unpublished(catalog, job_id, exc)
            self.overview.invalidate()
            raise ApiError.of(
                503,
                f"job {job_id} was not submitted: the JobManager stream is unreachable ({exc})",
                hint="check that Redis is up (settings.redis_url) and submit again",
            ) from None
        log.info("submitted job %s from %s", job_id, req.jarid)
        return job_id

    def _continued_lineage(self, snapshot_path: str, job_id: JobId) -> str | None:
        """The lineage the job continues by restoring `snapshot_path` (shared/job_lineage.py)."""
        with self.catalog.session() as s:
            return Lineages().continued(s, snapshot_path, job_id)

    def _create(self, req: Request, job_id: JobId, art, restart: dict) -> None:
        catalog = self.catalog
        try:
            with catalog.session() as s:
                if req.job_id:
                    try:
                        existing = repository.get_job(s, job_id)
                    except NotFound:
                        existing = None
                    if existing is not None:
                        raise _duplicate(job_id, existing.status)
                repository.create_job(
                    s,
                    id=job_id,
                    name=req.name or Path(art.name).stem,
                    artifact_id=art.id,
                    entry=req.entry,
                    parallelism=req.parallelism,
                    program_args=req.args,
                    config=req.config,
                    restart_strategy=restart,
                    kind=req.kind,
                )
        except IntegrityError:  # the same jobId submitted twice at once, or the jar deleted meanwhile
            with catalog.session() as s:
                try:
                    existing = repository.get_job(s, job_id)
                except NotFound:
                    raise unknown_jar(req.jarid) from None
            raise _duplicate(job_id, existing.status) from None


def unknown_jar(jarid: str) -> ApiError:
    return ApiError.of(
        404,
        f"jar {jarid} not found",
        field="jarid",
        expected="the id of an uploaded jar",
        hint="GET /jars lists the uploaded jars; POST /jars/upload adds one",
        prefix=False,
    )


def _check_restore(
    settings,
    art,
    *,
    entry: str,
    args: list[str],
    config: dict,
    parallelism: int,
    snapshot,
    warm: WarmPlanner | None,
    lineage: str | None,
) -> None:
    """Refuse, before the job exists, a pipeline that Spark could not start from the snapshot
    (a changed grouping key, another source, another state partition count), instead of a task
    that fails minutes later and loops through its restarts."""
    try:
        restore_check.check_artifact(
            settings,
            art,
            entry=entry,
            args=args,
            config=config,
            parallelism=parallelism,
            snapshot_meta=snapshot.metadata,
            warm=warm,
            lineage=lineage,
        )
    except restore_check.RestoreIncompatible as exc:
        raise ApiError.of(
            400,
            exc.message,
            field="savepointPath",
            expected="a snapshot this pipeline can restore",
            got=snapshot.path,
            hint=exc.hint or "start the job without a savepoint",
            prefix=False,
        ) from None


def _duplicate(job_id: str, status: str) -> ApiError:
    return ApiError.of(
        409,
        f"a job with id {job_id} already exists (state {status})",
        field="jobId",
        expected="an id no other job has",
        hint="leave jobId out to have one generated",
        prefix=False,
    )


def resolve_restart_strategy(requested, config: dict, default: dict) -> dict:
    """The request's restartStrategy, else Flink's restart-strategy.* options in its configuration,
    else the cluster default; 400 for one that cannot be read."""
    try:
        if requested:
            return stored_restart_strategy(requested)
        return job_config.restart_strategy_from_config(config) or default
    except InvalidRestartStrategy as exc:
        raise ApiError.of(
            400,
            str(exc).split(": ", 1)[-1],
            field=exc.field,
            expected="a valid restart strategy",
            hint="see the restart strategy schema at /docs",
        ) from None


def check_config(config: dict, settings: Settings) -> None:
    """Every option Headrace reads must be readable (job_config): 400 naming each bad one, its
    value and a good example, instead of a task that fails (or hangs) on a TaskManager."""
    found = job_config.problems(config)
    if found:
        raise ApiError(
            400,
            [
                Problem(
                    p.message,
                    field=p.option,
                    expected=p.expected,
                    got=short_value(p.value) if not p.missing else None,
                    hint="options keep Flink's names and values: durations are strings such as "
                    '"10 s", "500 ms" or "2 min" (without a unit: milliseconds)',
                )
                for p in found
            ],
        )
    check_kafka_transaction_timeout(config, settings)
    undeclared = redis_key_grants.undeclared_problem(config, settings.pipeline_redis_keys)
    if undeclared:
        raise ApiError.of(
            400,
            undeclared,
            field=redis_key_grants.WRITE_OPTION,
            expected=redis_key_grants.EXPECTED,
            hint='see docs/runbooks/auth.md, "Redis users"',
            prefix=False,
        )


def check_kafka_transaction_timeout(config: dict, settings: Settings) -> None:
    """400 when the job sets an exactly-once Kafka sinks' transaction timeout its checkpoints
    cannot keep within (the brokers' maximum is checked when the task starts: only it knows them)."""
    option = kafka_delivery.TRANSACTION_TIMEOUT_OPTION
    if option not in config:
        return
    timeout_s = job_config.duration_s(config[option], positive=True)
    try:
        interval_s = checkpointing.checkpoint_config(config, settings.checkpointing).interval_s
    except checkpointing.InvalidCheckpointConfig:
        return  # reported with the checkpoint options themselves
    problem = kafka_delivery.timeout_problem(timeout_s, interval_s)
    if problem is not None:
        raise ApiError.of(
            400,
            problem,
            field=option,
            expected="a transaction timeout longer than a checkpoint interval plus a minute",
            hint="see docs/runbooks/kafka.md",
            prefix=False,
        )


def check_entry(catalog, art, entry: str, config: dict | None = None, bounds: ArtifactLimits | None = None) -> None:
    """400 unless `entry` is a function the driver can call in the artifact (submission/entry_check.py)."""
    entry_check.check_entry(
        art, entry, config or {}, lambda: artifacts.stored_listing(catalog, art), bounds or ArtifactLimits()
    )


def _fail_unpublished(catalog, job_id: JobId, exc: Exception) -> None:
    reason = f"dispatcher could not publish SubmitJob: {type(exc).__name__}: {exc}"
    log.error("job %s: %s", job_id, reason)
    try:
        with catalog.session() as s:
            repository.transition_job(s, job_id, JobStatus.FAILED, reason=reason)
            repository.record_exception(s, job_id=job_id, exception_name=type(exc).__name__, stacktrace=reason)
    except Exception:  # the JobManager may already own the job
        log.exception("job %s: could not mark the unpublished submission failed", job_id)
