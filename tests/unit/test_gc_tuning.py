"""shared/gc_tuning.py: after tune(), what existed is frozen out of the collector and young
collections run every YOUNG_THRESHOLD net allocations (the rest of the thresholds unchanged)."""

from __future__ import annotations

import gc

from shared import gc_tuning


def test_tune_freezes_what_exists_and_raises_only_the_young_threshold():
    before = gc.get_threshold()
    try:
        gc_tuning.tune()
        assert gc.get_threshold() == (gc_tuning.YOUNG_THRESHOLD, before[1], before[2])
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
