"""/jars: upload, list, delete and run job artifacts (Flink's jar endpoints; our "jars" are
Python modules or zips of them)."""

from __future__ import annotations

import logging
import shlex
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Body, File, Query, Request, UploadFile
from sqlalchemy.exc import IntegrityError

from services.dispatcher import artifacts, checkpoint_dir_option, entry_check, limits, restore, restore_check, views
from services.dispatcher.archive_bounds import ArtifactLimits
from services.dispatcher.deps import (
    ArtifactLimitsDep,
    CatalogDep,
    DefaultRestartDep,
    MaxUploadDep,
    OverviewCacheDep,
    SessionDep,
    SettingsDep,
    TransportDep,
    WarmPlannerDep,
)
from services.dispatcher.errors import ApiError, Problem, error_responses, short_value
from services.dispatcher.schemas import (
    EntryName,
    ErrorBody,
    JarListInfo,
    JarRunRequest,
    JarRunResponse,
    JarUploadResponse,
    Parallelism,
    stored_restart_strategy,
)
from services.dispatcher.schemas.jars import (
    MAX_PROGRAM_ARG_CHARS,
    MAX_PROGRAM_ARGS,
    MAX_PROGRAM_ARGS_CHARS,
    program_args_problem,
)
from services.dispatcher.strict_fields import StrictBool
from services.dispatcher.warm_planner import WarmPlanner
from shared import checkpointing, kafka_delivery
from shared import job_options as job_config
from shared.catalog import repository
from shared.catalog.models import Artifact
from shared.catalog.repository import NotFound
from shared.catalog.repository.deployments import deployments_using
from shared.ids import ArtifactId, JobId, new_artifact_id, new_job_id
from shared.messages import SubmitJob
from shared.restart import InvalidRestartStrategy
from shared.settings import Settings
from shared.states import JobStatus
from shared.streams import JM_STREAM

log = logging.getLogger(__name__)
router = APIRouter(prefix="/jars", tags=["jars"])
_ERRORS = error_responses(400, 404, 409,
                          described={503: "the catalog is unreachable; retry after Retry-After seconds"})
_LIVE = [s for s in JobStatus if not s.is_terminal]


def unknown_jar(jarid: str) -> ApiError:
    return ApiError.of(404, f"jar {jarid} not found", field="jarid", expected="the id of an uploaded jar",
                       hint="GET /jars lists the uploaded jars; POST /jars/upload adds one", prefix=False)


@router.post("/upload", response_model=JarUploadResponse,
             responses={**_ERRORS, 413: {"model": ErrorBody, "description": "above the upload limit, or an archive "
                                                                            "that unpacks to more than its limits"}},
             summary="Upload a job: a .py module or a .zip of .py files")
def upload_jar(
    jarfile: Annotated[UploadFile, File(description="a .py module (entry function `build`) or a .zip of .py files")],
    settings: SettingsDep,
    catalog: CatalogDep,
    max_bytes: MaxUploadDep,
    bounds: ArtifactLimitsDep,
) -> dict:
    name = artifacts.safe_filename(jarfile.filename)
    # The body limit (limits.BodyLimit) already stopped anything much larger before it was parsed.
    if jarfile.size is not None and jarfile.size > max_bytes:
        raise ApiError(413, [limits.upload_too_large(max_bytes, got=jarfile.size)])
    try:
        artifacts.check_suffix(name)
    except artifacts.ArtifactRejected as exc:
        raise _rejected(exc) from None
    artifact_id = new_artifact_id(name)
    # Copied to disk and checked there: never the whole upload, nor a whole member, in memory.
    tmp, size, sha256 = artifacts.receive(jarfile.file, settings.artifacts, artifact_id, max_bytes)
    try:
        if size > max_bytes:
            raise ApiError(413, [limits.upload_too_large(max_bytes)])
        try:
            checked = artifacts.check_file(name, tmp, size, sha256, bounds)
        except artifacts.ArtifactRejected as exc:
            raise _rejected(exc) from None
        path = artifacts.commit(tmp, settings.artifacts, artifact_id)
    except BaseException:
        artifacts.remove(tmp)
        raise
    try:
        with catalog.session() as s:
            row = repository.create_artifact(s, id=artifact_id, name=name, path=str(path), size=checked.size,
                                             sha256=checked.sha256)
            row.listing = artifacts.listing(checked)
    except BaseException:  # the catalog is away, or anything else: no file without its row
        artifacts.remove(path)
        raise
    log.info("stored artifact %s (%s, %d bytes)", artifact_id, name, checked.size)
    return {"filename": str(path), "status": "success", "id": artifact_id}


