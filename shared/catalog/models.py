from __future__ import annotations

from datetime import datetime, timezone

from sqlalchemy import JSON, BigInteger, DateTime, Float, ForeignKey, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from shared.errors import StateError
from shared.ids import AllocationId, ArtifactId, ExecutionId, JobId, TaskManagerId, VertexId


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def epoch_ms(dt: datetime | None) -> int:
    if dt is None:
        return -1
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return int(dt.timestamp() * 1000)


class Base(DeclarativeBase):
    # Timestamps are stored with their time zone: a PostgreSQL server in another zone must not
    # shift them.
    type_annotation_map = {datetime: DateTime(timezone=True)}


class Artifact(Base):
    __tablename__ = "artifacts"
    id: Mapped[ArtifactId] = mapped_column(String(160), primary_key=True)
    name: Mapped[str] = mapped_column(String(255))
    path: Mapped[str] = mapped_column(Text)
    size: Mapped[int] = mapped_column(BigInteger)
    sha256: Mapped[str] = mapped_column(String(64))
    uploaded_at: Mapped[datetime] = mapped_column(default=utcnow)
    # What GET /jars shows (entry points), computed once at upload: a listing never parses files.
    listing: Mapped[dict | None] = mapped_column(JSON, nullable=True)


class Job(Base):
    __tablename__ = "jobs"
    id: Mapped[JobId] = mapped_column(String(32), primary_key=True)
    # Submission order: slot requests are served first come, first served.
    seq: Mapped[int] = mapped_column(BigInteger, unique=True)
    name: Mapped[str] = mapped_column(String(255))
    artifact_id: Mapped[ArtifactId | None] = mapped_column(ForeignKey("artifacts.id", ondelete="SET NULL"))
    entry: Mapped[str] = mapped_column(String(255), default="build")
    kind: Mapped[str] = mapped_column(String(32), default="pyspark")  # pyspark | noop
    parallelism: Mapped[int] = mapped_column(Integer, default=1)
    program_args: Mapped[list] = mapped_column(JSON, default=list)
    config: Mapped[dict] = mapped_column(JSON, default=dict)
    restart_strategy: Mapped[dict] = mapped_column(JSON, default=dict)
    status: Mapped[str] = mapped_column(String(16), index=True)
    waiting_reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    epoch: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)
    end_at: Mapped[datetime | None] = mapped_column(nullable=True)
    # Consecutive failed checkpoints (reset by a completed one): the job fails over when it
    # passes execution.checkpointing.tolerable-failed-checkpoints.
    checkpoint_failures: Mapped[int] = mapped_column(Integer, default=0)
    # The restart strategy's counters (shared/restart.py), changed in the failure's transaction.
    restart_state: Mapped[dict | None] = mapped_column(JSON, nullable=True)
    # The schedule this job is a run of (None: submitted by hand). No foreign key: a deleted
    # schedule's jobs stay, with the id of what made them.
    schedule_id: Mapped[str | None] = mapped_column(String(32), nullable=True, index=True)
    # The deployment this job runs a generation of (None: not a deployment's); no foreign key, as
    # for schedules: a deleted deployment's jobs stay.
    deployment: Mapped[str | None] = mapped_column(String(63), nullable=True, index=True)


class Leadership(Base):
    """One row (id 1): the newest JobManager epoch. A leader's unit of work locks it and commits
    only if the epoch is still its own, so a deposed leader cannot commit anything."""

    __tablename__ = "leadership"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    epoch: Mapped[int] = mapped_column(BigInteger)
    leader: Mapped[str | None] = mapped_column(String(255), nullable=True)
    since: Mapped[datetime | None] = mapped_column(nullable=True)


class JobTransition(Base):
    __tablename__ = "job_transitions"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[JobId] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    from_status: Mapped[str | None] = mapped_column(String(16), nullable=True)
    to_status: Mapped[str] = mapped_column(String(16))
    at: Mapped[datetime] = mapped_column(default=utcnow)
    reason: Mapped[str | None] = mapped_column(Text, nullable=True)


class Vertex(Base):
    __tablename__ = "vertices"
    id: Mapped[VertexId] = mapped_column(String(32), primary_key=True)
    job_id: Mapped[JobId] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(255))
    idx: Mapped[int] = mapped_column(Integer, default=0)
    parallelism: Mapped[int] = mapped_column(Integer)


