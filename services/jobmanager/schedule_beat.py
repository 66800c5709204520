"""The beat of scheduled submissions, run by the leading JobManager only.

A standby never builds one (it runs no `lead()`), so a standby's beat does nothing by
construction; the leader ticks it from its loop (services/jobmanager/__main__.py). The
arithmetic of when ticks fall is Celery beat's own (`celery.schedules.crontab` / `schedule`, in
shared/schedules.py); what Celery's `beat.Scheduler` does not give is a tick that fires once
across a leader change, because it times an entry from when it last *ran*. Here ticks are
nominal times computed from the schedule alone, and each firing is a unit of work of the leader:

  lock the schedule row -> record one `schedule_runs` row per handled tick (UNIQUE(schedule_id,
  tick_at)) -> create the run's job as POST /jars/{id}/run would and hand it to this leader's
  JobMaster (`on_submit`: the plan, the slot request in the outbox) -> move `next_fire_at` ->
  the leadership check -> commit.

A deposed leader therefore commits nothing, and two leaders overlapping for a moment cannot both
record a tick: the second insert violates the unique key and its whole unit of work rolls back.

Overlap (the schedule's previous run has not ended): `skip` records skipped_overlap; `queue`
records the tick as queued (at most one waits; later ticks are skipped) and submits it when the
previous run ends; `cancel_previous` cancels the previous job and submits the new one at once
(its slots come when the previous attempt's are released).

Misfires (ticks that came while no leader ran, or while the catalog was unreachable): the newest
missed tick fires if it is at most `misfire_grace_s` old; older ones are recorded as
skipped_misfire (at most 100 of them); never a burst (shared/schedules.py `catch_up`).
"""

from __future__ import annotations

import logging
import time
from datetime import datetime, timezone
from typing import Callable, ContextManager, Protocol

from sqlalchemy.exc import IntegrityError

from services.jobmanager.unit_of_work import LeadershipLost, UnitOfWork
from shared import schedules as sch
from shared.catalog import Catalog
from shared.catalog import repository as repo
from shared.catalog.models import Schedule
from shared.clock import Clock, WallClock
from shared.ids import JobId, new_job_id
from shared.messages import CancelJob, SubmitJob
from shared.states import JobStatus as JS

log = logging.getLogger("headrace.jobmanager.schedules")

SKIPPED_MISSING_JAR = "skipped_missing_jar"
SKIPPED_DELETED = "skipped_deleted"


class Submitter(Protocol):
    """What the beat asks of the leader's job master: its catalog and unit of work, and the
    submission and cancellation of a run's job inside it."""

    catalog: Catalog
    uow: UnitOfWork

    def unit_of_work(self) -> ContextManager[None]: ...

    def on_submit(self, msg: SubmitJob) -> None: ...

    def on_cancel(self, msg: CancelJob) -> None: ...


