"""From a scheduled attempt to its task: the slot request it sends the ResourceManager and the
deploy command its TaskManager gets (with the restore point and a fence token)."""

from __future__ import annotations

import logging
import time
from typing import Callable

from sqlalchemy.orm import Session

from services.jobmanager.checkpoint_coordinator import CheckpointCoordinator
from services.jobmanager.pipeline_redis_users import PipelineRedisUsers
from shared import job_options, redis_key_grants, storage_roots
from shared.catalog import repository as repo
from shared.catalog.models import Execution, Job, Vertex
from shared.ids import ExecutionId, slot_request_id
from shared.job_lineage import Lineages
from shared.messages import DeployTask, RequestSlots, SlotsAllocated
from shared.settings import Settings
from shared.states import JobStatus as JS
from shared.task_protocol import TaskSpec

log = logging.getLogger("headrace.jobmanager")


def slot_request_timeout(config: dict, default_s: float) -> float:
    """`slot.request.timeout` from a job's config (shared/job_options.py): a duration as Flink
    writes it ("5 min"; "300000" is milliseconds). A value stored before the dispatcher checked
    it and unreadable falls back to the default rather than failing every message about the job."""
    raw = (config or {}).get(job_options.SLOT_REQUEST_TIMEOUT)
    if raw is None:
        return default_s
    try:
        return job_options.duration_s(raw, positive=True)
    except ValueError:
        log.warning("ignoring unreadable slot.request.timeout %r; using %.0f s", raw, default_s)
        return default_s


class Deployment:
    def __init__(
        self, settings: Settings, checkpoints: CheckpointCoordinator, pipeline_users: PipelineRedisUsers | None = None
    ):
        self.settings, self.checkpoints = settings, checkpoints
        self.lineages, self.pipeline_users = Lineages(), pipeline_users
        self._last_fence = 0
        # Told of every slot request made (slot_request_watch.py watches them).
        self.on_request: Callable[[RequestSlots], None] | None = None

    def request(self, job: Job, parallelism: int, execution_id: ExecutionId) -> RequestSlots:
        timeout = slot_request_timeout(job.config, self.settings.slot_request_timeout_s)
        msg = RequestSlots(
            request_id=slot_request_id(execution_id),
            job_id=job.id,
            execution_id=execution_id,
            slots=parallelism,
            timeout_s=timeout,
            submitted_seq=job.seq,
        )
        if self.on_request is not None:
            self.on_request(msg)
        return msg

    def slot_request(self, job: Job, vertex: Vertex, ex: Execution) -> RequestSlots:
        return self.request(job, vertex.parallelism, ex.id)

    def command(self, s: Session, job: Job, ex: Execution, msg: SlotsAllocated, *, choose_restore: bool) -> DeployTask:
        """`choose_restore`: a first deploy picks (and records) the restore point; a redelivered
        one keeps the point chosen the first time."""
        vertex = repo.find_vertex(s, ex.vertex_id)  # prefetched with the batch: no SQL
        assert vertex is not None, f"attempt {ex.id} has no vertex"
        artifact = repo.find_artifact(s, job.artifact_id) if job.artifact_id else None
        artifact_path = artifact.path if artifact is not None else None
        if choose_restore:
            restore_from, restore_id = self.checkpoints.restore_point(s, job)
            repo.set_execution_restore(s, ex, path=restore_from, checkpoint_id=restore_id)
        else:
            restore_from, restore_id = ex.restored_from, ex.restored_checkpoint_id
        lineage = self.lineages.of(s, job)
        redis_url = self.pipeline_redis_url(job, lineage)
        spec = TaskSpec(
            job_id=job.id,
            job_name=job.name,
            vertex_id=vertex.id,
            execution_id=ex.id,
            attempt=ex.attempt,
            parallelism=vertex.parallelism,
            kind=job.kind if job.kind in ("pyspark", "noop") else "pyspark",
            artifact_path=artifact_path,
            entry=job.entry,
            program_args=tuple(job.program_args or ()),
            checkpoint_dir=str(self.checkpoints.live_dir(job.id, vertex.id, ex.id)),
            restore_from=restore_from,
            restore_checkpoint_id=restore_id,
            allow_non_restored_state=self.checkpoints.config(job).allow_non_restored_state,
            artifact_sha256=artifact.sha256 if artifact is not None else None,
            fence_token=self.next_fence(),
            catalog_url=self.settings.pipeline_catalog_url or "",
            redis_url=redis_url,
            lineage_id=lineage,
            kafka_bootstrap_servers=self.settings.pipeline_kafka_bootstrap_servers or "",
            lake_dir=str(self.settings.lake.absolute()),
            storage_roots=storage_roots.configured_roots(self.settings),
            config=dict(job.config or {}),
        )
        return DeployTask(
            taskmanager_id=msg.taskmanager_id, allocation_id=msg.allocation_id, slot_indices=msg.slot_indices, spec=spec
        )

    def pipeline_redis_url(self, job: Job, lineage: str) -> str:
        """What a task gets as ctx.redis_url: its lineage's own user, confined to the keys its job
        declares, else (the cluster's pipeline_redis_keys) to what its connectors claimed or to
        every data key; the shared user when that user cannot be made, unless it would reach
        more than the job may."""
        shared = self.settings.pipeline_redis_url or self.settings.redis_url
        if self.pipeline_users is None or job.kind == "noop":  # a no-op task runs no pipeline
            return shared
        mode = self.settings.pipeline_redis_keys
        grants = redis_key_grants.grants_of(job.config)
        claims = grants is None and mode == redis_key_grants.CONNECTORS
        if grants is None and mode != redis_key_grants.SHARED:
            grants = redis_key_grants.KeyGrants()  # the connectors' claims, or stored before declarations
        own = self.pipeline_users.url_for(lineage, grants, keep_claims=claims)
        if own is None and mode != redis_key_grants.SHARED:
            return ""
        return own or shared

    def live_lineages(self, s: Session) -> set[str]:
        """The lineages of every job not yet ended (their Redis users stay)."""
        return {self.lineages.of(s, job) for job in repo.list_jobs(s, statuses=[st for st in JS if not st.is_terminal])}

    def next_fence(self) -> int:
        """Wall-clock microseconds, strictly increasing within this process: across JobManagers
        (a new leader, another cluster a job moved to) the clock keeps it growing, since the next
        attempt of a lineage is deployed seconds after the previous one, far beyond clock skew."""
        self._last_fence = max(time.time_ns() // 1000, self._last_fence + 1)
        return self._last_fence
