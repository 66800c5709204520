"""The autoscaler's decision for a streaming deployment: the parallelism its task needs, from the
task's own figures over the metrics window. Pure: the JobManager's autoscaler
(services/jobmanager/autoscaler.py) reads the figures and carries a decision out through the
deployment's rescale (shared/deployments.py); this module only decides, and says why.

The model. A micro-batch costs a fixed part (planning, the offsets and commit logs, the state
store's and the sink's commits) and a part per row. While rows wait, Spark starts the next batch
as soon as one ends, so the time in batches over the wall time (the busy fraction) is near 1 for
a lightly loaded task too: its batches are short and back to back. What bounds a task is the
per-row part, so its capacity (rows per second at the current parallelism) is taken as
rows ÷ (batch time − the fixed part). The fixed part is not measured, and it changes with the
machine's load, so each direction reads it the way that makes acting harder: a scale-up takes it
as the window's shortest batch (at most the fixed part now: the capacity comes out high), a
scale-down as the shortest batch ever seen (`Situation.fixed_cost_s`, at least as low as the
fixed part: the capacity comes out low). Estimation noise then only ever keeps the parallelism.
The low estimate alone would pin a lightly loaded task on a busy machine, whose fixed part grew
past the shortest batch ever seen, at its parallelism for good; so it is never below the rate the
attempt has shown since it settled (`shown_rate`: a batch's rows over its own time, fixed part
included, which no capacity is below).
In a steady state all batches are alike and the window alone says nothing of the per-row part;
a task that cannot keep up shows it anyway (saturated): fully busy with a backlog at planning, a
growing lag or growing batches. Its capacity is then at most what it reads per second of busy time
(Flink's "true processing rate"). Batches also grow when the machine's load grows their fixed
part; those are told apart by a batch that processed its rows faster than the input, its time
less the shortest batch seen before (`_proven_rate`), which a task that cannot keep up does not
show once its batches have outgrown that one.

The arrival rate is what the task read per second plus the growth of its lag. What it read is the
median of its batches' input rates (Spark's inputRowsPerSecond: a batch's rows over the time since
the batch before it started), so the backlog one batch takes in after a start or a rescale does
not pass for input; without a row limit per batch a source reads all it has, and its lag stays 0. The parallelism
needed is the one at which the arrival rate plus the backlog drained over `catchUp` takes
`targetUtilization` of the capacity, bounded by min/max and by the job's state partitions (a
stateful stage cannot use more cores than it has partitions). A scale-down needs the current input
alone below the target less SCALE_DOWN_BAND at the lower parallelism, and a lag that is not growing. Nothing is decided
during `stabilization` after a start, a rescale or a rollback, which also makes at most one rescale
per stabilization period; the ceiling of a target below 1 leaves a band in which neither way is
taken, so a noisy input does not flap.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Mapping, Sequence

from shared import durations

DEFAULT_TARGET_UTILIZATION = 0.7
DEFAULT_METRICS_WINDOW_S = 30.0
DEFAULT_STABILIZATION_S = 60.0
DEFAULT_CATCH_UP_S = 120.0
# Figures the window must hold to decide: points, and the share of the window they span. A task
# falling behind runs ever longer batches (a source reads all it has unless limited), so a window
# with fewer points reaches back for them, at most MAX_WINDOW_STRETCH windows.
MIN_POINTS = 4
MIN_WINDOW_SHARE = 0.5
MAX_WINDOW_STRETCH = 4
# A lag growing faster than this share of the read rate counts as growing (noise aside).
LAG_GROWTH_SHARE = 0.02
# Busy fraction from which a task counts as saturated when it is also behind: a backlog of more
# than BACKLOG_S of its input at planning, a growing lag, or growing batches (`_growing`).
SATURATED_BUSY = 0.9
# The rows of the window's batches must spread this much (standard deviation over mean) for their
# durations to tell the per-row cost apart from the fixed one.
MIN_ROWS_SPREAD = 0.1
BACKLOG_S = 1.0
BATCH_GROWTH = 1.25
BATCH_GROWTH_STEADY = 1.15
# A scale-down needs the lower parallelism below the target by this much: an input that wavers
# around the target does not move the parallelism back and forth.
SCALE_DOWN_BAND = 0.1
# Batches of fewer rows than this tell nothing of a per-row cost (their time is the fixed part),
# and a window carrying under MIN_ROWS_PER_S is an input that (almost) stopped: such a window
# decides nothing. Both must hold: a modest steady input in quick batches (20 rows/s in batches
# of 0.5 s) is a real load to keep or scale down for.
MIN_ROWS_PER_BATCH = 10.0
MIN_ROWS_PER_S = 1.0


@dataclass(frozen=True)
class AutoscalerSpec:
    """A deployment's `autoscaler:` block as stored (durations in seconds)."""

    enabled: bool = False
    min_parallelism: int = 1
    max_parallelism: int = 1
    target_utilization: float = DEFAULT_TARGET_UTILIZATION
    metrics_window_s: float = DEFAULT_METRICS_WINDOW_S
    stabilization_s: float = DEFAULT_STABILIZATION_S
    catch_up_s: float = DEFAULT_CATCH_UP_S

    @classmethod
    def from_record(cls, rec: Mapping[str, Any] | None, *, parallelism: int = 1) -> "AutoscalerSpec":
        rec = rec or {}
        if not rec.get("enabled"):
            return cls()
        return cls(
            enabled=True,
            min_parallelism=int(rec.get("minParallelism") or 1),
            max_parallelism=int(rec.get("maxParallelism") or max(parallelism, 1)),
            target_utilization=float(rec.get("targetUtilization") or DEFAULT_TARGET_UTILIZATION),
            metrics_window_s=durations.parse_duration(rec.get("metricsWindow") or DEFAULT_METRICS_WINDOW_S),
            stabilization_s=durations.parse_duration(
                DEFAULT_STABILIZATION_S if rec.get("stabilization") is None else rec["stabilization"]
            ),
            catch_up_s=durations.parse_duration(rec.get("catchUp") or DEFAULT_CATCH_UP_S),
        )