class Execution(Base):
    """One attempt of one task (a vertex's Spark query)."""

    __tablename__ = "executions"
    __table_args__ = (UniqueConstraint("vertex_id", "attempt"),)
    id: Mapped[ExecutionId] = mapped_column(String(32), primary_key=True)
    job_id: Mapped[JobId] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    vertex_id: Mapped[VertexId] = mapped_column(ForeignKey("vertices.id", ondelete="CASCADE"), index=True)
    attempt: Mapped[int] = mapped_column(Integer)
    state: Mapped[str] = mapped_column(String(16), index=True)
    taskmanager_id: Mapped[TaskManagerId | None] = mapped_column(String(128), nullable=True)
    allocation_id: Mapped[AllocationId | None] = mapped_column(String(32), nullable=True)
    slots: Mapped[list] = mapped_column(JSON, default=list)
    timestamps: Mapped[dict] = mapped_column(JSON, default=dict)  # state -> epoch ms
    failure_cause: Mapped[str | None] = mapped_column(Text, nullable=True)
    waiting_reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    start_at: Mapped[datetime | None] = mapped_column(nullable=True)
    end_at: Mapped[datetime | None] = mapped_column(nullable=True)
    last_batch_id: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    rows_processed: Mapped[int] = mapped_column(BigInteger, default=0)
    # The snapshot this attempt started from (None: a fresh start) and its checkpoint id (None for
    # a savepoint of another job, or a fresh start).
    restored_from: Mapped[str | None] = mapped_column(Text, nullable=True)
    restored_checkpoint_id: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    # Never loaded by the code (ids are used); declared so one flush inserts a new vertex
    # before the executions that reference it, without a flush per submission.
    vertex: Mapped["Vertex"] = relationship(lazy="raise")

    def placed_on(self) -> TaskManagerId:
        """The TaskManager of an attempt that has been placed (DEPLOYING and after)."""
        if self.taskmanager_id is None:
            raise StateError(f"attempt {self.id} ({self.state}) has no TaskManager")
        return self.taskmanager_id


class TaskManagerRow(Base):
    __tablename__ = "taskmanagers"
    id: Mapped[TaskManagerId] = mapped_column(String(128), primary_key=True)
    host: Mapped[str] = mapped_column(String(255))
    queue: Mapped[str] = mapped_column(String(160))
    state: Mapped[str] = mapped_column(String(16))  # REGISTERED | LOST | UNREGISTERED
    slots_total: Mapped[int] = mapped_column(Integer)
    slots_free: Mapped[int] = mapped_column(Integer)
    cores: Mapped[float] = mapped_column(Float)
    memory_bytes: Mapped[int] = mapped_column(BigInteger)
    allocations: Mapped[list] = mapped_column(JSON, default=list)
    registered_at: Mapped[datetime] = mapped_column(default=utcnow)
    last_heartbeat: Mapped[datetime] = mapped_column(default=utcnow)
    lost_reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    # The latest loss or unregistration, kept when it registers again (lost_reason is cleared).
    last_lost_at: Mapped[datetime | None] = mapped_column(nullable=True)
    last_lost_reason: Mapped[str | None] = mapped_column(Text, nullable=True)


class ExceptionRow(Base):
    __tablename__ = "exceptions"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[JobId] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    execution_id: Mapped[ExecutionId | None] = mapped_column(String(32), nullable=True)
    vertex_name: Mapped[str | None] = mapped_column(String(255), nullable=True)
    attempt: Mapped[int | None] = mapped_column(Integer, nullable=True)
    taskmanager_id: Mapped[TaskManagerId | None] = mapped_column(String(128), nullable=True)
    exception_name: Mapped[str] = mapped_column(String(255))
    stacktrace: Mapped[str] = mapped_column(Text)
    at: Mapped[datetime] = mapped_column(default=utcnow)


class Sequence_(Base):
    """Portable counters (job submission order) that work the same on SQLite and PostgreSQL."""

    __tablename__ = "counters"
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[int] = mapped_column(BigInteger, default=0)


