"""services/taskmanager/tasks/held_reports.py: a thread's reports wait while it holds them and go out
together, in order, when the outermost hold ends; other threads' reports are never held."""

from __future__ import annotations

import threading

import pytest

from services.taskmanager.tasks.held_reports import HeldReports
from shared.messages import TaskStateChanged
from shared.states import ExecutionState as ES
from shared.transport import InMemoryTransport


class CountingTransport(InMemoryTransport):
    def __init__(self):
        super().__init__(sender="tm")
        self.sends = 0  # round trips a Redis transport would make

    def publish(self, stream, body, *, epoch=None):
        self.sends += 1
        return super().publish(stream, body, epoch=epoch)

    def publish_many(self, items, *, epoch=None):
        self.sends += 1
        for stream, body in items:
            InMemoryTransport.publish(self, stream, body, epoch=epoch)


def report(n: int, state=ES.RUNNING) -> TaskStateChanged:
    return TaskStateChanged(execution_id=f"ex-{n}", job_id="job", taskmanager_id="tm", state=state)


def sent(t) -> list[str]:
    return [f"{b.execution_id}:{b.state.value}" for b in t.bodies("s")]


def test_outside_a_hold_each_report_goes_at_once():
    t = CountingTransport()
    reports = HeldReports(t)
    reports.publish("s", report(1))
    assert sent(t) == ["ex-1:RUNNING"] and t.sends == 1


def test_held_reports_go_in_one_send_in_order_when_the_outermost_hold_ends():
    t = CountingTransport()
    reports = HeldReports(t)
    with reports.hold():
        reports.publish("s", report(1, ES.INITIALIZING))
        with reports.hold():
            reports.publish("s", report(1))
        assert sent(t) == []  # the inner hold does not send
        reports.publish("s", report(2, ES.INITIALIZING))
    assert sent(t) == ["ex-1:INITIALIZING", "ex-1:RUNNING", "ex-2:INITIALIZING"] and t.sends == 1


def test_another_threads_reports_are_not_held():
    t = CountingTransport()
    reports = HeldReports(t)
    with reports.hold():
        reports.publish("s", report(1))
        other = threading.Thread(target=reports.publish, args=("s", report(2)))
        other.start()
        other.join()
        assert sent(t) == ["ex-2:RUNNING"]
    assert sent(t) == ["ex-2:RUNNING", "ex-1:RUNNING"]


class Down(CountingTransport):
    def publish_many(self, items, *, epoch=None):
        raise ConnectionError("Redis is down")


def test_a_failed_send_raises_unless_the_caller_asked_for_it_to_be_logged(caplog):
    reports = HeldReports(Down())
    with pytest.raises(ConnectionError):
        with reports.hold():
            reports.publish("s", report(1))
    with reports.hold(raise_errors=False):
        reports.publish("s", report(2))
    assert "could not send 1 task reports" in caplog.text
    # The hold is over either way: the next report goes at once (Down only fails pipelines).
    reports.publish("s", report(3))
    assert sent(reports.transport) == ["ex-3:RUNNING"]