def _rejected(exc: artifacts.ArtifactRejected) -> ApiError:
    extra: dict = {"line": exc.line} if exc.line is not None else {}
    if exc.member:
        extra["member"] = exc.member
    if exc.status == 413 and exc.setting is not None:
        extra.update(setting=exc.setting, limit=exc.limit)
        return ApiError.of(413, str(exc), field="jarfile", expected=f"an artifact within {exc.setting}",
                           hint=f"shrink the artifact, or raise {exc.setting} (HEADRACE_{exc.setting.upper()}) "
                                f"and restart the dispatcher", prefix=False, **extra)
    return ApiError.of(400, str(exc), field="jarfile",
                       expected="a .py module that compiles, or a .zip archive of .py files that compile",
                       hint="fix the file and upload it again", prefix=False, **extra)


@router.get("", response_model=JarListInfo, summary="List uploaded jobs, newest first")
def list_jars(request: Request, session: SessionDep, catalog: CatalogDep) -> dict:
    """From the catalog alone: what an artifact offers was recorded at its upload."""
    files = []
    for art in reversed(repository.list_artifacts(session)):
        listed = art.listing if art.listing is not None else _backfill_listing(catalog, art)
        files.append(views.jar_file(art, listed.get("functions")))
    return {"address": str(request.base_url).rstrip("/"), "files": files}


def _listing(catalog, art: Artifact) -> dict:
    return art.listing if art.listing is not None else _backfill_listing(catalog, art)


def _backfill_listing(catalog, art: Artifact) -> dict:
    """An artifact uploaded before listings were kept: parse its file this once and store it."""
    listed = artifacts.listing_of_file(Path(art.path))
    with catalog.session() as s:
        row = s.get(Artifact, art.id)
        if row is not None and row.listing is None:
            row.listing = listed
    log.info("recorded the listing of artifact %s (uploaded before listings were kept)", art.id)
    return listed


@router.delete("/{jarid}", responses=_ERRORS, summary="Delete an uploaded job (not while a live job uses it)")
def delete_jar(jarid: str, settings: SettingsDep, catalog: CatalogDep) -> dict:
    with catalog.session() as s:
        try:
            art = repository.get_artifact(s, ArtifactId(jarid))
        except NotFound:
            raise unknown_jar(jarid) from None
        users = [j.id for j in repository.list_jobs(s, statuses=_LIVE) if j.artifact_id == jarid]
        if users:
            raise ApiError.of(409, f"jar {jarid} is used by job(s) that have not finished: {', '.join(users)}",
                              field="jarid", expected="a jar no live job uses",
                              hint="cancel those jobs (PATCH /jobs/{jobid}?mode=cancel) or wait for them to end",
                              prefix=False)
        schedules = [sc.id for sc in repository.list_schedules(s) if sc.artifact_id == jarid]
        if schedules:
            # Its schedules would only record skipped runs from now on.
            raise ApiError.of(409, f"jar {jarid} is used by schedule(s) {', '.join(schedules)}", field="jarid",
                              expected="a jar no schedule uses",
                              hint="delete those schedules first (DELETE /jobs/schedules/{id}, "
                                   "headrace schedule delete ID)", prefix=False)
        deployed = deployments_using(s, jarid)
        if deployed:
            # A rollback or a restart of a kept generation would find no pipeline to run.
            raise ApiError.of(409, f"jar {jarid} is used by deployment(s) {', '.join(deployed)}", field="jarid",
                              expected="a jar no generation of a deployment uses",
                              hint="delete those deployments first (DELETE /deployments/{name}, "
                                   "headrace deploy delete NAME)", prefix=False)
        path = Path(art.path)
        repository.delete_artifact(s, ArtifactId(jarid))
    if _inside(path, settings.artifacts):
        artifacts.remove(path)
    return {}


def _inside(path: Path, directory: Path) -> bool:
    try:
        return path.resolve().is_relative_to(directory.resolve())
    except OSError:
        return False