class OutboxEntry(Base):
    """A message or command the JobManager decided to send, written in the same transaction as
    the state change that caused it and deleted once it was handed to Redis. If the JobManager
    dies, or Redis refuses, between its commit and the send, the entry is still here and is
    sent later: a committed decision is never forgotten."""

    __tablename__ = "outbox"
    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    seq: Mapped[int] = mapped_column(BigInteger, index=True)  # sending order
    kind: Mapped[str] = mapped_column(String(16))  # stream | deploy | cancel
    target: Mapped[str] = mapped_column(String(160))  # stream key or TaskManager queue
    execution_id: Mapped[ExecutionId | None] = mapped_column(String(32), nullable=True)
    envelope: Mapped[str] = mapped_column(Text)  # the encoded Envelope as first written
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class CheckpointRow(Base):
    """One checkpoint or savepoint of a job (Flink's checkpoint history). The files live in
    checkpoint storage under `path`; this row is the catalog's record of them."""

    __tablename__ = "checkpoints"
    job_id: Mapped[JobId] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    checkpoint_id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))  # checkpoint | savepoint
    status: Mapped[str] = mapped_column(String(16), index=True)  # shared.states.CheckpointStatus
    execution_id: Mapped[ExecutionId | None] = mapped_column(String(32), nullable=True)
    vertex_id: Mapped[VertexId | None] = mapped_column(String(32), nullable=True)
    request_id: Mapped[str | None] = mapped_column(String(32), nullable=True)  # the operation that asked
    after: Mapped[str] = mapped_column(String(16), default="continue")  # continue | cancel | stop | rescale
    trigger_at: Mapped[datetime] = mapped_column(default=utcnow)
    ack_at: Mapped[datetime | None] = mapped_column(nullable=True)
    batch_id: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    state_size: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    duration_ms: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    path: Mapped[str | None] = mapped_column(Text, nullable=True)
    failure_cause: Mapped[str | None] = mapped_column(Text, nullable=True)
    source_offsets: Mapped[list] = mapped_column(JSON, default=list)


class Operation(Base):
    """An asynchronous REST operation (Flink's trigger id): savepoint, stop, checkpoint,
    dispose, rescale. The dispatcher creates it; whoever carries it out finishes it."""

    __tablename__ = "operations"
    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))
    job_id: Mapped[JobId | None] = mapped_column(String(32), nullable=True, index=True)
    status: Mapped[str] = mapped_column(String(16))  # shared.states.OperationStatus
    params: Mapped[dict] = mapped_column(JSON, default=dict)
    checkpoint_id: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    location: Mapped[str | None] = mapped_column(Text, nullable=True)
    failure_cause: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    done_at: Mapped[datetime | None] = mapped_column(nullable=True)


class ApiToken(Base):
    """A REST API bearer token (`headrace token create`). Only the token's SHA-256 is stored: a
    copy of the catalog does not let anyone call the API. A revoked token keeps its row so that
    `headrace token list` still shows who had access."""

    __tablename__ = "api_tokens"
    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(255))
    role: Mapped[str] = mapped_column(String(16))  # viewer | operator | admin
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(nullable=True)


