"""The autoscaler of streaming deployments, run by the leading JobManager only.

Every INTERVAL_S, each deployment whose spec enables it and that is STABLE with nothing pending
is evaluated in its own unit of work: its task's figures over the metrics window are read from
the TaskManagers' progress history in Redis (shared/streams.py progress_history_key), the rules
of shared/autoscaling.py decide, and the evaluation is recorded with its figures
(GET /deployments/{name}/autoscaler). A decision to rescale writes the new parallelism into the
deployment's row (`parallelism`, with `scaled_from` the one before); the deployment reconciler
carries it out through a savepoint (shared/deployments.py), and rolls it back if the rescaled job
does not become STABLE, after which the autoscaler holds off for that generation.
"""

from __future__ import annotations

import logging
import time
from datetime import datetime, timezone
from typing import Any, Callable, ContextManager, Protocol

from sqlalchemy.orm import Session

from services.jobmanager.unit_of_work import LeadershipLost, UnitOfWork
from shared import autoscaling as auto
from shared import deployments as dep
from shared import job_options, streams
from shared.catalog import Catalog
from shared.catalog import repository as repo
from shared.catalog.models import DeploymentRow, utcnow
from shared.catalog.repository import deployments as deployments_repo
from shared.catalog.repository import taskmanagers as taskmanagers_repo
from shared.clock import Clock
from shared.settings import Settings
from shared.states import ExecutionState as ES
from shared.states import JobStatus as JS

log = logging.getLogger("headrace.jobmanager.autoscaler")


class MasterPort(Protocol):
    catalog: Catalog
    uow: UnitOfWork

    def unit_of_work(self) -> ContextManager[None]: ...


