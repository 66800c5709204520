"""Scheduled submissions: when a schedule's ticks fall, and what a tick does when the previous
run is still going or the tick was missed. Pure functions of a clock value: the dispatcher uses
them to validate and to compute the first tick, the leading JobManager's beat
(services/jobmanager/schedule_beat.py) to fire.

Tick times are *nominal*: computed from the schedule alone (a cron expression, or multiples of
`every_s` seconds since the Unix epoch), never from when a JobManager happened to look. Two
leaders that overlap for a moment therefore name the same tick the same way, and the catalog's
UNIQUE(schedule_id, tick_at) lets only one of them record it. The cron arithmetic is Celery's
(`celery.schedules.crontab`, the one its beat uses); interval arithmetic is
`celery.schedules.schedule`'s `run_every`.
"""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from celery.schedules import crontab, schedule

from shared.errors import ConfigError

OVERLAP_POLICIES = ("skip", "queue", "cancel_previous")
DEFAULT_MISFIRE_GRACE_S = 60
MAX_MISFIRE_GRACE_S = 86400
# A catch-up records at most this many missed ticks as skipped_misfire (the newest ones): an
# every-second schedule after an hour without a leader must not write 3,600 rows in one go.
MAX_MISFIRE_ROWS = 100
CRON_EXAMPLE = "*/5 * * * *  (every 5 minutes; fields: minute hour day-of-month month day-of-week, UTC)"

# Outcomes of a tick, as recorded in schedule_runs.outcome.
SUBMITTED = "submitted"
QUEUED = "queued"
SKIPPED_OVERLAP = "skipped_overlap"
SKIPPED_MISFIRE = "skipped_misfire"
OUTCOMES = (SUBMITTED, QUEUED, SKIPPED_OVERLAP, SKIPPED_MISFIRE)


class CronError(ConfigError, ValueError):
    """A cron expression that cannot be used; the message says what is wrong."""


def parse_cron(expr: str) -> crontab:
    """A standard 5-field cron expression (UTC) as Celery's crontab; CronError saying what is
    wrong otherwise."""
    if not isinstance(expr, str) or not expr.strip():
        raise CronError("is empty")
    fields = expr.split()
    if len(fields) != 5:
        raise CronError(
            f"has {len(fields)} field{'s' if len(fields) != 1 else ''}, a cron expression has 5 "
            "(minute hour day-of-month month day-of-week)"
        )
    names = ("minute", "hour", "day-of-month", "month", "day-of-week")
    for name, value in zip(names, fields, strict=True):
        try:
            # Field by field, so the message can name the one that is wrong.
            crontab(**{_CELERY_FIELD[name]: value})
        except (ValueError, IndexError, KeyError, TypeError) as exc:
            raise CronError(f"field {name} {value!r} is not valid ({exc})") from None
    try:
        cron = crontab.from_string(" ".join(fields))
        next_tick(cron, datetime(2000, 1, 1, tzinfo=timezone.utc))
    except (ValueError, IndexError, KeyError, TypeError, RuntimeError) as exc:
        raise CronError(f"is not valid ({exc})") from None
    return cron


_CELERY_FIELD = {
    "minute": "minute",
    "hour": "hour",
    "day-of-month": "day_of_month",
    "month": "month_of_year",
    "day-of-week": "day_of_week",
}


@dataclass(frozen=True)
class Timing:
    """When a schedule's ticks fall: a cron expression or an interval in whole seconds."""

    cron: str | None = None
    every_s: int | None = None

    def __post_init__(self) -> None:
        if (self.cron is None) == (self.every_s is None):
            raise ValueError("a schedule has either a cron expression or an interval, exactly one")
        if self.every_s is not None and self.every_s < 1:
            raise ValueError("the interval is at least 1 second")

    def celery_schedule(self):
        if self.cron is not None:
            return parse_cron(self.cron)
        assert self.every_s is not None  # __post_init__: a cron expression or an interval
        return schedule(run_every=timedelta(seconds=self.every_s))

    def next_after(self, t: datetime) -> datetime:
        """The first nominal tick strictly after `t` (UTC)."""
        t = _utc(t)
        sched = self.celery_schedule()
        if isinstance(sched, crontab):
            return next_tick(sched, t)
        step = sched.run_every.total_seconds()
        # Multiples of the interval since the epoch: every leader computes the same ticks.
        k = math.floor(t.timestamp() / step) + 1
        return datetime.fromtimestamp(k * step, tz=timezone.utc)


