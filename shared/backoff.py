"""Exponential backoff, the one formula every retry loop of Headrace uses: supervised processes
started again, SQL sinks waiting for their database, driver events handled again, warm drivers
that keep dying before they are ready. (Restart strategies keep Flink's own exponential-delay with
its jitter and reset threshold: shared/restart.py.)"""

from __future__ import annotations


def exponential(step: int, *, first_s: float, max_s: float, factor: float = 2.0) -> float:
    """The pause before try number `step` (1, 2, ...): first_s, then `factor` times the one before,
    never above max_s. A step below 1 counts as the first."""
    if first_s <= 0 or max_s < first_s or factor < 1:
        raise ValueError(f"backoff needs 0 < first_s ({first_s}) <= max_s ({max_s}) and factor >= 1 ({factor})")
    exponent = max(0, step - 1)
    # Past this the pause is max_s anyway, and factor ** exponent would only grow (or overflow).
    if factor > 1 and first_s * factor ** min(exponent, 64) >= max_s:
        return max_s
    return min(max_s, first_s * factor**exponent)
