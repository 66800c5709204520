"""The suite's polling helper (tests/waiting.py): what it returns and how it gives up."""

from __future__ import annotations

import itertools

import pytest

from tests.waiting import WaitTimeout, wait_for


def test_returns_the_first_truthy_value():
    counter = itertools.count()
    assert wait_for("the third poll", lambda: max(next(counter) - 1, 0), timeout_s=5, poll_s=0) == 1


def test_until_decides_and_the_value_is_returned():
    counter = itertools.count()
    assert wait_for("three entries", lambda: [0] * next(counter), 5, poll_s=0, until=lambda v: len(v) >= 3) == [0] * 3


def test_gives_up_naming_what_and_the_last_value_seen():
    with pytest.raises(WaitTimeout, match=r"timed out after 0.05 s waiting for the answer \(last seen: \[1, 2\]\)"):
        wait_for("the answer", lambda: [1, 2], 0.05, poll_s=0.01, until=lambda v: len(v) > 2)
    assert issubclass(WaitTimeout, AssertionError)  # a plain test failure in pytest's report


def test_checks_once_even_with_no_time_left():
    assert wait_for("a value", lambda: "here", timeout_s=0) == "here"


def test_ignored_exceptions_mean_not_yet_and_others_propagate():
    calls = itertools.count()

    def flaky():
        if next(calls) < 2:
            raise ConnectionError("still starting")
        return "up"

    assert wait_for("the server", flaky, 5, poll_s=0, ignoring=(ConnectionError,)) == "up"

    def down():
        raise ConnectionError("down")

    with pytest.raises(WaitTimeout, match=r"last seen: ConnectionError\('down'\)"):
        wait_for("the server", down, 0.02, poll_s=0.01, ignoring=(ConnectionError,))
    with pytest.raises(ValueError):
        wait_for("the server", lambda: int("x"), 5, ignoring=(ConnectionError,))
