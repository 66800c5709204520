"""OverviewCache's rules with a fake clock: time-to-live, invalidation, single flight,
stale-while-revalidate, failures (services/dispatcher/views/overview_cache.py)."""

from __future__ import annotations

import threading

import pytest

from services.dispatcher.views.overview_cache import OverviewCache
from shared.clock import FakeClock

TIMEOUT_S = 5


class Builder:
    """Answers b"v1", b"v2", ...; with `hold`, each build waits until `release` is set."""

    def __init__(self, hold: bool = False) -> None:
        self.calls = 0
        self.hold = hold
        self.started = threading.Event()
        self.release = threading.Event()
        self._lock = threading.Lock()

    def __call__(self) -> bytes:
        with self._lock:
            self.calls += 1
            n = self.calls
        self.started.set()
        if self.hold:
            assert self.release.wait(TIMEOUT_S), "the test never released the build"
        return f"v{n}".encode()


def in_thread(fn):
    out: dict = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            out["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


def test_one_build_serves_every_request_within_the_ttl_then_it_is_rebuilt():
    clock, build = FakeClock(start=100.0), Builder()
    cache = OverviewCache(1.0, clock=clock.now)
    assert cache.peek() is None
    assert cache.get(build).body == b"v1"
    clock.advance(0.999)
    assert cache.get(build).body == b"v1" and build.calls == 1 and cache.peek().body == b"v1"
    assert cache.age_s(cache.get(build)) == pytest.approx(0.999)
    clock.advance(0.001)
    assert cache.peek() is None  # expired, and nobody is rebuilding it: the caller must
    entry = cache.get(build)
    assert entry.body == b"v2" and build.calls == 2 and entry.built_at == clock.now()
    assert cache.age_s(entry) == 0


def test_ttl_zero_builds_on_every_request():
    build = Builder()
    cache = OverviewCache(0, clock=FakeClock(start=100.0).now)
    assert [cache.get(build).body for _ in range(3)] == [b"v1", b"v2", b"v3"]
    assert not cache.enabled and cache.peek() is None


def test_invalidate_makes_the_next_request_rebuild_within_the_ttl():
    clock, build = FakeClock(start=100.0), Builder()
    cache = OverviewCache(1.0, clock=clock.now)
    cache.get(build)
    cache.invalidate()
    assert cache.peek() is None
    assert cache.get(build).body == b"v2"
    assert cache.get(build).body == b"v2" and build.calls == 2  # fresh again after the rebuild


def test_an_answer_whose_build_began_before_an_invalidation_is_not_served_after_it():
    build = Builder(hold=True)
    cache = OverviewCache(1.0, clock=FakeClock(start=100.0).now)
    t, out = in_thread(lambda: cache.get(build))
    assert build.started.wait(TIMEOUT_S)
    cache.invalidate()  # a submission committed while the build was reading the catalog
    build.release.set()
    t.join(TIMEOUT_S)
    assert out["value"].body == b"v1"  # the request that built it gets it ...
    assert cache.get(build).body == b"v2"  # ... but nobody after the invalidation does


def test_expired_answer_is_served_while_one_request_rebuilds():
    clock, build = FakeClock(start=100.0), Builder()
    cache = OverviewCache(1.0, clock=clock.now)
    cache.get(build)
    clock.advance(5)
    build.hold, build.started = True, threading.Event()
    t, out = in_thread(lambda: cache.get(build))
    assert build.started.wait(TIMEOUT_S)
    # While the rebuild runs, others get the earlier answer at once instead of waiting or building.
    assert [cache.get(build).body for _ in range(3)] == [b"v1"] * 3
    assert cache.peek().body == b"v1"
    assert build.calls == 2
    build.release.set()
    t.join(TIMEOUT_S)
    assert out["value"].body == b"v2" and cache.get(build).body == b"v2" and build.calls == 2


def test_without_a_servable_answer_concurrent_requests_share_one_build():
    build = Builder(hold=True)
    cache = OverviewCache(1.0, clock=FakeClock(start=100.0).now)
    first = in_thread(lambda: cache.get(build))
    assert build.started.wait(TIMEOUT_S)
    others = [in_thread(lambda: cache.get(build)) for _ in range(8)]
    build.release.set()
    for t, _ in (first, *others):
        t.join(TIMEOUT_S)
    assert build.calls == 1
    assert [out["value"].body for _, out in (first, *others)] == [b"v1"] * 9


def test_after_an_invalidation_requests_wait_for_the_rebuild_rather_than_get_the_old_answer():
    build = Builder()
    cache = OverviewCache(1.0, clock=FakeClock(start=100.0).now)
    cache.get(build)
    cache.invalidate()
    build.hold, build.started = True, threading.Event()
    first = in_thread(lambda: cache.get(build))
    assert build.started.wait(TIMEOUT_S)
    assert cache.peek() is None
    second = in_thread(lambda: cache.get(build))
    second[0].join(0.2)
    assert second[0].is_alive()  # waiting, not answered with v1
    build.release.set()
    for t, _ in (first, second):
        t.join(TIMEOUT_S)
    assert first[1]["value"].body == second[1]["value"].body == b"v2" and build.calls == 2


def test_a_failed_build_raises_and_drops_the_earlier_answer():
    clock, build = FakeClock(start=100.0), Builder()
    cache = OverviewCache(1.0, clock=clock.now)
    cache.get(build)
    clock.advance(5)

    def down() -> bytes:
        raise ConnectionError("catalog unreachable")

    with pytest.raises(ConnectionError):
        cache.get(down)
    assert cache.peek() is None
    # No earlier answer is left to serve stale: while the next build runs, others wait for it.
    build.hold, build.started = True, threading.Event()
    first = in_thread(lambda: cache.get(build))
    assert build.started.wait(TIMEOUT_S)
    second = in_thread(lambda: cache.get(build))
    second[0].join(0.2)
    assert second[0].is_alive()  # not answered with v1
    build.release.set()
    for t, _ in (first, second):
        t.join(TIMEOUT_S)
    assert first[1]["value"].body == second[1]["value"].body == b"v2" and build.calls == 2
