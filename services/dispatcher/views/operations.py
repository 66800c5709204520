"""Flink's asynchronous operations (savepoint, stop, manual checkpoint, rescale, disposal) as
catalog `operations` rows: the trigger creates the row and commits before it asks the
JobManager, so a status poll always finds it; whoever carries the operation out finishes it.
A `triggerId` sent by the client is the operation's id, so the same trigger never runs twice."""

from __future__ import annotations

import logging
from typing import Any, Callable, Iterable

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from services.dispatcher.errors import ApiError
from services.dispatcher.views.checkpoints import operation_result
from shared.catalog import Catalog, repository
from shared.catalog.models import Job
from shared.catalog.repository import NotFound
from shared.ids import JobId, new_request_id
from shared.states import JobStatus, OperationStatus
from shared.streams import JM_STREAM
from shared.transport.base import Transport

log = logging.getLogger(__name__)

# What a trigger asks the JobManager to do, built from the job row and the operation's id.
Build = Callable[[Job, str], tuple[dict[str, Any], Any]]


def _plausible_id(value: str) -> bool:
    # Any string is a valid lookup; ones no row could have are answered without a query
    # (PostgreSQL refuses NUL bytes in text, which would otherwise be a 500).
    return bool(value) and len(value) <= 64 and not any(ord(c) < 32 for c in value)


def unknown_job(jobid: str) -> ApiError:
    return ApiError.of(
        404,
        f"job {jobid!r} not found",
        field="jobid",
        expected="the id of a submitted job",
        hint="GET /jobs lists the known job ids",
        prefix=False,
    )


def get_job(s: Session, jobid: str) -> Job:
    """The job, or a 404 in the shared error shape."""
    if not _plausible_id(jobid):
        raise unknown_job(jobid)
    try:
        return repository.get_job(s, JobId(jobid))
    except NotFound:
        raise unknown_job(jobid) from None


def live_job(s: Session, jobid: str, action: str) -> Job:
    """The job, if it can still act; 404 if unknown, 409 once it has reached a terminal state."""
    job = get_job(s, jobid)
    status = JobStatus(job.status)
    if status.is_terminal:
        raise ApiError.of(
            409,
            f"job {job.id} cannot {action}: it has already reached the terminal state {status.value}",
            field="jobid",
            expected="a job that has not finished, failed or been cancelled",
            got=status.value,
            hint="GET /jobs/{jobid}/checkpoints lists the snapshots it left behind",
            prefix=False,
        )
    return job


def trigger(
    catalog: Catalog,
    transport: Transport,
    *,
    jobid: str,
    kind: str,
    action: str,
    build: Build,
    trigger_id: str | None = None,
) -> str:
    """Create an operation of `kind` for a live job and publish what `build` returns to the
    JobManager stream. Returns the operation id (Flink's request-id). A transport failure fails
    the operation and answers 503."""
    with catalog.session() as s:
        job = live_job(s, jobid, action)
        if trigger_id is not None and (same := _existing(s, trigger_id, job.id, kind)) is not None:
            return same
        request_id = trigger_id or new_request_id()
        params, body = build(job, request_id)
        try:
            repository.create_operation(s, id=request_id, kind=kind, job_id=job.id, params=params)
        except IntegrityError:  # the same triggerId sent twice at once
            raise _trigger_id_taken(trigger_id or request_id) from None
    try:
        transport.publish(JM_STREAM, body)
    except Exception as exc:  # noqa: BLE001 - any transport failure
        reason = f"the dispatcher could not publish {type(body).__name__}: {type(exc).__name__}: {exc}"
        finish(catalog, request_id, OperationStatus.FAILED, failure_cause=reason)
        raise ApiError.of(
            503,
            f"the {kind} of job {job.id} was not triggered: the JobManager stream is unreachable ({exc})",
            hint="check that Redis is up (settings.redis_url) and try again",
            prefix=False,
        ) from None
    log.info("%s %s requested for job %s", kind, request_id, job.id)
    return request_id


def _existing(s: Session, trigger_id: str, job_id: str, kind: str) -> str | None:
    try:
        op = repository.get_operation(s, trigger_id)
    except NotFound:
        return None
    if op.job_id == job_id and op.kind == kind:
        return op.id  # Flink: a trigger id already known is acknowledged, not run again
    raise _trigger_id_taken(trigger_id)


def _trigger_id_taken(trigger_id: str) -> ApiError:
    return ApiError.of(
        409,
        f"triggerId {trigger_id} already names another operation",
        field="triggerId",
        expected="a trigger id not used by another job or kind of operation",
        hint="leave triggerId out to have one generated",
        prefix=False,
    )


def finish(catalog: Catalog, request_id: str, status: OperationStatus, **kw: Any) -> None:
    with catalog.session() as s:
        repository.finish_operation(s, repository.get_operation(s, request_id, lock=True), status, **kw)


def status(s: Session, *, jobid: str | None, triggerid: str, kinds: Iterable[str], result: str, what: str) -> dict:
    """Flink's AsynchronousOperationResult of one operation; 404 for an id this resource does not know."""
    job = get_job(s, jobid) if jobid is not None else None
    op = None
    if _plausible_id(triggerid):
        try:
            op = repository.get_operation(s, triggerid)
        except NotFound:
            op = None
    if op is None or op.kind not in tuple(kinds) or (job is not None and op.job_id != job.id):
        where = f" for job {job.id}" if job is not None else ""
        raise ApiError.of(
            404,
            f"There is no {what} operation with triggerId={triggerid}{where}",
            field="triggerid",
            expected=f"the request-id a {what} trigger returned",
            hint="trigger ids are returned by the POST that started the operation",
            prefix=False,
        )
    return operation_result(op, result)
