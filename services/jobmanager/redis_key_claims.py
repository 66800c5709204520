"""The Redis streams a running attempt's connectors claim, granted to its lineage's Redis user or
refused (issue 43.5; shared/redis_key_grants.py, pipeline_redis_keys "connectors").

A job that declares no Redis keys is deployed with a lineage user that reaches its own sink
bookkeeping and nothing else of the data, plus what its lineage's connectors were granted
before. As the pipeline builds a Redis source or sink whose stream its user cannot reach, the
driver claims the stream (task_protocol.ClaimRedisKeys), its TaskManager forwards the claim
(messages.RedisKeysClaimed, accepted only from the TaskManager that holds the attempt), and the
leading JobManager decides here:

- a read is granted (streams are shared for reading, as Kafka topics are);
- a write is granted unless another live lineage's user may write that stream (its declared keys
  or its own claims, as the Redis server has them): one writer per stream, as with declared
  keys, so no pipeline trims or deletes what another writes;
- anything else (a job that declares its keys, a cluster in another mode, a key of Headrace's
  own) fails the attempt for good with `RedisKeyRefused` and the reason, which the job's
  exceptions show; a Redis that cannot answer fails it as any failure (the restart claims again).

The driver waits for the grant in its own connection (connectors/redis_key_access.py): Redis
applies a changed user to its open connections at once, so nothing comes back on this path.
"""

from __future__ import annotations

import logging
from typing import Callable

import redis
from sqlalchemy.orm import Session

from services.jobmanager.deployment import Deployment
from services.jobmanager.pipeline_redis_users import PipelineRedisUsers
from services.jobmanager.unit_of_work import UnitOfWork
from shared import redis_key_grants
from shared.catalog import repository as repo
from shared.catalog.models import Job
from shared.ids import ExecutionId
from shared.messages import RedisKeysClaimed
from shared.settings import Settings
from shared.states import ExecutionState as ES

log = logging.getLogger("headrace.jobmanager")

REFUSED = "RedisKeyRefused"


class RedisKeyClaims:
    def __init__(
        self,
        settings: Settings,
        uow: UnitOfWork,
        deployment: Deployment,
        users: PipelineRedisUsers | None,
        fail: Callable[..., None],
    ) -> None:
        """`fail`: Restarts.fail, which fails an attempt and decides the job's fate."""
        self.settings, self.uow, self.deployment, self.users, self._fail = settings, uow, deployment, users, fail

    def refuse(self, execution_id: ExecutionId, reason: str, *, deployed: bool = True) -> None:
        """Fail the attempt for good with `reason` (no restart could help); one not `deployed`
        yet releases its slots at once instead of being cancelled on its TaskManager."""
        self._fail(
            execution_id, cause_name=REFUSED, cause=reason, expected_tm=None, still_running=deployed, permanent=True
        )

    def on_claimed(self, msg: RedisKeysClaimed) -> None:
        with self.uow.tx() as s:
            ex = repo.find_execution(s, msg.execution_id)
            if ex is None or ES(ex.state).is_terminal:
                return  # a claim that comes after its attempt ended: nothing runs to use it
            job = repo.get_job(s, ex.job_id)
            lineage = self.deployment.lineages.of(s, job)
            live = self.deployment.live_lineages(s) - {lineage}
            declared = redis_key_grants.declared(job.config)
        try:
            problem = self._problem(msg, declared, live)
            if problem is None and self.users is not None:
                self.users.grant(lineage, read=msg.read, write=msg.write)
        except redis.RedisError as exc:  # Redis away for a moment: a restart claims again
            log.warning("could not decide the Redis keys claimed by %s: %s", msg.execution_id, exc)
            self._fail(
                msg.execution_id,
                cause_name=REFUSED,
                cause=f"the JobManager could not change the Redis user of lineage {lineage}: {exc}",
                expected_tm=None,
                still_running=True,
            )
            return
        if problem is not None:
            log.warning("refusing the Redis keys claimed by %s of job %s: %s", msg.execution_id, msg.job_id, problem)
            self.refuse(msg.execution_id, problem)
            return
        log.info(
            "lineage %s may read Redis streams %s and write %s (claimed by %s)",
            lineage,
            list(msg.read),
            list(msg.write),
            msg.execution_id,
        )

    def declared_clash(self, s: Session, job: Job) -> str | None:
        """Why a job that declares keys to write may not be deployed, or None: another live
        lineage's user writes one of them (the dispatcher compares declarations only; this sees
        the connectors' claims too, as the Redis server has them)."""
        grants = redis_key_grants.grants_of(job.config)
        if grants is None or not grants.write or self.users is None:
            return None
        lineage = self.deployment.lineages.of(s, job)
        try:
            writers = self.users.writers(self.deployment.live_lineages(s) - {lineage})
        except redis.RedisError as exc:
            # Deployed as the dispatcher's comparison of declarations allowed; said in the log.
            log.warning("could not compare job %s's Redis keys with the other lineages' claims: %s", job.id, exc)
            return None
        found = redis_key_grants.other_writer(grants.write, writers)
        if found is None:
            return None
        own, other, theirs = found
        return (
            f"Redis key pattern {own!r} of {redis_key_grants.WRITE_OPTION} reaches keys that lineage {other} "
            f"writes (its pattern {theirs!r}): a key is written by one lineage at a time. Stop that job, or "
            "declare another stream"
        )

    def _problem(self, msg: RedisKeysClaimed, declared: bool, live: set[str]) -> str | None:
        """Why the claim cannot be granted for good, or None; redis.RedisError when Redis cannot say."""
        mode = self.settings.pipeline_redis_keys
        if self.users is None:
            return (
                "this JobManager makes no Redis users for the pipelines (their Redis is not the cluster's, "
                "or the cluster's has no users): the task's Redis user refused the stream for another reason"
            )
        if declared or mode != redis_key_grants.CONNECTORS:
            return (
                f"the job declares its Redis keys or the cluster requires it (pipeline_redis_keys: {mode}): add "
                f"{list(msg.write)} to {redis_key_grants.WRITE_OPTION} and {list(msg.read)} to "
                f"{redis_key_grants.READ_OPTION}"
            )
        return redis_key_grants.claim_problem(msg.read, msg.write, self.users.writers(live))