class ScheduleBeat:
    """Ticked by the leader's loop; `tick()` fires what is due, each schedule in its own unit of
    work. `clock`: wall-clock seconds (tick times are shared by every JobManager)."""

    INTERVAL_S = 0.25
    RETRY_S = 1.0
    # A new leader first reads what its predecessor left in hr:stream:jm (a run's FINISHED report
    # among it) before judging whether a schedule's previous run still lives.
    FIRST_PASS_AFTER_S = 1.0

    def __init__(
        self,
        master: Submitter,
        clock: Clock | None = None,
        *,
        interval_s: float = INTERVAL_S,
        first_pass_after_s: float = FIRST_PASS_AFTER_S,
        monotonic: Callable[[], float] = time.monotonic,
    ):
        self.master, self.clock = master, clock or WallClock()
        self.interval_s, self.monotonic = interval_s, monotonic
        self._next_pass = monotonic() + first_pass_after_s

    def due(self) -> bool:
        return self.monotonic() >= self._next_pass

    def now(self) -> datetime:
        return datetime.fromtimestamp(self.clock.now(), tz=timezone.utc)

    def tick(self) -> None:
        """One pass. LeadershipLost propagates (the loop stops leading); anything else is logged
        and the pass is tried again a second later: nothing of a failed firing was committed."""
        self._next_pass = self.monotonic() + self.interval_s
        now = self.now()
        try:
            with self.master.catalog.session() as s:
                due = repo.due_schedule_ids(s, now)
                waiting = {r.schedule_id for r in repo.queued_schedule_runs(s)}
        except Exception:  # catalog unreachable: the loop goes on, ticks wait
            log.warning("schedules: cannot read the catalog; trying again in %.0f s", self.RETRY_S, exc_info=True)
            self._next_pass = self.monotonic() + self.RETRY_S
            return
        for schedule_id in dict.fromkeys([*due, *sorted(waiting)]):
            try:
                with self.master.unit_of_work():
                    self.fire(schedule_id, now)
            except LeadershipLost:
                raise
            except IntegrityError:
                # Another JobManager recorded this tick (two leaders for a moment): ours rolled
                # back whole; the next pass reads the schedule as the other one left it.
                log.warning(
                    "schedule %s: a tick was recorded by another JobManager meanwhile; nothing of ours was committed",
                    schedule_id,
                )
            except Exception:
                log.exception(
                    "schedule %s: firing failed (nothing committed); trying again in %.0f s", schedule_id, self.RETRY_S
                )
                self._next_pass = self.monotonic() + self.RETRY_S

    # --- one schedule, inside the leader's unit of work --------------------------------------

    def fire(self, schedule_id: str, now: datetime) -> None:
        submit: list[JobId] = []
        cancel: list[JobId] = []
        with self.master.uow.tx() as s:  # the session of the unit of work `tick` opened
            try:
                sched = repo.get_schedule(s, schedule_id, lock=True)
            except repo.NotFound:
                return  # deleted meanwhile
            if not sched.enabled:
                return
            submit += self._release_queued(s, sched)
            if sched.next_fire_at is not None and _utc(sched.next_fire_at) <= now:
                self._fire_due_ticks(s, sched, now, submit, cancel)
        # Through this leader's own JobMaster, in the same unit of work: the job, its plan and
        # its slot request commit together with the run row.
        for job_id in cancel:
            self.master.on_cancel(CancelJob(job_id=job_id))
        for job_id in submit:
            self.master.on_submit(SubmitJob(job_id=job_id))

    def _fire_due_ticks(self, s, sched: Schedule, now: datetime, submit: list[JobId], cancel: list[JobId]) -> None:
        due_at = sched.next_fire_at
        assert due_at is not None  # due_schedules selects only schedules with a next tick
        timing = sch.Timing(cron=sched.cron, every_s=sched.every_s)
        plan = sch.catch_up(timing, _utc(due_at), now, sched.misfire_grace_s)
        for tick in plan.misfired:
            repo.record_schedule_run(s, schedule_id=sched.id, tick_at=tick, outcome=sch.SKIPPED_MISFIRE)
        if plan.misfired or plan.dropped:
            log.warning(
                "schedule %s (%s): %d missed tick(s) recorded as skipped_misfire%s (misfire grace %d s)",
                sched.id,
                sched.name,
                len(plan.misfired),
                f", {plan.dropped} older ones not recorded" if plan.dropped else "",
                sched.misfire_grace_s,
            )
        if plan.fire is not None:
            self._fire_tick(s, sched, plan.fire, submit, cancel)
        repo.advance_schedule(s, sched, next_fire_at=plan.next_fire_at, fired_at=plan.fire)

    def _fire_tick(self, s, sched: Schedule, tick: datetime, submit: list[JobId], cancel: list[JobId]) -> None:
        if repo.find_artifact(s, sched.artifact_id) is None:
            repo.record_schedule_run(s, schedule_id=sched.id, tick_at=tick, outcome=SKIPPED_MISSING_JAR)
            log.warning(
                "schedule %s (%s): jar %s no longer exists; tick %s skipped",
                sched.id,
                sched.name,
                sched.artifact_id,
                tick.isoformat(),
            )
            return
        previous = repo.last_schedule_job(s, sched.id)
        running = previous is not None and not JS(previous.status).is_terminal
        queued = bool(repo.queued_schedule_runs(s, sched.id))
        action = sch.overlap_action(sched.overlap, running, queued)
        if action == sch.SKIP:
            repo.record_schedule_run(s, schedule_id=sched.id, tick_at=tick, outcome=sch.SKIPPED_OVERLAP)
            log.info(
                "schedule %s (%s): tick %s skipped, run %s has not ended",
                sched.id,
                sched.name,
                tick.isoformat(),
                previous.id if previous else "(queued)",
            )
            return
        if action == sch.QUEUE:
            repo.record_schedule_run(s, schedule_id=sched.id, tick_at=tick, outcome=sch.QUEUED)
            log.info(
                "schedule %s (%s): tick %s queued behind job %s",
                sched.id,
                sched.name,
                tick.isoformat(),
                previous.id if previous else "(none)",
            )
            return
        if action == sch.CANCEL_AND_SUBMIT and previous is not None:  # chosen only while it runs
            cancel.append(previous.id)
            log.info(
                "schedule %s (%s): cancelling job %s for tick %s", sched.id, sched.name, previous.id, tick.isoformat()
            )
        job = repo.create_scheduled_job(s, sched, new_job_id())
        repo.record_schedule_run(s, schedule_id=sched.id, tick_at=tick, outcome=sch.SUBMITTED, job_id=job.id)
        submit.append(job.id)
        log.info("schedule %s (%s): tick %s submitted job %s", sched.id, sched.name, tick.isoformat(), job.id)

    def _release_queued(self, s, sched: Schedule) -> list[JobId]:
        """A queued tick whose previous run has ended is submitted now."""
        waiting = repo.queued_schedule_runs(s, sched.id)
        if not waiting:
            return []
        previous = repo.last_schedule_job(s, sched.id)
        if previous is not None and not JS(previous.status).is_terminal:
            return []
        run = waiting[0]
        if repo.find_artifact(s, sched.artifact_id) is None:
            repo.set_schedule_run(s, run, outcome=SKIPPED_MISSING_JAR)
            return []
        job = repo.create_scheduled_job(s, sched, new_job_id())
        repo.set_schedule_run(s, run, outcome=sch.SUBMITTED, job_id=job.id)
        log.info(
            "schedule %s (%s): queued tick %s submitted job %s (the previous run ended)",
            sched.id,
            sched.name,
            _utc(run.tick_at).isoformat(),
            job.id,
        )
        return [job.id]


def _utc(t: datetime) -> datetime:
    return t.replace(tzinfo=timezone.utc) if t.tzinfo is None else t.astimezone(timezone.utc)
