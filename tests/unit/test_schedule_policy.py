"""Scheduled submissions under a frozen clock: where ticks fall (Celery's cron arithmetic),
the misfire and overlap policies (shared/schedules.py), and the leader's beat
(services/jobmanager/schedule_beat.py) driving a real JobMaster on a SQLite catalog: one run per
tick, jobs linked to their schedule, a deposed leader committing nothing, a tick recorded once."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import select

from services.jobmanager.job_master import JobMaster
from services.jobmanager.schedule_beat import ScheduleBeat
from services.jobmanager.unit_of_work import LeadershipLost
from shared import schedules as sch
from shared.catalog import Catalog
from shared.catalog import repository as repo
from shared.catalog.models import Job, ScheduleRun
from shared.clock import FakeClock
from shared.messages import CancelJob
from shared.settings import Settings
from shared.transport import InMemoryTransport

UTC = timezone.utc
T0 = datetime(2027, 1, 4, 12, 0, 0, tzinfo=UTC)  # a Monday, at a whole minute


def at(**delta) -> datetime:
    return T0 + timedelta(**delta)


# --- where ticks fall ---------------------------------------------------------------------


def test_cron_ticks_are_celerys_and_strictly_after():
    every5 = sch.Timing(cron="*/5 * * * *")
    assert every5.next_after(T0) == at(minutes=5)  # never the tick we are at
    assert every5.next_after(at(minutes=3, seconds=59)) == at(minutes=5)
    assert sch.Timing(cron="0 0 1 * *").next_after(T0) == datetime(2027, 2, 1, tzinfo=UTC)
    assert sch.Timing(cron="30 2 * * 1").next_after(T0) == datetime(2027, 1, 11, 2, 30, tzinfo=UTC)
    assert sch.Timing(cron="59 23 * * *").next_after(at(hours=11, minutes=59)) == datetime(
        2027, 1, 5, 23, 59, tzinfo=UTC
    )


def test_interval_ticks_are_multiples_of_the_interval_whoever_computes_them():
    every7 = sch.Timing(every_s=7)
    a = every7.next_after(at(seconds=1))
    b = every7.next_after(at(seconds=1, milliseconds=900))
    assert a == b and a.timestamp() % 7 == 0 and at(seconds=1) < a <= at(seconds=8)
    assert every7.next_after(a) == a + timedelta(seconds=7)


@pytest.mark.parametrize(
    "expr, says",
    [
        ("* * *", "has 3 fields"),
        ("61 * * * *", "field minute '61'"),
        ("* 24 * * *", "field hour '24'"),
        ("* * 32 * *", "field day-of-month"),
        ("* * * 13 *", "field month"),
        ("* * * * 9", "field day-of-week"),
        ("", "is empty"),
        ("x * * * *", "field minute 'x'"),
    ],
)
def test_a_bad_cron_expression_says_which_field(expr, says):
    with pytest.raises(sch.CronError, match=says):
        sch.parse_cron(expr)


def test_a_timing_is_cron_or_interval():
    with pytest.raises(ValueError):
        sch.Timing()
    with pytest.raises(ValueError):
        sch.Timing(cron="* * * * *", every_s=5)
    with pytest.raises(ValueError):
        sch.Timing(every_s=0)


# --- misfire policy -------------------------------------------------------------------------


def test_nothing_is_due_before_the_next_tick():
    plan = sch.catch_up(sch.Timing(every_s=10), at(seconds=10), at(seconds=9), grace_s=60)
    assert plan == sch.CatchUp(None, (), 0, at(seconds=10))


def test_an_on_time_tick_fires_and_the_next_follows():
    plan = sch.catch_up(sch.Timing(every_s=10), at(seconds=10), at(seconds=10, milliseconds=300), grace_s=60)
    assert plan.fire == at(seconds=10) and plan.misfired == () and plan.next_fire_at == at(seconds=20)


def test_after_an_outage_the_newest_missed_tick_fires_once_and_older_ones_are_misfires():
    plan = sch.catch_up(sch.Timing(every_s=10), at(seconds=10), at(seconds=45), grace_s=60)
    assert plan.fire == at(seconds=40)
    assert plan.misfired == (at(seconds=10), at(seconds=20), at(seconds=30))
    assert plan.next_fire_at == at(seconds=50)


def test_a_newest_tick_older_than_the_grace_does_not_fire():
    plan = sch.catch_up(sch.Timing(cron="*/5 * * * *"), at(minutes=5), at(minutes=13), grace_s=60)
    assert plan.fire is None and plan.misfired == (at(minutes=5), at(minutes=10))
    assert plan.next_fire_at == at(minutes=15)
    assert sch.catch_up(sch.Timing(cron="*/5 * * * *"), at(minutes=5), at(minutes=13), grace_s=200).fire == at(
        minutes=10
    )


def test_a_long_outage_records_at_most_a_hundred_misfires_and_never_bursts():
    plan = sch.catch_up(sch.Timing(every_s=1), at(seconds=1), at(hours=3), grace_s=60)
    assert plan.fire == at(hours=3)
    assert len(plan.misfired) == sch.MAX_MISFIRE_ROWS and plan.misfired[-1] == at(hours=3, seconds=-1)
    assert plan.dropped == 3 * 3600 - 1 - sch.MAX_MISFIRE_ROWS
    weekly = sch.catch_up(sch.Timing(cron="0 0 * * 1"), datetime(2026, 1, 5, tzinfo=UTC), T0, grace_s=60)
    assert weekly.fire is None and weekly.next_fire_at == datetime(2027, 1, 11, tzinfo=UTC)


# --- overlap policy -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "policy, running, queued, action",
    [
        ("skip", False, False, sch.SUBMIT),
        ("queue", False, False, sch.SUBMIT),
        ("cancel_previous", False, False, sch.SUBMIT),
        ("skip", True, False, sch.SKIP),
        ("queue", True, False, sch.QUEUE),
        ("cancel_previous", True, False, sch.CANCEL_AND_SUBMIT),
        ("queue", True, True, sch.SKIP),  # at most one tick waits
    ],
)
def test_overlap_actions(policy, running, queued, action):
    assert sch.overlap_action(policy, running, queued) == action


# --- the beat on a real JobMaster and catalog, frozen wall clock -------------------------------


class Leader:
    def __init__(self, catalog: Catalog, settings: Settings, clock: FakeClock, epoch: int):
        self.jm = JobMaster(
            settings,
            catalog,
            InMemoryTransport(sender="jobmanager", epoch=epoch),
            gateway=None,
            clock=FakeClock(),
            epoch=epoch,
        )
        with self.jm.unit_of_work():
            self.jm.recover()
        self.beat = ScheduleBeat(self.jm, clock, first_pass_after_s=0, monotonic=lambda: 0.0)


@pytest.fixture
def env(tmp_path):
    settings = Settings(home=tmp_path)
    catalog = Catalog(settings.catalog)
    catalog.migrate()
    with catalog.session() as s:
        repo.create_artifact(
            s, id="jar-1", name="nightly.py", path=str(tmp_path / "nightly.py"), size=1, sha256="0" * 64
        )
    clock = FakeClock(start=T0.timestamp())
    yield catalog, settings, clock
    catalog.dispose()


def make_schedule(catalog, clock, *, every_s=10, overlap="skip", grace=60) -> str:
    sid = sch.new_schedule_id()
    timing = sch.Timing(every_s=every_s)
    now = datetime.fromtimestamp(clock.now(), tz=UTC)
    with catalog.session() as s:
        repo.create_schedule(
            s,
            id=sid,
            name="nightly",
            artifact_id="jar-1",
            entry="build",
            kind="noop",
            parallelism=1,
            program_args=["--day", "today"],
            config={},
            restart_strategy={"type": "none"},
            cron=None,
            every_s=every_s,
            overlap=overlap,
            misfire_grace_s=grace,
            enabled=True,
            next_fire_at=timing.next_after(now),
        )
    return sid


def runs(catalog, sid) -> list[tuple[datetime, str, str | None]]:
    with catalog.session() as s:
        rows = s.execute(select(ScheduleRun).where(ScheduleRun.schedule_id == sid).order_by(ScheduleRun.tick_at))
        return [
            (r.tick_at.replace(tzinfo=UTC) if r.tick_at.tzinfo is None else r.tick_at, r.outcome, r.job_id)
            for r in rows.scalars()
        ]


def job(catalog, job_id) -> Job:
    with catalog.session() as s:
        return repo.get_job(s, job_id)


def end(leader: Leader, job_id: str) -> None:
    with leader.jm.unit_of_work():
        leader.jm.on_cancel(CancelJob(job_id=job_id))


def test_each_tick_is_one_job_linked_to_its_schedule(env):
    catalog, settings, clock = env
    leader = Leader(catalog, settings, clock, epoch=1)
    sid = make_schedule(catalog, clock, overlap="queue")
    leader.beat.tick()
    assert runs(catalog, sid) == []  # not yet due
    clock.advance(10)
    leader.beat.tick()
    leader.beat.tick()  # the same instant again: nothing new
    [(tick, outcome, job_id)] = runs(catalog, sid)
    assert (tick, outcome) == (at(seconds=10), sch.SUBMITTED)
    first = job(catalog, job_id)
    assert first.schedule_id == sid and first.kind == "noop" and first.program_args == ["--day", "today"]
    assert first.status == "RUNNING"  # handed to this leader's JobMaster: planned, slots requested
    clock.advance(10)
    leader.beat.tick()  # the previous run goes on: this tick waits (queue)
    clock.advance(10)
    leader.beat.tick()  # a second one would wait too: skipped (at most one waits)
    assert [o for _, o, _ in runs(catalog, sid)] == [sch.SUBMITTED, sch.QUEUED, sch.SKIPPED_OVERLAP]
    end(leader, job_id)
    leader.beat.tick()
    outcomes = runs(catalog, sid)
    assert outcomes[1][1] == sch.SUBMITTED and outcomes[1][0] == at(seconds=20)
    assert job(catalog, outcomes[1][2]).schedule_id == sid


def test_cancel_previous_cancels_the_running_job(env):
    catalog, settings, clock = env
    leader = Leader(catalog, settings, clock, epoch=1)
    sid = make_schedule(catalog, clock, overlap="cancel_previous")
    clock.advance(10)
    leader.beat.tick()
    clock.advance(10)
    leader.beat.tick()
    (_, _, first), (_, outcome, second) = runs(catalog, sid)
    assert outcome == sch.SUBMITTED and second != first
    assert job(catalog, first).status == "CANCELED" and job(catalog, second).status == "RUNNING"


def test_skip_policy_skips_while_the_previous_run_lives(env):
    catalog, settings, clock = env
    leader = Leader(catalog, settings, clock, epoch=1)
    sid = make_schedule(catalog, clock, overlap="skip")
    clock.advance(10)
    leader.beat.tick()
    clock.advance(10)
    leader.beat.tick()
    assert [o for _, o, _ in runs(catalog, sid)] == [sch.SUBMITTED, sch.SKIPPED_OVERLAP]


def test_a_new_leader_after_an_outage_fires_the_newest_tick_once_and_records_the_misfires(env):
    catalog, settings, clock = env
    old = Leader(catalog, settings, clock, epoch=1)
    sid = make_schedule(catalog, clock, overlap="queue")
    clock.advance(10)
    old.beat.tick()
    end(old, runs(catalog, sid)[0][2])
    clock.advance(35)  # nobody leads for a while: ticks at 20, 30 and 40 s pass
    new = Leader(catalog, settings, clock, epoch=2)
    new.beat.tick()
    new.beat.tick()
    assert [(t, o) for t, o, _ in runs(catalog, sid)] == [
        (at(seconds=10), sch.SUBMITTED),
        (at(seconds=20), sch.SKIPPED_MISFIRE),
        (at(seconds=30), sch.SKIPPED_MISFIRE),
        (at(seconds=40), sch.SUBMITTED),
    ]
    # The deposed leader wakes up: its beat commits nothing and it learns it no longer leads.
    clock.advance(10)
    with pytest.raises(LeadershipLost):
        old.beat.tick()
    assert len(runs(catalog, sid)) == 4
    new.beat.tick()
    assert runs(catalog, sid)[-1][:2] == (at(seconds=50), sch.QUEUED)  # the 40 s run still lives


def test_a_tick_recorded_by_another_leader_is_not_recorded_again(env):
    catalog, settings, clock = env
    leader = Leader(catalog, settings, clock, epoch=1)
    sid = make_schedule(catalog, clock)
    clock.advance(10)
    leader.beat.tick()
    # As if a second JobManager had read the schedule before the first one's commit.
    with catalog.session() as s:
        repo.get_schedule(s, sid, lock=True).next_fire_at = at(seconds=10)
    with catalog.session() as s:
        jobs_before = s.execute(select(Job.id)).scalars().all()
    leader.beat.tick()
    assert [(t, o) for t, o, _ in runs(catalog, sid)] == [(at(seconds=10), sch.SUBMITTED)]
    with catalog.session() as s:
        assert s.execute(select(Job.id)).scalars().all() == jobs_before  # the rolled-back job is gone too


def test_a_paused_schedule_does_not_fire_and_a_deleted_jar_is_skipped(env):
    catalog, settings, clock = env
    leader = Leader(catalog, settings, clock, epoch=1)
    sid = make_schedule(catalog, clock)
    with catalog.session() as s:
        repo.set_schedule_enabled(s, repo.get_schedule(s, sid, lock=True), False, None)
    clock.advance(30)
    leader.beat.tick()
    assert runs(catalog, sid) == []
    now = datetime.fromtimestamp(clock.now(), tz=UTC)
    with catalog.session() as s:
        repo.set_schedule_enabled(s, repo.get_schedule(s, sid, lock=True), True, sch.Timing(every_s=10).next_after(now))
        repo.delete_artifact(s, "jar-1")
    clock.advance(10)
    leader.beat.tick()
    assert [(t, o) for t, o, _ in runs(catalog, sid)] == [(at(seconds=40), "skipped_missing_jar")]
