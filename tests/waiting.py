"""The suite's one way to wait for a condition: poll it until it holds or time runs out.

    jm = wait_for("a leading JobManager", lambda: leader(cluster), timeout_s=60)

`check` is called every `poll_s` seconds; its first truthy value is returned (or the first that
`until` accepts: `wait_for("3 reports", fetch, until=lambda found: len(found) >= 3)`). After `timeout_s`
the wait gives up with `WaitTimeout` (an AssertionError, so pytest reports a plain failure) that
names what was awaited and shows the last value `check` returned, or the last exception of a kind
listed in `ignoring` (a server that is still starting, a scrape that does not hold yet).

Helpers that wait for something more specific (a number of bus entries, a lifecycle state) call
this one; a test module must not grow its own polling loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class WaitTimeout(AssertionError):
    """A condition did not hold in time; `last` is the last value (or exception) seen."""

    def __init__(self, message: str, last: object):
        super().__init__(message)
        self.last = last


def wait_for(
    what: str,
    check: Callable[[], T],
    timeout_s: float = 30,
    poll_s: float = 0.1,
    *,
    until: Callable[[T], object] = bool,
    ignoring: tuple[type[BaseException], ...] = (),
) -> T:
    """`check()`'s first value that `until` accepts (by default: the first truthy one), polled every
    `poll_s` s; WaitTimeout naming `what` and showing the last value after `timeout_s` s.

    `check` runs at least once, and once more after the last sleep, however short `timeout_s` is. An
    exception of a type in `ignoring`, raised by `check` or `until`, counts as "not yet" (and is shown
    as the last value seen); any other exception propagates at once.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        last: object
        try:
            value = check()
            last = value
            if until(value):
                return value
        except ignoring as exc:
            last = exc
        if time.monotonic() >= deadline:
            raise WaitTimeout(
                f"timed out after {timeout_s:g} s waiting for {what} (last seen: {_clip(repr(last))})", last
            )
        time.sleep(poll_s)


def _clip(text: str, limit: int = 2000) -> str:
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text) - limit} more characters)"