class Schedule(Base):
    """A scheduled submission (`POST /jobs/schedules`): what to run (as POST /jars/{id}/run would),
    when (a 5-field UTC cron expression or an interval), and what to do when a run is still
    going (`overlap`) or a tick was missed (`misfire_grace_s`). Only the leading JobManager's
    beat moves next_fire_at / last_fire_at (services/jobmanager/schedule_beat.py)."""

    __tablename__ = "schedules"
    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(255))
    artifact_id: Mapped[ArtifactId] = mapped_column(String(160))
    entry: Mapped[str] = mapped_column(String(255), default="build")
    kind: Mapped[str] = mapped_column(String(32), default="pyspark")
    parallelism: Mapped[int] = mapped_column(Integer, default=1)
    program_args: Mapped[list] = mapped_column(JSON, default=list)
    config: Mapped[dict] = mapped_column(JSON, default=dict)
    restart_strategy: Mapped[dict] = mapped_column(JSON, default=dict)
    cron: Mapped[str | None] = mapped_column(String(255), nullable=True)
    every_s: Mapped[int | None] = mapped_column(Integer, nullable=True)
    overlap: Mapped[str] = mapped_column(String(16), default="skip")  # skip | queue | cancel_previous
    misfire_grace_s: Mapped[int] = mapped_column(Integer, default=60)
    enabled: Mapped[bool] = mapped_column(default=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    next_fire_at: Mapped[datetime | None] = mapped_column(nullable=True, index=True)
    last_fire_at: Mapped[datetime | None] = mapped_column(nullable=True)


class ScheduleRun(Base):
    """One tick of a schedule and what became of it. UNIQUE(schedule_id, tick_at): a tick is
    recorded once, even by two JobManagers that both believe they lead for a moment. No foreign
    key: the history outlives a deleted schedule."""

    __tablename__ = "schedule_runs"
    __table_args__ = (UniqueConstraint("schedule_id", "tick_at"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    schedule_id: Mapped[str] = mapped_column(String(32), index=True)
    tick_at: Mapped[datetime] = mapped_column()  # the nominal tick, not when it was handled
    job_id: Mapped[JobId | None] = mapped_column(String(32), nullable=True)
    outcome: Mapped[str] = mapped_column(String(24))  # shared.schedules.OUTCOMES
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class DeploymentRow(Base):
    """A deployment (`PUT /deployments/{name}`): the desired spec with its generation, written by
    the dispatcher, and the status the leading JobManager's reconciler keeps
    (services/jobmanager/deployment_reconciler.py; the rules are shared/deployments.py)."""

    __tablename__ = "deployments"
    name: Mapped[str] = mapped_column(String(63), primary_key=True)
    spec: Mapped[dict] = mapped_column(JSON)  # normalised (DeploymentSpec.record)
    generation: Mapped[int] = mapped_column(Integer, default=1)
    # Desired beside the spec: asked by DELETE and POST .../rollback.
    deleting: Mapped[bool] = mapped_column(default=False)
    delete_with_savepoint: Mapped[bool] = mapped_column(default=True)
    rollback_requested: Mapped[bool] = mapped_column(default=False)
    # Status.
    lifecycle: Mapped[str | None] = mapped_column(String(16), nullable=True)
    job_id: Mapped[JobId | None] = mapped_column(String(32), nullable=True)
    job_generation: Mapped[int | None] = mapped_column(Integer, nullable=True)
    deployed_at: Mapped[datetime | None] = mapped_column(nullable=True)  # when job_generation's job started
    stable_generation: Mapped[int | None] = mapped_column(Integer, nullable=True)
    rollback_point: Mapped[str | None] = mapped_column(Text, nullable=True)
    last_savepoint: Mapped[str | None] = mapped_column(Text, nullable=True)
    last_periodic_savepoint_at: Mapped[datetime | None] = mapped_column(nullable=True)
    blocked_generation: Mapped[int | None] = mapped_column(Integer, nullable=True)
    pending: Mapped[dict | None] = mapped_column(JSON, nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    # The autoscaler's (services/jobmanager/autoscaler.py): the parallelism it chose (None: the
    # spec's), the one before its last rescale until that one is STABLE, when it last rescaled,
    # why it holds off (for the generation whose rescale was rolled back), and the shortest
    # micro-batch it has seen (the fixed part of a batch's cost, shared/autoscaling.py).
    parallelism: Mapped[int | None] = mapped_column(Integer, nullable=True)
    scaled_from: Mapped[int | None] = mapped_column(Integer, nullable=True)
    scaled_at: Mapped[datetime | None] = mapped_column(nullable=True)
    autoscaler_hold: Mapped[str | None] = mapped_column(Text, nullable=True)
    autoscaler_held_generation: Mapped[int | None] = mapped_column(Integer, nullable=True)
    fixed_cost_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)


class DeploymentGeneration(Base):
    """Each generation's spec, for the dashboard's differences and for rolling back to one."""

    __tablename__ = "deployment_generations"
    name: Mapped[str] = mapped_column(String(63), primary_key=True)
    generation: Mapped[int] = mapped_column(Integer, primary_key=True)
    spec: Mapped[dict] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class DeploymentEvent(Base):
    """The history of a deployment: each lifecycle step with its reason."""

    __tablename__ = "deployment_events"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(63), index=True)
    at: Mapped[datetime] = mapped_column(default=utcnow)
    generation: Mapped[int | None] = mapped_column(Integer, nullable=True)
    from_state: Mapped[str | None] = mapped_column(String(16), nullable=True)
    to_state: Mapped[str | None] = mapped_column(String(16), nullable=True)
    reason: Mapped[str] = mapped_column(Text)
    job_id: Mapped[JobId | None] = mapped_column(String(32), nullable=True)
    savepoint: Mapped[str | None] = mapped_column(Text, nullable=True)


class DeploymentSavepoint(Base):
    """A savepoint a deployment took (upgrade, suspend, rescale, periodic), kept up to
    savepoints.historyMax; older ones are disposed unless a rollback still needs them."""

    __tablename__ = "deployment_savepoints"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(63), index=True)
    path: Mapped[str] = mapped_column(Text)
    at: Mapped[datetime] = mapped_column(default=utcnow)
    generation: Mapped[int | None] = mapped_column(Integer, nullable=True)
    job_id: Mapped[JobId | None] = mapped_column(String(32), nullable=True)
    trigger: Mapped[str] = mapped_column(String(16))
    disposed: Mapped[bool] = mapped_column(default=False)


class AutoscalerEvaluation(Base):
    """One evaluation of a deployment's autoscaler with its figures and outcome
    (GET /deployments/{name}/autoscaler); the newest EVALUATIONS_KEPT per deployment are kept."""

    __tablename__ = "autoscaler_evaluations"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(63), index=True)
    at: Mapped[datetime] = mapped_column(default=utcnow)
    job_id: Mapped[JobId | None] = mapped_column(String(32), nullable=True)
    parallelism: Mapped[int] = mapped_column(Integer)
    proposed: Mapped[int] = mapped_column(Integer)
    outcome: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str] = mapped_column(Text)
    figures: Mapped[dict] = mapped_column(JSON)