def next_tick(cron: crontab, t: datetime) -> datetime:
    """Celery's own next run after `t` (its remaining_delta), at whole minutes."""
    last, delta, _ = cron.remaining_delta(_utc(t), tz=timezone.utc)
    nxt = (last + delta).astimezone(timezone.utc)
    if nxt <= t:  # crontab compares minutes only: never return the tick we are at
        return next_tick(cron, t.replace(second=0, microsecond=0) + timedelta(minutes=1) - timedelta(microseconds=1))
    return nxt


def _utc(t: datetime) -> datetime:
    return t.replace(tzinfo=timezone.utc) if t.tzinfo is None else t.astimezone(timezone.utc)


@dataclass(frozen=True)
class CatchUp:
    """What a beat pass does with one schedule whose next tick has come."""

    fire: datetime | None  # the tick to fire now (None: nothing is due, or it is too late)
    misfired: tuple[datetime, ...]  # ticks recorded as skipped_misfire (oldest first)
    dropped: int  # older missed ticks not recorded at all (beyond MAX_MISFIRE_ROWS)
    next_fire_at: datetime  # the schedule's next tick after this pass


# Long outages are not walked tick by tick from their start: ticks this far before `now` are
# beyond any grace (MAX_MISFIRE_GRACE_S) and beyond what is recorded for an every-minute cron.
_WALK_WINDOW = timedelta(seconds=MAX_MISFIRE_GRACE_S * 2)


def catch_up(timing: Timing, next_fire_at: datetime, now: datetime, grace_s: float) -> CatchUp:
    """The misfire policy. Every tick from `next_fire_at` up to `now` is due. The newest of them
    fires if it is at most `grace_s` old; every older one (and the newest, if too old) is a
    misfire: recorded as skipped_misfire, at most MAX_MISFIRE_ROWS of them, newest first kept.
    Never a burst: one pass fires at most one tick."""
    next_fire_at, now = _utc(next_fire_at), _utc(now)
    if next_fire_at > now:
        return CatchUp(None, (), 0, next_fire_at)
    dropped = 0
    start = next_fire_at
    if now - start > _WALK_WINDOW:
        floor = now - _WALK_WINDOW
        first_kept = timing.next_after(floor - timedelta(microseconds=1))
        dropped = _count_ticks(timing, start, first_kept)
        start = first_kept
    due: list[datetime] = []
    t = start
    while t <= now:
        due.append(t)
        t = timing.next_after(t)
    newest = due[-1] if due else None
    older = due[:-1]
    fire = None
    if newest is not None and (now - newest).total_seconds() <= grace_s:
        fire = newest
    else:
        older = due
    if len(older) > MAX_MISFIRE_ROWS:
        dropped += len(older) - MAX_MISFIRE_ROWS
        older = older[-MAX_MISFIRE_ROWS:]
    return CatchUp(fire, tuple(older), dropped, t)


def _count_ticks(timing: Timing, start: datetime, end: datetime) -> int:
    """Ticks in [start, end), for the log: exact for intervals; for cron walked, at most 10,000."""
    if timing.every_s is not None:
        return max(0, math.ceil((end - start).total_seconds() / timing.every_s))
    n, t = 0, start
    while t < end and n < 10_000:
        n += 1
        t = timing.next_after(t)
    return n


# --- overlap ---------------------------------------------------------------------------------

SUBMIT = "submit"
CANCEL_AND_SUBMIT = "cancel_and_submit"
QUEUE = "queue"
SKIP = "skip"


def overlap_action(policy: str, previous_running: bool, already_queued: bool) -> str:
    """What a firing tick does, given whether the schedule's previous run (job) has not ended and
    whether a tick already waits for it (at most one waits: any more are skipped)."""
    if policy not in OVERLAP_POLICIES:
        raise ValueError(f"unknown overlap policy {policy!r}")
    if already_queued:
        # A waiting tick goes first, whatever else: it is submitted when the previous run ends.
        return SKIP
    if not previous_running:
        return SUBMIT
    return {"skip": SKIP, "queue": QUEUE, "cancel_previous": CANCEL_AND_SUBMIT}[policy]


def epoch_ms(t: datetime | None) -> int | None:
    return None if t is None else int(_utc(t).timestamp() * 1000)


def new_schedule_id() -> str:
    return uuid.uuid4().hex