@router.post("/{jarid}/run", response_model=JarRunResponse, responses={**_ERRORS, 503: {"model": ErrorBody}},
             summary="Submit a job from an uploaded jar (optionally starting from a savepoint or checkpoint)")
def run_jar(
    jarid: str,
    settings: SettingsDep,
    catalog: CatalogDep,
    transport: TransportDep,
    default_restart: DefaultRestartDep,
    overview: OverviewCacheDep,
    bounds: ArtifactLimitsDep,
    warm: WarmPlannerDep,
    body: Annotated[JarRunRequest | None, Body(description="all fields optional")] = None,
    entry_class: Annotated[EntryName | None, Query(alias="entry-class", description="as entryClass")] = None,
    parallelism: Annotated[Parallelism | None, Query(description="as the body's parallelism")] = None,
    program_args: Annotated[str | None, Query(alias="program-args", description="as programArgs")] = None,
    program_arg: Annotated[str | None, Query(alias="programArg", description="comma-separated arguments")] = None,
    savepoint_path: Annotated[str | None, Query(alias="savepointPath", description="as the body's")] = None,
    allow_non_restored: Annotated[
        StrictBool | None, Query(alias="allowNonRestoredState", description="as the body's")
    ] = None,
) -> dict:
    """Body fields win over the query parameters of the same meaning (as in Flink)."""
    req = body or JarRunRequest()
    entry = req.entryClass or entry_class or artifacts.DEFAULT_ENTRY
    args = req.program_args()
    if args is None:
        args = _query_args(program_args, program_arg)
    config = {**(req.flinkConfiguration or {}), **(req.config or {})}
    check_config(config, settings)
    checkpoint_dir_option.check(config, settings)
    restart = resolve_restart_strategy(req.restartStrategy, config, default_restart)
    kind = req.kind or "pyspark"
    job_id = JobId(req.jobId) if req.jobId else new_job_id()

    with catalog.session() as s:
        try:
            art = repository.get_artifact(s, ArtifactId(jarid))
        except NotFound:
            raise unknown_jar(jarid) from None
    if kind == "pyspark":
        check_entry(catalog, art, entry, config, bounds)
    snapshot = restore.prepare(
        config, settings,
        savepoint_path=req.savepointPath if req.savepointPath is not None else savepoint_path,
        path_field="savepointPath",
        allow_non_restored=req.allowNonRestoredState if req.allowNonRestoredState is not None else allow_non_restored,
        mode=req.claimMode if req.claimMode is not None else req.restoreMode,
        mode_field="claimMode" if req.claimMode is not None else "restoreMode",
    )
    if snapshot is not None and kind == "pyspark":
        _check_restore(settings, art, entry=entry, args=args, config=config,
                       parallelism=req.parallelism or parallelism or 1, snapshot=snapshot, warm=warm)

    try:
        with catalog.session() as s:
            if req.jobId:
                try:
                    existing = repository.get_job(s, job_id)
                except NotFound:
                    existing = None
                if existing is not None:
                    raise _duplicate(job_id, existing.status)
            repository.create_job(
                s, id=job_id, name=req.jobName or Path(art.name).stem, artifact_id=art.id, entry=entry,
                parallelism=req.parallelism or parallelism or 1, program_args=args, config=config,
                restart_strategy=restart, kind=kind,
            )
    except IntegrityError:  # the same jobId submitted twice at once, or the jar deleted meanwhile
        with catalog.session() as s:
            try:
                existing = repository.get_job(s, job_id)
            except NotFound:
                raise unknown_jar(jarid) from None
        raise _duplicate(job_id, existing.status) from None
    # The next GET /jobs/overview is built afresh: a client that submits, then lists, sees its job.
    overview.invalidate()

    # Published only after the commit, so the JobManager always finds the row it is told about.
    try:
        transport.publish(JM_STREAM, SubmitJob(job_id=job_id))
    except Exception as exc:  # noqa: BLE001 - any transport failure
        _fail_unpublished(catalog, job_id, exc)
        overview.invalidate()
        raise ApiError.of(503, f"job {job_id} was not submitted: the JobManager stream is unreachable ({exc})",
                          hint="check that Redis is up (settings.redis_url) and submit again") from None
    log.info("submitted job %s from %s", job_id, jarid)
    return {"jobid": job_id}


