"""shared/backoff.py: the one exponential backoff."""

from __future__ import annotations

import pytest

from shared.backoff import exponential


def test_doubles_from_the_first_pause_up_to_the_most():
    assert [exponential(n, first_s=0.5, max_s=5) for n in range(0, 7)] == [0.5, 0.5, 1, 2, 4, 5, 5]
    assert exponential(3, first_s=1, max_s=100, factor=1.5) == 2.25
    assert exponential(10**9, first_s=1, max_s=60) == 60  # no overflow however many tries


def test_nonsense_bounds_are_refused():
    for first, most, factor in ((0, 1, 2), (2, 1, 2), (1, 2, 0.5)):
        with pytest.raises(ValueError):
            exponential(1, first_s=first, max_s=most, factor=factor)
