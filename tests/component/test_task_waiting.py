"""A running task that waits for something outside Headrace (a SQL sink's database away) says so:
the driver's `Waiting` event goes through its TaskManager (services/taskmanager/drivers/events.py)
to the JobManager as `TaskWaiting`, which keeps it as the attempt's waiting reason, shown by
REST as the attempt's and the job's `waiting-reason`, until the task reports it goes on."""

from __future__ import annotations

import pytest

from services.dispatcher.views.shapes import waiting_reason
from services.taskmanager.drivers.events import FORWARDED
from shared import streams
from shared import task_protocol as tp
from shared.catalog import repository as repo
from shared.message_auth import TASKMANAGER_MESSAGES
from shared.messages import TaskWaiting
from shared.states import ExecutionState as ES
from tests.component.harness import Harness

REASON = (
    "SQL sink lin:counts: waiting for database postgresql://db:5432/out, unreachable since 10:00:00 UTC "
    "(the task fails after 60 s, sink.max-retry-time)"
)


@pytest.fixture
def h(tmp_path):
    return Harness(tmp_path)


def test_the_driver_event_becomes_the_jobmanager_message():
    line = tp.encode_line(tp.Waiting(reason=REASON))
    event = tp.decode_event(line)
    assert event == tp.Waiting(reason=REASON)
    spec = tp.TaskSpec(
        job_id="j1",
        vertex_id="v1",
        execution_id="e1",
        attempt=0,
        parallelism=1,
        checkpoint_dir="/tmp/c",
        redis_url="redis://x",
    )
    msg = FORWARDED[tp.Waiting](spec, "tm-1", event)
    assert isinstance(msg, TaskWaiting) and (msg.execution_id, msg.job_id, msg.reason) == ("e1", "j1", REASON)
    assert isinstance(msg, TASKMANAGER_MESSAGES)  # a TaskManager may send it


def _latest(h, job):
    with h.catalog.session() as s:
        job_row = repo.get_job(s, job)
        ex = repo.job_executions(s, job)[-1]
        return waiting_reason(job_row, {ex.vertex_id: ex}), ex.waiting_reason


def test_a_running_attempt_shows_what_it_waits_for_until_it_goes_on(h):
    job = h.submit()
    h.pump()
    [cmd] = h.deployed()
    h.report(cmd, ES.INITIALIZING, ES.RUNNING)
    sender = f"taskmanager:{cmd.taskmanager_id}"
    ex_id = cmd.spec.execution_id

    h.t.publish(streams.JM_STREAM, TaskWaiting(execution_id=ex_id, job_id=job, reason=REASON), sender=sender)
    h.pump()
    assert _latest(h, job) == (REASON, REASON)
    assert h.job(job).status == "RUNNING"

    h.t.publish(streams.JM_STREAM, TaskWaiting(execution_id=ex_id, job_id=job, reason=None), sender=sender)
    h.pump()
    assert _latest(h, job) == (None, None)


def test_another_taskmanager_cannot_set_it_and_an_ended_attempt_keeps_none(h):
    job = h.submit()
    h.pump()
    [cmd] = h.deployed()
    h.report(cmd, ES.INITIALIZING, ES.RUNNING)
    other = "tm-1" if cmd.taskmanager_id == "tm-0" else "tm-0"
    ex_id = cmd.spec.execution_id
    h.t.publish(
        streams.JM_STREAM, TaskWaiting(execution_id=ex_id, job_id=job, reason=REASON), sender=f"taskmanager:{other}"
    )
    h.pump()
    assert _latest(h, job)[1] is None
    h.report(cmd, ES.FAILED, cause="boom")
    assert h.execution(ex_id).state == "FAILED"
    h.t.publish(
        streams.JM_STREAM,
        TaskWaiting(execution_id=ex_id, job_id=job, reason=REASON),
        sender=f"taskmanager:{cmd.taskmanager_id}",
    )
    h.pump()
    assert _latest(h, job)[1] is None