def _check_restore(settings, art, *, entry: str, args: list[str], config: dict, parallelism: int, snapshot,
                   warm: WarmPlanner | None) -> None:
    """Refuse, before the job exists, a pipeline that Spark could not start from the snapshot
    (a changed grouping key, another source, another state partition count), instead of a task
    that fails minutes later and loops through its restarts."""
    try:
        restore_check.check_artifact(settings, art, entry=entry, args=args, config=config, parallelism=parallelism,
                                     snapshot_meta=snapshot.metadata, warm=warm)
    except restore_check.RestoreIncompatible as exc:
        raise ApiError.of(400, exc.message, field="savepointPath", expected="a snapshot this pipeline can restore",
                          got=snapshot.path, hint=exc.hint or "start the job without a savepoint",
                          prefix=False) from None


def _query_args(program_args: str | None, program_arg: str | None) -> list[str]:
    args: list[str] = []
    if program_arg:
        args = [a for a in program_arg.split(",") if a]
    elif program_args:
        try:
            args = shlex.split(program_args)
        except ValueError as exc:
            raise ApiError.of(400, f"cannot be split into arguments: {exc}", field="program-args",
                              expected="a shell-quoted argument string", got=program_args) from None
    problem = program_args_problem(args)
    if problem is not None:
        raise ApiError.of(400, problem, field="program-args",
                          expected=f"at most {MAX_PROGRAM_ARGS} arguments of at most {MAX_PROGRAM_ARG_CHARS} "
                                   f"characters, {MAX_PROGRAM_ARGS_CHARS} in all", prefix=False)
    return args


def _duplicate(job_id: str, status: str) -> ApiError:
    return ApiError.of(409, f"a job with id {job_id} already exists (state {status})", field="jobId",
                       expected="an id no other job has", hint="leave jobId out to have one generated",
                       prefix=False)


def resolve_restart_strategy(requested, config: dict, default: dict) -> dict:
    """The request's restartStrategy, else Flink's restart-strategy.* options in its configuration,
    else the cluster default; 400 for one that cannot be read."""
    try:
        if requested:
            return stored_restart_strategy(requested)
        return job_config.restart_strategy_from_config(config) or default
    except InvalidRestartStrategy as exc:
        raise ApiError.of(400, str(exc).split(": ", 1)[-1], field=exc.field, expected="a valid restart strategy",
                          hint="see the restart strategy schema at /docs") from None


def check_config(config: dict, settings: Settings) -> None:
    """Every option Headrace reads must be readable (job_config): 400 naming each bad one, its
    value and a good example, instead of a task that fails (or hangs) on a TaskManager."""
    found = job_config.problems(config)
    if found:
        raise ApiError(400, [Problem(p.message, field=p.option, expected=p.expected,
                                     got=short_value(p.value) if not p.missing else None,
                                     hint="options keep Flink's names and values: durations are strings such as "
                                          "\"10 s\", \"500 ms\" or \"2 min\" (without a unit: milliseconds)")
                             for p in found])
    check_kafka_transaction_timeout(config, settings)


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
        raise ApiError.of(400, problem, field=option, expected="a transaction timeout longer than a checkpoint "
                          "interval plus a minute", hint="see docs/runbooks/kafka.md", prefix=False)


def check_entry(catalog, art, entry: str, config: dict | None = None, bounds: ArtifactLimits | None = None) -> None:
    """400 unless `entry` is a function the driver can call in the artifact (entry_check.py)."""
    entry_check.check_entry(art, entry, config or {}, lambda: _listing(catalog, art), bounds or ArtifactLimits())


def _fail_unpublished(catalog, job_id: JobId, exc: Exception) -> None:
    reason = f"dispatcher could not publish SubmitJob: {type(exc).__name__}: {exc}"
    log.error("job %s: %s", job_id, reason)
    try:
        with catalog.session() as s:
            repository.transition_job(s, job_id, JobStatus.FAILED, reason=reason)
            repository.record_exception(s, job_id=job_id, exception_name=type(exc).__name__, stacktrace=reason)
    except Exception:  # the JobManager may already own the job
        log.exception("job %s: could not mark the unpublished submission failed", job_id)
