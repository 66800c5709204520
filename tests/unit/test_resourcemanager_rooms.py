"""The ResourceManager's smaller rooms, driven by a fake clock: the previous incarnation's
TaskManagers it waits for (returning.py) and the figures it publishes (loop_stats.py)."""

from __future__ import annotations

import time

from services.resourcemanager.loop_stats import LoopStats
from services.resourcemanager.returning import ReturningTaskManagers
from services.resourcemanager.slot_manager import SlotManager
from shared.clock import FakeClock
from shared.ids import TaskManagerId, new_execution_id, slot_request_execution, slot_request_id


def test_taskmanagers_of_the_previous_resourcemanager_are_awaited_until_the_timeout():
    clock = FakeClock()
    returning = ReturningTaskManagers(clock, timeout_s=10)
    assert not returning.expected
    waiting = returning.expect([TaskManagerId(t) for t in ("tm-1", "tm-2", "tm-3")], registered={TaskManagerId("tm-3")})
    assert (waiting, returning.expected) == (2, True)
    clock.advance(9.9)
    assert returning.overdue() == []
    assert returning.returned(TaskManagerId("tm-1")) is True
    assert returning.returned(TaskManagerId("tm-1")) is False  # once
    assert returning.returned(TaskManagerId("tm-3")) is False  # registered before: never awaited
    clock.advance(0.1)
    assert returning.overdue() == ["tm-2"]
    assert returning.overdue() == []  # declared once


def test_published_figures_count_the_last_second_and_every_loss():
    clock, published = FakeClock(), []
    stats = LoopStats(clock, published.append)
    slots = SlotManager(clock)
    slots.register(taskmanager_id=TaskManagerId("tm-1"), queue="tm.tm-1", host="h", slots=4, cores=2, memory_bytes=1)
    for _ in range(5):
        stats.heartbeat(sent_at=time.time())
    stats.taskmanager_lost()
    stats.publish_due(clock.now(), slots)
    [first] = published
    assert (first["taskmanagers"], first["slots_total"], first["slots_free"]) == (1, 4, 4)
    assert (first["heartbeats_per_s"], first["taskmanagers_lost_total"]) == (5.0, 1)
    clock.advance(0.5)
    stats.publish_due(clock.now(), slots)
    assert len(published) == 1  # once a second
    clock.advance(1.5)
    stats.heartbeat(sent_at=time.time())
    stats.publish_due(clock.now(), slots)
    assert published[1]["heartbeats_per_s"] == 0.5  # one heartbeat over the 2 s since the last
    assert published[1]["taskmanagers_lost_total"] == 1  # a running total


def test_nothing_is_published_without_a_publisher():
    clock = FakeClock()
    stats = LoopStats(clock, None)
    stats.heartbeat(sent_at=time.time())
    stats.publish_due(clock.now() + 5, SlotManager(clock))  # no error, nothing to call


def test_a_slot_request_is_named_by_its_attempt():
    execution = new_execution_id()
    assert slot_request_execution(slot_request_id(execution)) == execution
