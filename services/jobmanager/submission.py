"""A job's submission (Flink's JobMaster building its ExecutionGraph, here one vertex): the job
goes INITIALIZING -> CREATED, gets its plan (a vertex and attempt 0, SCHEDULED), goes RUNNING,
and its slot request goes into the outbox. In CLAIM mode the snapshot it starts from becomes one
of its checkpoints (CheckpointCoordinator.on_submitted). One job at a time (`submit`), or a stream
batch's submissions set-based (`submit_together`), which is what lets one JobManager start
thousands of tasks in seconds."""

from __future__ import annotations

import logging
from typing import Sequence

from sqlalchemy.orm import Session

from services.jobmanager.batch_prefetch import job_of
from services.jobmanager.context import Context
from services.jobmanager.deployment import Deployment
from shared.catalog import repository as repo
from shared.ids import JobId, new_execution_id, new_vertex_id
from shared.messages import Envelope, SubmitJob
from shared.states import ExecutionState as ES
from shared.states import JobStatus as JS

log = logging.getLogger("headrace.jobmanager")


class Submissions:
    def __init__(self, ctx: Context, deployment: Deployment):
        self.ctx, self.deployment = ctx, deployment

    def submit(self, msg: SubmitJob) -> None:
        """One job's submission: INITIALIZING -> CREATED, its plan, RUNNING, its slot request."""
        ctx = self.ctx
        with ctx.uow.tx() as s:
            try:
                job = repo.get_job(s, msg.job_id, lock=True)
            except repo.NotFound:
                log.warning("SubmitJob for unknown job %s", msg.job_id)
                return
            if job.status != JS.INITIALIZING.value:
                return  # a redelivered submission
            repo.transition_job(s, job, JS.CREATED, epoch=ctx.epoch)
            ctx.checkpoints.on_submitted(s, job)
            vertex = repo.create_vertex(
                s, id=new_vertex_id(), job_id=job.id, name=job.name, parallelism=job.parallelism
            )
            ex = repo.create_execution(
                s,
                id=new_execution_id(),
                job_id=job.id,
                vertex_id=vertex.id,
                attempt=0,
                keep_history=ctx.settings.max_attempts_history,
            )
            repo.transition_execution(s, ex, ES.SCHEDULED)
            repo.transition_job(s, job, JS.RUNNING, epoch=ctx.epoch)
            request = self.deployment.slot_request(job, vertex, ex)
        log.info("job %s (%s) submitted, parallelism %d", job.id, job.name, job.parallelism)
        ctx.uow.emit(request)

    def submit_together(self, s: Session, envelopes: Sequence[Envelope]) -> None:
        """The batch's submissions, set-based: what `submit` does for each job, with the
        vertices, executions and state history of all of them written in three bulk INSERTs.
        2,000 submissions at once spent most of their time in the ORM's bookkeeping of the
        10,000 new objects. A submission is taken here only if no earlier message of the batch
        concerns its job, so handling it first changes nothing; `submit` then finds the job
        RUNNING and does nothing, as for a redelivered submission. Not in the savepoint-per-message
        batches after a failure (see UnitOfWork.batch): there every message goes alone."""
        ctx = self.ctx
        mentioned: set[JobId] = set()
        first: list[JobId] = []
        for env in envelopes:
            job_id = job_of(env.body)
            if isinstance(env.body, SubmitJob) and job_id not in mentioned:
                first.append(env.body.job_id)
            if job_id:
                mentioned.add(job_id)
        history: list[dict] = []
        vertices, executions, requests = [], [], []
        for job_id in dict.fromkeys(first):
            try:
                job = repo.get_job(s, job_id, lock=True)  # prefetched and locked: no SQL
            except repo.NotFound:
                continue  # submit logs it
            if job.status != JS.INITIALIZING.value:
                continue
            repo.transition_job(s, job, JS.CREATED, epoch=ctx.epoch, history=history)
            ctx.checkpoints.on_submitted(s, job)
            vertex_id, execution_id = new_vertex_id(), new_execution_id()
            vertices.append(dict(id=vertex_id, job_id=job.id, name=job.name, idx=0, parallelism=job.parallelism))
            executions.append(dict(id=execution_id, job_id=job.id, vertex_id=vertex_id, attempt=0))
            repo.transition_job(s, job, JS.RUNNING, epoch=ctx.epoch, history=history)
            requests.append(self.deployment.request(job, job.parallelism, execution_id))
            log.info("job %s (%s) submitted, parallelism %d", job.id, job.name, job.parallelism)
        repo.add_scheduled_plans(s, vertices, executions)
        repo.add_job_transitions(s, history)
        for r in requests:
            ctx.uow.emit(r)