@dataclass(frozen=True)
class Point:
    """One micro-batch's figures as the task's TaskManager recorded them (a point of
    shared/streams.py progress_history_key)."""

    at_s: float  # wall-clock seconds, when the batch ended
    batch_id: int
    rows: int
    duration_s: float | None
    lag: float | None = None
    input_rate: float | None = None  # Spark's inputRowsPerSecond: rows over the time since the previous batch
    source_partitions: int | None = None  # the Kafka partitions the sources read (None: not Kafka)


@dataclass(frozen=True)
class Situation:
    parallelism: int  # the running task's
    partitions: int  # the job's state partitions (its shuffle partitions, fixed at first start)
    now_s: float
    quiet_s: float | None  # since the last start, rescale or rollback; None: unknown (a start)
    held: str | None = None  # why the autoscaler holds off (its last rescale was rolled back)
    fixed_cost_s: float | None = None  # the shortest batch seen before this window
    # The most slots one TaskManager could give the task (its free slots, with the task's own where
    # it runs); None: not bounded by slots (a Spark standalone cluster runs the work).
    slot_capacity: int | None = None
    # The parallelism the previous evaluation found needed above the current one (None: none).
    last_wanted: int | None = None


class Outcome(str, Enum):
    SCALE_UP = "scale-up"
    SCALE_DOWN = "scale-down"
    KEEP = "keep"  # figures read, the parallelism is right
    WAIT = "wait"  # no decision: stabilizing, or too few figures
    HELD = "held"  # no decision: a rescale of the autoscaler's was rolled back


@dataclass(frozen=True)
class Evaluation:
    at_s: float
    parallelism: int
    proposed: int
    outcome: Outcome
    reason: str
    figures: Mapping[str, float | int | None] = field(default_factory=dict)
    wanted: int | None = None  # a scale-up this evaluation found needed but waits to see confirmed

    @property
    def rescale(self) -> bool:
        return self.outcome in (Outcome.SCALE_UP, Outcome.SCALE_DOWN)

    def record(self) -> dict[str, Any]:
        # A wanted scale-up travels with the figures, where the next evaluation reads it back.
        figures = dict(self.figures) | ({"wanted": self.wanted} if self.wanted is not None else {})
        return {
            "at": self.at_s,
            "parallelism": self.parallelism,
            "proposed": self.proposed,
            "outcome": self.outcome.value,
            "reason": self.reason,
            "figures": figures,
        }


