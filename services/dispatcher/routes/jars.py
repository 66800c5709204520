"""/jars: upload, list, delete and run job artifacts (Flink's jar endpoints; our "jars" are
Python modules or zips of them)."""

from __future__ import annotations

import logging
import shlex
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Body, File, Query, Request, UploadFile

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
from services.dispatcher.errors import ApiError, error_responses
from services.dispatcher.guards import limits
from services.dispatcher.guards.strict_fields import StrictBool
from services.dispatcher.schemas import (
    EntryName,
    ErrorBody,
    JarListInfo,
    JarRunRequest,
    JarRunResponse,
    JarUploadResponse,
    Parallelism,
)
from services.dispatcher.schemas.jars import (
    MAX_PROGRAM_ARG_CHARS,
    MAX_PROGRAM_ARGS,
    MAX_PROGRAM_ARGS_CHARS,
    program_args_problem,
)
from services.dispatcher.submission import artifacts, submitter
from services.dispatcher.views import shapes
from shared.catalog import repository
from shared.catalog.repository import NotFound
from shared.catalog.repository.deployments import deployments_using
from shared.ids import ArtifactId, new_artifact_id
from shared.states import JobStatus

log = logging.getLogger(__name__)
router = APIRouter(prefix="/jars", tags=["jars"])
_ERRORS = error_responses(400, 404, 409, described={503: "the catalog is unreachable; retry after Retry-After seconds"})
_LIVE = [s for s in JobStatus if not s.is_terminal]


@router.post(
    "/upload",
    response_model=JarUploadResponse,
    responses={
        **_ERRORS,
        413: {
            "model": ErrorBody,
            "description": "above the upload limit, or an archive that unpacks to more than its limits",
        },
    },
    summary="Upload a job: a .py module or a .zip of .py files",
)
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
            row = repository.create_artifact(
                s, id=artifact_id, name=name, path=str(path), size=checked.size, sha256=checked.sha256
            )
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
        return ApiError.of(
            413,
            str(exc),
            field="jarfile",
            expected=f"an artifact within {exc.setting}",
            hint=f"shrink the artifact, or raise {exc.setting} (HEADRACE_{exc.setting.upper()}) "
            f"and restart the dispatcher",
            prefix=False,
            **extra,
        )
    return ApiError.of(
        400,
        str(exc),
        field="jarfile",
        expected="a .py module that compiles, or a .zip archive of .py files that compile",
        hint="fix the file and upload it again",
        prefix=False,
        **extra,
    )


@router.get("", response_model=JarListInfo, summary="List uploaded jobs, newest first")
def list_jars(request: Request, session: SessionDep, catalog: CatalogDep) -> dict:
    """From the catalog alone: what an artifact offers was recorded at its upload."""
    files = []
    for art in reversed(repository.list_artifacts(session)):
        listed = artifacts.stored_listing(catalog, art)
        files.append(shapes.jar_file(art, listed.get("functions")))
    return {"address": str(request.base_url).rstrip("/"), "files": files}


@router.delete("/{jarid}", responses=_ERRORS, summary="Delete an uploaded job (not while a live job uses it)")
def delete_jar(jarid: str, settings: SettingsDep, catalog: CatalogDep) -> dict:
    with catalog.session() as s:
        try:
            art = repository.get_artifact(s, ArtifactId(jarid))
        except NotFound:
            raise submitter.unknown_jar(jarid) from None
        users = [j.id for j in repository.list_jobs(s, statuses=_LIVE) if j.artifact_id == jarid]
        if users:
            raise ApiError.of(
                409,
                f"jar {jarid} is used by job(s) that have not finished: {', '.join(users)}",
                field="jarid",
                expected="a jar no live job uses",
                hint="cancel those jobs (PATCH /jobs/{jobid}?mode=cancel) or wait for them to end",
                prefix=False,
            )
        schedules = [sc.id for sc in repository.list_schedules(s) if sc.artifact_id == jarid]
        if schedules:
            # Its schedules would only record skipped runs from now on.
            raise ApiError.of(
                409,
                f"jar {jarid} is used by schedule(s) {', '.join(schedules)}",
                field="jarid",
                expected="a jar no schedule uses",
                hint="delete those schedules first (DELETE /jobs/schedules/{id}, headrace schedule delete ID)",
                prefix=False,
            )
        deployed = deployments_using(s, jarid)
        if deployed:
            # A rollback or a restart of a kept generation would find no pipeline to run.
            raise ApiError.of(
                409,
                f"jar {jarid} is used by deployment(s) {', '.join(deployed)}",
                field="jarid",
                expected="a jar no generation of a deployment uses",
                hint="delete those deployments first (DELETE /deployments/{name}, headrace deploy delete NAME)",
                prefix=False,
            )
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


@router.post(
    "/{jarid}/run",
    response_model=JarRunResponse,
    responses={**_ERRORS, 503: {"model": ErrorBody}},
    summary="Submit a job from an uploaded jar (optionally starting from a savepoint or checkpoint)",
)
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
    args = req.program_args()
    if args is None:
        args = _query_args(program_args, program_arg)
    request = submitter.Request(
        jarid=jarid,
        entry=req.entryClass or entry_class or artifacts.DEFAULT_ENTRY,
        args=args,
        config={**(req.flinkConfiguration or {}), **(req.config or {})},
        parallelism=req.parallelism or parallelism or 1,
        restart=req.restartStrategy,
        kind=req.kind or "pyspark",
        job_id=req.jobId,
        name=req.jobName,
        savepoint_path=req.savepointPath if req.savepointPath is not None else savepoint_path,
        allow_non_restored=req.allowNonRestoredState if req.allowNonRestoredState is not None else allow_non_restored,
        mode=req.claimMode if req.claimMode is not None else req.restoreMode,
        mode_field="claimMode" if req.claimMode is not None else "restoreMode",
    )
    job_id = submitter.Submitter(settings, catalog, transport, default_restart, overview, bounds, warm).submit(request)
    return {"jobid": job_id}


def _query_args(program_args: str | None, program_arg: str | None) -> list[str]:
    args: list[str] = []
    if program_arg:
        args = [a for a in program_arg.split(",") if a]
    elif program_args:
        try:
            args = shlex.split(program_args)
        except ValueError as exc:
            raise ApiError.of(
                400,
                f"cannot be split into arguments: {exc}",
                field="program-args",
                expected="a shell-quoted argument string",
                got=program_args,
            ) from None
    problem = program_args_problem(args)
    if problem is not None:
        raise ApiError.of(
            400,
            problem,
            field="program-args",
            expected=f"at most {MAX_PROGRAM_ARGS} arguments of at most {MAX_PROGRAM_ARG_CHARS} "
            f"characters, {MAX_PROGRAM_ARGS_CHARS} in all",
            prefix=False,
        )
    return args
