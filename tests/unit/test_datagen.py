"""The data generator is a pure function of (seed, i): tests rely on it to predict results."""

from __future__ import annotations

import itertools
from collections import Counter
from datetime import datetime, timedelta, timezone

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from services.taskmanager.runtime.connectors.datagen import (
    DEFAULT_BASE_TIME,
    DEFAULT_URLS,
    _Options,
    _StreamReader,
    generate_batch,
    generate_event,
    generate_events,
    is_exhausted,
    split_range,
)


def test_event_is_a_pure_function_of_seed_and_index():
    assert generate_event(7, 12345) == generate_event(7, 12345)
    assert generate_events(7, 10, 20) == [generate_event(7, i) for i in range(10, 20)]
    assert generate_events(7, 0, 50) != generate_events(8, 0, 50)


def test_vectorised_batch_equals_scalar_events():
    for seed, start, end in [(0, 0, 1), (1, 0, 2000), (99, 123_456, 125_000)]:
        assert generate_batch(seed, start, end).to_pylist() == generate_events(seed, start, end)
    shape = dict(
        urls=("/a", "/b"),
        num_users=3,
        events_per_minute=60,
        max_delay_ms=0,
        base_time=datetime(2030, 5, 1, 12, tzinfo=timezone.utc),
    )
    assert generate_batch(3, 0, 500, **shape).to_pylist() == generate_events(3, 0, 500, **shape)


def test_event_time_spacing_and_bounded_out_of_orderness():
    events = generate_events(5, 0, 3000, events_per_minute=600, max_delay_ms=5000)
    for e in events:
        nominal = DEFAULT_BASE_TIME + timedelta(milliseconds=100 * e["i"])
        assert nominal - timedelta(seconds=5) <= e["event_time"] <= nominal
    # 3000 events at 600/minute span 5 minutes of event time.
    minutes = {e["event_time"].replace(second=0, microsecond=0) for e in events}
    assert 5 <= len(minutes) <= 6
    # Out of order, but never by more than the max delay: a 5 s watermark drops nothing.
    running_max = events[0]["event_time"]
    disorder = 0
    for e in events[1:]:
        if e["event_time"] < running_max:
            disorder += 1
            assert running_max - e["event_time"] <= timedelta(seconds=5)
        running_max = max(running_max, e["event_time"])
    assert disorder > 0


def test_fields_cover_their_domains_with_skew():
    events = generate_events(11, 0, 20_000)
    urls = Counter(e["url"] for e in events)
    assert set(urls) == set(DEFAULT_URLS)
    assert urls[DEFAULT_URLS[0]] > 3 * urls[DEFAULT_URLS[-1]]  # min-of-two draws skews to the front
    users = {e["user_id"] for e in events}
    assert len(users) > 900 and all(u.startswith("user-") for u in users)


def test_split_range_is_contiguous_and_complete():
    parts = split_range(10, 107, 4)
    assert [(p.start, p.end) for p in parts][0][0] == 10 and parts[-1].end == 107
    assert all(a.end == b.start for a, b in itertools.pairwise(parts))
    assert sum(p.end - p.start for p in parts) == 97
    assert split_range(5, 5, 3) == []
    assert len(split_range(0, 2, 8)) == 2


def test_stream_reader_paces_and_caps_at_total(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr("services.taskmanager.runtime.connectors.datagen.time.monotonic", lambda: clock[0])
    reader = _StreamReader(_Options({"total": "1000", "rows_per_second": "100"}))
    assert reader.initialOffset() == {"i": 0}
    assert reader.latestOffset({"i": 0}, ReadAllAvailable()) == {"i": 0}
    clock[0] += 2.5
    assert reader.latestOffset({"i": 0}, ReadAllAvailable()) == {"i": 250}
    assert reader.latestOffset({"i": 0}, ReadMaxRows(100)) == {"i": 100}
    clock[0] += 60
    assert reader.latestOffset({"i": 250}, ReadAllAvailable()) == {"i": 1000}
    assert is_exhausted({"i": 1000}, 1000) and not is_exhausted({"i": 999}, 1000)
    assert not is_exhausted(None, 1000) and not is_exhausted({"id": "1-0"}, 1000)


def test_restarted_reader_paces_from_its_restart_offset(monkeypatch):
    clock = [0.0]
    monkeypatch.setattr("services.taskmanager.runtime.connectors.datagen.time.monotonic", lambda: clock[0])
    reader = _StreamReader(_Options({"rows_per_second": "10"}))  # unbounded
    assert reader.latestOffset({"i": 500}, ReadAllAvailable()) == {"i": 500}
    clock[0] = 3.0
    assert reader.latestOffset({"i": 500}, ReadAllAvailable()) == {"i": 530}


def test_unbounded_without_rate_is_rejected():
    reader = _StreamReader(_Options({}))
    with pytest.raises(ValueError):
        reader.latestOffset({"i": 0}, ReadAllAvailable())


def test_bounded_registry_needs_every_source_exhausted():
    from services.taskmanager.runtime.context import BoundedRegistry, BoundedSource

    reg = BoundedRegistry()
    reg.add(BoundedSource("small", lambda off: is_exhausted(off, 100)))
    reg.add(BoundedSource("big", lambda off: is_exhausted(off, 1000)))
    assert reg.all_exhausted(['{"i": 1000}', {"i": 100}])  # matched in either order
    assert not reg.all_exhausted([{"i": 100}, {"i": 100}])  # the big one is not done
    assert not reg.all_exhausted([])
    assert not reg.all_exhausted([{"i": 1000}, {"i": 1000}, {"i": 1000}])  # an unbounded extra
    assert not BoundedRegistry().all_exhausted([{"i": 5}])
