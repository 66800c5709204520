"""The deployments' reconciler, run by the leading JobManager only (a standby builds none).

Each pass, every deployment in its own unit of work: lock its row -> observe its job, its pending
step's operation and its snapshots (deployment_observation.py) -> ask shared/deployments.py
`decide` -> carry the plan out here: cancel, stop with a savepoint, rescale, take a periodic
savepoint, start a new job (created in the catalog and handed to this leader's JobMaster, as a
schedule's run is) -> record the new status (the lifecycle through `transition_deployment`,
which refuses a move its table forbids) and its history -> the leadership check -> commit. A
leader that dies halfway commits nothing; its successor observes the same rows and decides the
same step again.

The rules live in shared/deployments.py and the reading in deployment_observation.py; this module
turns a `Plan` into catalog rows and messages.
"""

from __future__ import annotations

import logging
import time
from typing import Callable, ContextManager, Protocol

from sqlalchemy.orm import Session

from services.jobmanager.deployment_observation import observe
from services.jobmanager.snapshot_files import discard_files
from services.jobmanager.snapshot_requests import SnapshotRequests
from services.jobmanager.unit_of_work import LeadershipLost, UnitOfWork
from shared import checkpointing as cp
from shared import deployments as dep
from shared.catalog import Catalog
from shared.catalog import repository as repo
from shared.catalog.models import DeploymentRow, utcnow
from shared.catalog.repository import deployments as deployments_repo
from shared.clock import Clock
from shared.ids import JobId, new_job_id, new_request_id
from shared.messages import CancelJob, RequestSavepoint, SubmitJob
from shared.settings import Settings

log = logging.getLogger("headrace.jobmanager.deployments")

# What a stop or savepoint of each purpose is recorded as in the savepoint history.
SAVEPOINT_TRIGGERS = {
    "upgrade": "upgrade",
    "suspend": "suspend",
    "delete": "delete",
    "rescale": "rescale",
    "periodic": "periodic",
}


class JobMasterPort(Protocol):
    """What the reconciler asks of the leader's job master."""

    catalog: Catalog
    uow: UnitOfWork
    snapshots: SnapshotRequests

    def unit_of_work(self) -> ContextManager[None]: ...

    def on_submit(self, msg: SubmitJob) -> None: ...

    def on_cancel(self, msg: CancelJob) -> None: ...