@dataclass(frozen=True)
class Figures:
    """What the window says about the task, at its current parallelism (rates in rows per second)."""

    span_s: float
    busy: float  # time in batches ÷ wall time
    read_rate: float
    lag: float
    lag_growth: float  # rows per second (negative: draining)
    arrival_rate: float
    fixed_cost_s: float  # the lower estimate, the scale-down's
    capacity: float  # rows per second at its parallelism, the high estimate (inf: no per-row cost seen)
    capacity_low: float  # the low estimate, from the lowest fixed cost seen or the rate shown
    saturated: bool
    shown_rate: float = 0.0  # the most rows per second of batch time a batch of this attempt processed

    def record(self) -> dict[str, float | int | None]:
        def rounded(x: float) -> float | None:
            return None if math.isinf(x) else round(x, 4)

        return {
            "spanS": round(self.span_s, 2),
            "busy": round(self.busy, 3),
            "readRate": round(self.read_rate, 1),
            "lag": round(self.lag, 1),
            "lagGrowth": round(self.lag_growth, 1),
            "arrivalRate": round(self.arrival_rate, 1),
            "fixedCostS": round(self.fixed_cost_s, 4),
            "capacity": rounded(self.capacity),
            "capacityLow": rounded(self.capacity_low),
            "saturated": int(self.saturated),
            "shownRate": round(self.shown_rate, 1),
        }


def window(points: Sequence[Point], spec: AutoscalerSpec, now_s: float) -> list[Point]:
    """The points of the metrics window, oldest first; fewer than MIN_POINTS in it, the newest
    MIN_POINTS of the stretched window."""
    seen = sorted((p for p in points if p.at_s <= now_s), key=lambda p: p.at_s)
    inside = [p for p in seen if p.at_s >= now_s - spec.metrics_window_s]
    if len(inside) >= MIN_POINTS:
        return inside
    return [p for p in seen if p.at_s >= now_s - MAX_WINDOW_STRETCH * spec.metrics_window_s][-MIN_POINTS:]


def shown_rate(points: Sequence[Point]) -> float:
    """The most rows per second of its own time any of these batches processed. A batch's time
    holds its fixed part too, so this is a throughput the task has shown at its parallelism: at
    most its capacity then. The points are one attempt's (one parallelism) over at most its
    history's ten minutes (shared/streams.py PROGRESS_HISTORY_S), so "then" is recent; on a
    machine much busier since, a scale-down taken on it can come back up after the stabilization."""
    return max((p.rows / p.duration_s for p in points if p.duration_s and p.duration_s > 0), default=0.0)


