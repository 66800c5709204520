"""The reachability check's memory of a listing moments ago (connectors/kafka_source.py)."""

from __future__ import annotations

from services.taskmanager.runtime.connectors.kafka_source import RecentListings

BROKERS = {"bootstrap.servers": "127.0.0.1:9092"}


def test_a_listing_with_every_name_spares_the_next_check_on_the_same_brokers():
    recent = RecentListings()
    assert not recent.has_all(BROKERS, ["in"])  # nothing listed yet
    recent.note(BROKERS, ["in", "out"])
    assert recent.has_all(BROKERS, ["in", "out"])
    assert recent.has_all(BROKERS, [])


def test_a_name_the_listing_lacks_other_brokers_or_an_old_listing_ask_again():
    recent = RecentListings()
    recent.note(BROKERS, ["in"])
    assert not recent.has_all(BROKERS, ["in", "new-topic"])  # perhaps created since: ask
    assert not recent.has_all({"bootstrap.servers": "elsewhere:9092"}, ["in"])
    assert not recent.has_all({**BROKERS, "security.protocol": "SSL"}, ["in"])
    recent.FRESH_S = 0.0  # type: ignore[misc]
    assert not recent.has_all(BROKERS, ["in"])