class DeploymentReconciler:
    """Ticked by the leader's loop. `clock`: wall-clock seconds (deadlines are read by the next
    leader too)."""

    # Each pass reads the deployments table once: 0.2 s keeps an upgrade's two hand-offs (the
    # change seen, the old job ended) short at a negligible load on the catalog.
    INTERVAL_S = 0.2
    RETRY_S = 2.0

    def __init__(
        self,
        master: JobMasterPort,
        settings: Settings,
        clock: Clock,
        *,
        interval_s: float = INTERVAL_S,
        monotonic: Callable[[], float] = time.monotonic,
    ):
        self.master, self.settings, self.clock = master, settings, clock
        self.interval_s, self.monotonic = interval_s, monotonic
        self._next_pass = monotonic()
        # SUSPENDED deployments a pass found nothing to do for, with the row's desired fields
        # (deployments_repo.DESIRED_FIELDS) as they were then: skipped until one of them changes
        # (a PUT, a DELETE, a rollback).
        # Otherwise each would cost a unit of work every pass: 500 of them held 0.39 of a core.
        self._idle: dict[str, tuple] = {}

    def due(self) -> bool:
        return self.monotonic() >= self._next_pass

    def tick(self) -> None:
        """One pass. LeadershipLost propagates; anything else is logged and the pass is tried again
        a little later: nothing of a failed step was committed."""
        self._next_pass = self.monotonic() + self.interval_s
        try:
            with self.master.catalog.session() as s:
                rows = deployments_repo.desired_states(s)
        except Exception:  # catalog unreachable: the loop goes on
            log.warning("deployments: cannot read the catalog; trying again in %.0f s", self.RETRY_S, exc_info=True)
            self._next_pass = self.monotonic() + self.RETRY_S
            return
        present = {r.name for r in rows}
        self._idle = {name: desired for name, desired in self._idle.items() if name in present}
        for r in rows:
            name, desired = r.name, tuple(r)
            if self._idle.get(name) == desired:
                continue
            try:
                with self.master.unit_of_work():
                    idle = self.reconcile(name)
                if idle and r.lifecycle == dep.Lifecycle.SUSPENDED.value:
                    self._idle[name] = desired
                else:
                    self._idle.pop(name, None)
            except LeadershipLost:
                raise
            except Exception:
                log.exception(
                    "deployment %s: reconciling failed (nothing committed); trying again in %.0f s", name, self.RETRY_S
                )
                self._next_pass = self.monotonic() + self.RETRY_S

    # --- one deployment, inside the leader's unit of work ---------------------------------------

    def reconcile(self, name: str) -> bool:
        """One step of the deployment; True when there was nothing to do."""
        submit: list[JobId] = []
        cancel: list[JobId] = []
        savepoints: list[RequestSavepoint] = []
        with self.master.uow.tx() as s:
            try:
                row = deployments_repo.get_deployment(s, name, lock=True)
            except repo.NotFound:
                return True
            plan = dep.decide(observe(s, row, self.clock.now()))
            if plan.nothing:
                return True
            self.carry_out(s, row, plan, submit, cancel, savepoints)
        for job_id in cancel:
            self.master.on_cancel(CancelJob(job_id=job_id))
        for request in savepoints:
            self.master.snapshots.on_request_savepoint(request)
        for job_id in submit:
            self.master.on_submit(SubmitJob(job_id=job_id))
        return False

    # --- carrying a plan out --------------------------------------------------------------------

    def carry_out(
        self,
        s: Session,
        row: DeploymentRow,
        plan: dep.Plan,
        submit: list[JobId],
        cancel: list[JobId],
        savepoints: list[RequestSavepoint],
    ) -> None:
        before = row.lifecycle
        if plan.delete:
            deployments_repo.delete_deployment(s, row.name)
            log.info("deployment %s deleted", row.name)
            return
        self._record_pending_savepoint(s, row, plan)
        if plan.cancel_job and row.job_id:
            cancel.append(row.job_id)
        if (plan.stop or plan.rescale_to or plan.savepoint) and row.job_id:
            pending = dict(plan.pending or {})
            pending["op"] = self._savepoint(s, row, plan, savepoints)
            row.pending = pending
        elif not plan.keep_pending:
            row.pending = dict(plan.pending) if plan.pending else None
        if plan.adopt_generation is not None:
            row.job_generation = plan.adopt_generation
            row.deployed_at = utcnow()
        if plan.start is not None or plan.rollback_point is not None:
            # A job started from nothing (stateless) leaves nothing to roll back to: no stale point.
            row.rollback_point = plan.rollback_point
        if plan.periodic_done:
            row.last_periodic_savepoint_at = utcnow()
        if plan.last_savepoint is not None:
            row.last_savepoint = plan.last_savepoint
        if plan.start is not None:
            submit.append(self._start(s, row, plan.start))
        if plan.stable:
            row.stable_generation = row.job_generation
        if plan.scale_settled:
            row.scaled_from = None
        if plan.unscale_to is not None:
            # The autoscaler's rescale failed: its choice goes back, and it holds off for this generation.
            row.parallelism, row.scaled_from, row.scaled_at = plan.unscale_to, None, utcnow()
            row.autoscaler_hold = f"its rescale was rolled back: {plan.error or plan.reason}"[:2000]
            row.autoscaler_held_generation = row.generation
        if plan.block is not None:
            row.blocked_generation = plan.block
        if plan.unblock:
            row.blocked_generation = None
        if plan.consume_rollback_request:
            row.rollback_requested = False
        if plan.error is not None:
            row.error = plan.error[:4000]
        elif plan.clear_error:
            row.error = None
        if plan.to is not None:
            deployments_repo.transition_deployment(s, row, plan.to)
        row.updated_at = utcnow()
        if plan.reason:
            deployments_repo.record_deployment_event(
                s, row, from_state=before, to_state=row.lifecycle, reason=plan.reason, savepoint=plan.last_savepoint
            )
            log.info("deployment %s: %s -> %s: %s", row.name, before, row.lifecycle, plan.reason)

    def _record_pending_savepoint(self, s: Session, row: DeploymentRow, plan: dep.Plan) -> None:
        """A savepoint the finished step took goes into the savepoint history (and the oldest
        beyond savepoints.historyMax are disposed)."""
        if plan.last_savepoint is None or not row.pending:
            return
        purpose = (row.pending or {}).get("purpose") or "upgrade"
        deployments_repo.add_deployment_savepoint(
            s, row, path=plan.last_savepoint, trigger=SAVEPOINT_TRIGGERS.get(purpose, purpose)
        )
        self._dispose_beyond_history(s, row, keep={plan.last_savepoint, plan.rollback_point, row.rollback_point})

    def _dispose_beyond_history(self, s: Session, row: DeploymentRow, keep: set[str | None]) -> None:
        spec = dep.DeploymentSpec.from_record(row.spec)
        kept = list(deployments_repo.deployment_savepoints(s, row.name, kept_only=True))
        excess = [sp for sp in kept[: -spec.history_max] if sp.path not in keep] if spec.history_max else []
        if not excess:
            return
        for sp in excess:
            sp.disposed = True
        paths = [sp.path for sp in excess]
        self.master.uow.after_commit(lambda: discard_files(paths, self.settings))
        log.info(
            "deployment %s: disposed %d savepoint(s) beyond savepoints.historyMax %d",
            row.name,
            len(paths),
            spec.history_max,
        )

    def _savepoint(self, s: Session, row: DeploymentRow, plan: dep.Plan, out: list[RequestSavepoint]) -> str:
        """The operation of a stop, rescale or periodic savepoint, created as the REST API's are."""
        assert row.job_id is not None
        job = repo.get_job(s, row.job_id)
        target = str((job.config or {}).get(cp.SAVEPOINT_DIR) or self.settings.savepoints)
        if plan.rescale_to:
            kind, after = "rescale", "rescale"
        elif plan.stop:
            kind, after = "stop", "stop"
        else:
            kind, after = "savepoint", "continue"
        request_id = new_request_id()
        params = {"target_directory": target, "after": after, "drain": False, "deployment": row.name}
        if plan.rescale_to:
            params["parallelism"] = plan.rescale_to
        repo.create_operation(s, id=request_id, kind=kind, job_id=row.job_id, params=params)
        out.append(
            RequestSavepoint(
                job_id=row.job_id,
                request_id=request_id,
                target_directory=target,
                after=after,
                parallelism=plan.rescale_to,
            )
        )
        return request_id

    def _start(self, s: Session, row: DeploymentRow, start: dep.Start) -> JobId:
        rec = deployments_repo.generation_spec(s, row.name, start.generation) or dict(row.spec)
        config = {k: v for k, v in dict(rec.get("flinkConfiguration") or {}).items() if k != cp.RESTORE_PATH}
        if start.restore_from:
            config[cp.RESTORE_PATH] = start.restore_from
        parallelism = start.parallelism or dep.DeploymentSpec.from_record(rec).effective_parallelism(row.parallelism)
        job = deployments_repo.create_deployment_job(
            s,
            row,
            new_job_id(),
            rec,
            restart_strategy=dict(rec.get("restartStrategy") or {}),
            config=config,
            parallelism=parallelism,
        )
        row.job_id, row.job_generation, row.deployed_at = job.id, start.generation, utcnow()
        return job.id
