"""Metric series of a simulated micro-batch task, for the autoscaler's tests: each batch takes
every row waiting (up to a batch limit) and lasts a fixed part plus a part per row divided by the
parallelism, as Spark's micro-batches do; a point is recorded at most once a second, as the
TaskManager records them (shared/streams.py progress_history_key)."""

from __future__ import annotations

import math

from shared.autoscaling import Point

FIXED_S = 0.15  # per micro-batch
ROW_S = 1 / 4000  # one core processes 4,000 rows/s


def simulate(
    rate,
    seconds: float,
    parallelism: int,
    *,
    lag0: float = 0.0,
    after: list[Point] | None = None,
    max_batch: int = 100_000,
    fixed_s: float = FIXED_S,
    row_s: float = ROW_S,
) -> list[Point]:
    """Points of a task at `parallelism` whose input arrives at rate(t) rows per second (going on
    from the points `after`, with lag0 more rows waiting)."""
    t0 = after[-1].at_s if after else 0.0
    lag = lag0 + ((after[-1].lag or 0.0) if after else 0.0)
    t, batch, last_point = t0, after[-1].batch_id if after else 0, t0 if after else -math.inf
    points, previous = [], None
    while t < t0 + seconds:
        rows = int(min(lag, max_batch))
        behind = lag - rows  # what the source reports at planning: 0 when a batch takes all there is
        duration = fixed_s + rows * row_s / parallelism
        lag += rate(t) * duration - rows
        t += duration
        batch += 1
        # Spark's inputRowsPerSecond: the rows over the time since the batch before this one started.
        input_rate = rows / previous if previous else None
        previous = duration
        if t - last_point >= 1.0:
            points.append(
                Point(
                    at_s=t, batch_id=batch, rows=rows, duration_s=duration, lag=max(behind, 0.0), input_rate=input_rate
                )
            )
            last_point = t
    return points


def steady(rows_per_s: float):
    return lambda t: rows_per_s


def shifted(points: list[Point], end_s: float) -> list[Point]:
    """The same series ending at `end_s` (wall-clock seconds)."""
    delta = end_s - points[-1].at_s
    return [Point(p.at_s + delta, p.batch_id, p.rows, p.duration_s, p.lag, p.input_rate) for p in points]