class Autoscaler:
    # Flink's job.autoscaler.interval is 10 s; decisions still wait for a full metrics window and
    # the stabilization, so a shorter pass only makes a decision land sooner after both.
    INTERVAL_S = 5.0
    RETRY_S = 5.0

    def __init__(
        self,
        master: MasterPort,
        redis_client: Any,
        settings: Settings,
        clock: Clock,
        *,
        interval_s: float = INTERVAL_S,
        monotonic: Callable[[], float] = time.monotonic,
    ):
        self.master, self.redis, self.settings, self.clock = master, redis_client, settings, clock
        self.interval_s, self.monotonic = interval_s, monotonic
        self._next_pass = monotonic()

    def due(self) -> bool:
        return self.monotonic() >= self._next_pass

    def tick(self) -> None:
        self._next_pass = self.monotonic() + self.interval_s
        try:
            with self.master.catalog.session() as s:
                names = [
                    r.name
                    for r in deployments_repo.list_deployments(s)
                    if (r.spec.get("autoscaler") or {}).get("enabled")
                ]
        except Exception:  # catalog unreachable: the loop goes on
            log.warning("autoscaler: cannot read the catalog; trying again in %.0f s", self.RETRY_S, exc_info=True)
            return
        for name in names:
            try:
                with self.master.unit_of_work():
                    self.evaluate(name)
            except LeadershipLost:
                raise
            except Exception:
                log.exception("deployment %s: the autoscaler's evaluation failed (nothing committed)", name)

    def evaluate(self, name: str) -> auto.Evaluation | None:
        """One evaluation of `name`, recorded; None when the deployment is not one to evaluate now
        (not STABLE, a step pending, suspended, being deleted, its task not RUNNING)."""
        with self.master.uow.tx() as s:
            try:
                row = deployments_repo.get_deployment(s, name, lock=True)
            except repo.NotFound:
                return None
            spec = dep.DeploymentSpec.from_record(row.spec)
            if (
                not spec.autoscaler.enabled
                or row.lifecycle != dep.Lifecycle.STABLE.value
                or row.pending
                or row.deleting
                or spec.state != "running"
                or row.job_id is None
            ):
                return None
            running = self._running_task(s, row)
            if running is None:
                return None
            execution_id, running_on, parallelism, partitions, slot_capacity = running
            points = self._points(running_on, execution_id)
            durations = [p.duration_s for p in points if p.duration_s is not None]
            now = self.clock.now()
            quiet_since = (
                max(_seconds(t) for t in (row.deployed_at, row.scaled_at) if t is not None)
                if row.deployed_at or row.scaled_at
                else None
            )
            held = row.autoscaler_hold if row.autoscaler_held_generation == row.generation else None
            situation = auto.Situation(
                parallelism=parallelism,
                partitions=partitions,
                now_s=now,
                quiet_s=None if quiet_since is None else now - quiet_since,
                held=held,
                fixed_cost_s=row.fixed_cost_s,
                slot_capacity=slot_capacity,
                last_wanted=_last_wanted(s, name, parallelism),
            )
            evaluation = auto.evaluate(spec.autoscaler, situation, points)
            if durations:
                # The shortest batch seen is the best estimate of a batch's fixed part.
                row.fixed_cost_s = min([*durations, *([row.fixed_cost_s] if row.fixed_cost_s is not None else [])])
            deployments_repo.add_autoscaler_evaluation(s, row, evaluation.record())
            if evaluation.rescale:
                self._rescale(s, row, evaluation)
            return evaluation

    def _running_task(self, s: Session, row: DeploymentRow) -> tuple[str, str, int, int, int | None] | None:
        """(execution id, parallelism, state partitions, slot capacity) of the deployment's task,
        when its job runs one RUNNING task (the autoscaler scales pipelines of one vertex, as
        Headrace runs them)."""
        assert row.job_id is not None
        job = repo.get_job(s, row.job_id)
        if job.status != JS.RUNNING.value:
            return None
        latest = list(repo.latest_executions(s, job.id).values())
        if len(latest) != 1 or latest[0].state != ES.RUNNING.value or not latest[0].taskmanager_id:
            return None
        vertices = repo.job_vertices(s, job.id)
        parallelism = max((v.parallelism for v in vertices), default=job.parallelism)
        partitions = job_options.state_partitions(job.config, self.settings.spark_shuffle_partitions)
        running_on = latest[0].taskmanager_id
        return latest[0].id, running_on, parallelism, partitions, self._slot_capacity(s, running_on, parallelism)

    def _slot_capacity(self, s: Session, running_on: str | None, parallelism: int) -> int | None:
        """The most slots one TaskManager could give the task after a rescale released its own:
        with the local engine a task of parallelism p holds p slots of one TaskManager. None on a
        Spark standalone cluster, where the task holds one slot and its executors run elsewhere."""
        if self.settings.spark_master != "local":
            return None
        free = [
            tm.slots_free + (parallelism if tm.id == running_on else 0) for tm in taskmanagers_repo.list_taskmanagers(s)
        ]
        return max(free) if free else None

    def _points(self, taskmanager_id: str, execution_id: str) -> list[auto.Point]:
        # The whole history (bounded by its TaskManager): the window is chosen from it, and the
        # rate the attempt has shown is read over all of it. Only the TaskManager running the
        # attempt can write it (streams.progress_history_key).
        entries = self.redis.xrange(streams.progress_history_key(taskmanager_id, execution_id)) or []
        out = []
        for entry_id, fields in entries:
            f = {_text(k): _text(v) for k, v in fields.items()}
            try:
                out.append(
                    auto.Point(
                        at_s=int(_text(entry_id).split("-", 1)[0]) / 1000,
                        batch_id=int(f["batch_id"]),
                        rows=int(float(f.get("num_input_rows") or 0)),
                        duration_s=float(f["batch_duration_ms"]) / 1000 if f.get("batch_duration_ms") else None,
                        lag=float(f["source_lag"]) if f.get("source_lag") not in (None, "", "None") else None,
                        source_partitions=int(f["source_partitions"]) if f.get("source_partitions") else None,
                        input_rate=float(f["input_rows_per_second"]) if f.get("input_rows_per_second") else None,
                    )
                )
            except (KeyError, ValueError):
                continue  # a point from an older TaskManager without the figures
        return out

    def _rescale(self, s: Session, row: DeploymentRow, evaluation: auto.Evaluation) -> None:
        row.parallelism, row.scaled_from, row.scaled_at = evaluation.proposed, evaluation.parallelism, utcnow()
        row.updated_at = utcnow()
        reason = (
            f"autoscaler: {evaluation.outcome.value} from {evaluation.parallelism} to {evaluation.proposed}: "
            f"{evaluation.reason}"
        )
        deployments_repo.record_deployment_event(
            s, row, from_state=row.lifecycle, to_state=row.lifecycle, reason=reason
        )
        log.info("deployment %s: %s", row.name, reason)


def _last_wanted(s: Session, name: str, parallelism: int) -> int | None:
    """The scale-up the previous evaluation found needed at this parallelism (one to confirm)."""
    last = deployments_repo.autoscaler_evaluations(s, name, limit=1)
    if not last or last[-1].parallelism != parallelism:
        return None
    wanted = (last[-1].figures or {}).get("wanted")
    return int(wanted) if isinstance(wanted, (int, float)) else None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _seconds(dt: datetime) -> float:
    return (dt if dt.tzinfo else dt.replace(tzinfo=timezone.utc)).timestamp()