def figures(points: Sequence[Point], fixed_cost_s: float | None = None, shown: float = 0.0) -> Figures | None:
    """The window's figures; None when its points do not tell (fewer than two batches, no times).
    `shown` is the attempt's shown rate (`shown_rate` over its points since it settled)."""
    timed = [p for p in points if p.duration_s is not None and p.duration_s >= 0]
    if len(points) < 2 or not timed:
        return None
    first, last = points[0], points[-1]
    span = last.at_s - first.at_s
    batches = last.batch_id - first.batch_id
    if span <= 0 or batches <= 0:
        return None
    mean_rows = sum(p.rows for p in points) / len(points)
    mean_duration = sum(p.duration_s or 0.0 for p in timed) / len(timed)
    batch_rate = batches / span
    busy = min(1.0, batch_rate * mean_duration)
    rates = sorted(p.input_rate for p in points[1:] if p.input_rate is not None and math.isfinite(p.input_rate))
    read_rate = rates[len(rates) // 2] if rates else mean_rows * batch_rate
    lags = [p for p in points if p.lag is not None]
    lag = float(lags[-1].lag or 0.0) if lags else 0.0
    growth = (
        ((lags[-1].lag or 0.0) - (lags[0].lag or 0.0)) / (lags[-1].at_s - lags[0].at_s)
        if len(lags) >= 2 and lags[-1].at_s > lags[0].at_s
        else 0.0
    )
    arrival = max(0.0, read_rate + growth)
    shortest = min(p.duration_s or 0.0 for p in timed)
    lowest = min(shortest, fixed_cost_s) if fixed_cost_s is not None else shortest
    # Seconds per row: the high estimate from how the window's batches grow with their rows (none
    # when they are all alike), the low one from the lowest fixed part ever seen.
    slope = _slope([(float(p.rows), p.duration_s or 0.0) for p in timed])
    from_lowest = (mean_duration - lowest) / mean_rows if mean_rows > 0 else 0.0
    row_time_high, row_time_low = min(slope, from_lowest), max(slope, from_lowest)

    growing = _growing([p.duration_s or 0.0 for p in timed])
    behind = lag > read_rate * BACKLOG_S or growth > LAG_GROWTH_SHARE * max(read_rate, 1.0)
    # Growing batches with no lag (a source that reads all it has) are a saturated task only if no
    # batch proves a per-row rate above the input: else it is the fixed part growing with the load.
    # Only the shortest batch seen before the window bounds the fixed part from below well enough.
    outgrown = growing and (fixed_cost_s is None or _proven_rate(timed, fixed_cost_s) < read_rate)
    saturated = busy >= SATURATED_BUSY and (behind or outgrown)
    high, low = _per_second(row_time_high), _per_second(row_time_low)
    if saturated and busy > 0:
        high, low = min(high, read_rate / busy), min(low, read_rate / busy)
    else:
        # On a loaded machine the fixed part grows past the lowest ever seen, and the low estimate
        # takes the growth for a per-row cost; what the attempt has already processed is a floor.
        low = max(low, shown)
    return Figures(span, busy, read_rate, lag, growth, arrival, lowest, high, low, saturated, shown)


def _proven_rate(timed: Sequence[Point], fixed_s: float) -> float:
    """Rows per second the window's batches prove the task processes at its parallelism: the best
    batch's rows over its time less `fixed_s`. The fixed part is never below the lowest ever seen,
    so no batch's per-row part is shorter than its time less that: a task whose batches grow
    because it cannot keep up (its per-row rate below its input) proves a rate below its input too.
    A batch no longer than `fixed_s` proves nothing: it may be the one that set it."""
    rates = [
        p.rows / (p.duration_s - fixed_s)
        for p in timed
        if p.duration_s is not None and p.duration_s > fixed_s and p.rows >= MIN_ROWS_PER_BATCH
    ]
    return max(rates, default=0.0)


def _slope(xy: Sequence[tuple[float, float]]) -> float:
    """Least-squares seconds per row of batch durations over their rows; 0 when the rows hardly
    vary (MIN_ROWS_SPREAD) or the durations do not grow with them."""
    if len(xy) < MIN_POINTS:
        return 0.0
    mx, my = sum(x for x, _ in xy) / len(xy), sum(y for _, y in xy) / len(xy)
    var = sum((x - mx) ** 2 for x, _ in xy) / len(xy)
    if mx <= 0 or math.sqrt(var) < MIN_ROWS_SPREAD * mx:
        return 0.0
    return max(0.0, sum((x - mx) * (y - my) for x, y in xy) / len(xy) / var)


def _growing(durations: Sequence[float]) -> bool:
    """Batches that take ever longer: the newer half of the window's by BATCH_GROWTH over the older
    half, or every one longer than the one before by BATCH_GROWTH_STEADY in all (noise does not
    rise at every step)."""
    half = len(durations) // 2
    if half >= 2 and sum(durations[half:]) / (len(durations) - half) > BATCH_GROWTH * sum(durations[:half]) / half:
        return True
    rising = all(b > a for a, b in zip(durations, durations[1:], strict=False))
    return len(durations) >= MIN_POINTS and rising and durations[-1] > BATCH_GROWTH_STEADY * durations[0] > 0


def _bounds(spec: AutoscalerSpec, situation: Situation, points: Sequence[Point]) -> dict[str, int]:
    """What limits the parallelism, by name: maxParallelism, the state partitions, the Kafka
    partitions the sources read (more Spark tasks than partitions read nothing), and the slots one
    TaskManager can give (a task of parallelism p holds p slots of one TaskManager)."""
    out = {"maxParallelism": spec.max_parallelism, "the state partitions": situation.partitions}
    kafka = [q.source_partitions for q in points if q.source_partitions]
    if kafka:
        out["the Kafka partitions read"] = kafka[-1]
    if situation.slot_capacity is not None:
        out["the slots a TaskManager can give"] = max(situation.slot_capacity, 1)
    return out


def _per_second(row_time: float) -> float:
    return 1.0 / row_time if row_time > 0 else math.inf


def evaluate(spec: AutoscalerSpec, situation: Situation, points: Sequence[Point]) -> Evaluation:
    p, now = situation.parallelism, situation.now_s

    def out(
        outcome: Outcome, reason: str, proposed: int = p, fig: Figures | None = None, wanted: int | None = None
    ) -> Evaluation:
        return Evaluation(now, p, proposed, outcome, reason, fig.record() if fig else {}, wanted)

    if situation.held:
        return out(Outcome.HELD, f"holding off: {situation.held}")
    if situation.quiet_s is not None and situation.quiet_s < spec.stabilization_s:
        return out(
            Outcome.WAIT,
            f"stabilizing: {situation.quiet_s:.0f} s since the last start, rescale or "
            f"rollback, {spec.stabilization_s:g} s needed",
        )
    # Figures from before the stabilization ended describe the task as it started (its first
    # batch takes in the backlog of its start-up) and are not read (as Flink's autoscaler does).
    settled_at = now - (situation.quiet_s or 0.0) + spec.stabilization_s if situation.quiet_s is not None else None
    settled = [p for p in points if settled_at is None or p.at_s - (p.duration_s or 0.0) >= settled_at]
    seen = window(settled, spec, now)
    fig = figures(seen, situation.fixed_cost_s, shown_rate(settled))
    if fig is None or fig.span_s < MIN_WINDOW_SHARE * spec.metrics_window_s:
        return out(
            Outcome.WAIT,
            f"too few figures: {len(seen)} micro-batch point(s) over "
            f"{fig.span_s if fig else 0:.0f} s of the {spec.metrics_window_s:g} s window",
            fig=fig,
        )
    rows = sum(q.rows for q in seen)
    if rows < MIN_ROWS_PER_BATCH * len(seen) and rows < MIN_ROWS_PER_S * fig.span_s:
        return out(
            Outcome.WAIT,
            f"the window's {len(seen)} micro-batches carry almost no rows (under "
            f"{MIN_ROWS_PER_BATCH:g} each on average, under {MIN_ROWS_PER_S:g} a second): nothing to judge a "
            "capacity by",
            fig=fig,
        )
    lowest = spec.min_parallelism
    bounds = _bounds(spec, situation, settled)
    highest = max(lowest, min(bounds.values()))
    needed_rate = fig.arrival_rate + fig.lag / spec.catch_up_s

    def needed_at(capacity: float) -> int:
        per_core = capacity / p
        return (
            lowest
            if math.isinf(per_core)
            else max(1, math.ceil(needed_rate / (per_core * spec.target_utilization) - 1e-9))
        )

    # Up from the high capacity estimate, down from the low one: noise in either keeps the parallelism.
    needed = needed_at(fig.capacity)
    if needed <= p:
        needed = min(p, needed_at(fig.capacity_low))
    bounded = min(max(needed, lowest), highest)
    per_core = fig.capacity_low / p
    utilization = fig.arrival_rate / fig.capacity if fig.capacity > 0 else math.inf
    about = (
        f"arrival {fig.arrival_rate:.0f}/s, lag {fig.lag:.0f} ({fig.lag_growth:+.0f}/s), capacity "
        f"{'unbounded' if math.isinf(fig.capacity) else f'{fig.capacity:.0f}/s'} at parallelism {p} "
        f"(utilization {utilization:.2f}, busy {fig.busy:.2f})"
    )
    cap = f" (bounded by {min(bounds, key=lambda k: bounds[k])} {highest})" if needed > highest else ""
    if bounded > p:
        if fig.lag < 1 and fig.lag_growth <= 0 and (situation.last_wanted is None or situation.last_wanted <= p):
            # One low capacity estimate among high ones, with nothing waiting, is noise more often
            # than load: a second evaluation must find the same before the task restarts for it.
            return out(
                Outcome.KEEP,
                f"{about}: parallelism {needed} needed by this estimate, but no input waits: "
                f"scaling up once the next evaluation finds it too{cap}",
                fig=fig,
                wanted=bounded,
            )
        return out(
            Outcome.SCALE_UP,
            f"{about}: parallelism {needed} needed to process the input and drain the "
            f"lag within {spec.catch_up_s:g} s at {spec.target_utilization:g}{cap}",
            bounded,
            fig,
        )
    if bounded < p:
        after = fig.arrival_rate / (per_core * bounded) if per_core > 0 else math.inf
        if fig.lag_growth > LAG_GROWTH_SHARE * max(fig.read_rate, 1.0):
            return out(Outcome.KEEP, f"{about}: not scaling down while the lag grows", fig=fig)
        floor = spec.target_utilization - SCALE_DOWN_BAND
        if after >= floor:
            return out(
                Outcome.KEEP,
                f"{about}: parallelism {bounded} would run at {after:.2f}, not below "
                f"{floor:.2f} (the target less {SCALE_DOWN_BAND:g})",
                fig=fig,
            )
        return out(
            Outcome.SCALE_DOWN,
            f"{about}: parallelism {bounded} runs the current input at {after:.2f}, "
            f"below {floor:.2f} (the target less {SCALE_DOWN_BAND:g})",
            bounded,
            fig,
        )
    if needed > highest == p:
        return out(Outcome.KEEP, f"{about}: parallelism {needed} needed, but {p} is the most{cap}", fig=fig)
    return out(Outcome.KEEP, f"{about}: parallelism {p} is right", fig=fig)
