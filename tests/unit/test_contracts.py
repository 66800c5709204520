import pytest
from pydantic import ValidationError

from shared import streams
from shared.clock import FakeClock
from shared.heartbeat import HeartbeatMonitor
from shared.messages import SubmitJob, TaskStateChanged, UndecodableMessage, decode, encode, wrap
from shared.settings import Settings
from shared.states import ExecutionState, IllegalTransition, JobStatus, check_execution_transition, check_job_transition
from shared.transport import InMemoryTransport


def test_envelope_round_trip_keeps_epoch_and_type():
    env = wrap(SubmitJob(job_id="j" * 32), sender="dispatcher", epoch=7)
    back = decode(encode(env))
    assert back == env and isinstance(back.body, SubmitJob) and back.epoch == 7


def test_messages_are_frozen():
    msg = SubmitJob(job_id="x")
    with pytest.raises(ValidationError):
        msg.job_id = "y"


@pytest.mark.parametrize(
    "raw",
    [
        b"not json",
        b'{"sender":"x","body":{"type":"Nope"}}',
        b'{"schema_version":99,"sender":"x","body":{"type":"SubmitJob","job_id":"a"}}',
    ],
)
def test_undecodable(raw):
    with pytest.raises(UndecodableMessage):
        decode(raw)


def test_in_memory_transport_dead_letters_and_dedups():
    t = InMemoryTransport()
    seen = []
    t.append_raw(streams.JM_STREAM, b"garbage")
    mid = t.publish(streams.JM_STREAM, SubmitJob(job_id="a"))
    t.publish_envelope(
        streams.JM_STREAM, wrap(SubmitJob(job_id="a"), sender="x").model_copy(update={"message_id": mid})
    )
    t.drain(streams.JM_STREAM, "g", lambda env: seen.append(env.body.job_id))
    assert seen == ["a"]
    assert len(t.dead) == 1


def test_in_memory_transport_redelivers_after_handler_failure():
    t = InMemoryTransport()
    t.publish("s", SubmitJob(job_id="a"))
    calls = []

    def flaky(env):
        calls.append(env.body.job_id)
        if len(calls) == 1:
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        t.poll("s", "g", "c", flaky)
    t.poll("s", "g", "c", flaky)
    assert calls == ["a", "a"] and t.pending("s", "g") == 0


def test_job_state_machine():
    check_job_transition(JobStatus.RUNNING, JobStatus.RESTARTING)
    with pytest.raises(IllegalTransition):
        check_job_transition(JobStatus.FINISHED, JobStatus.RUNNING)
    with pytest.raises(IllegalTransition):
        check_job_transition(JobStatus.CANCELLING, JobStatus.RUNNING)
    assert JobStatus.CANCELED.is_terminal and not JobStatus.RESTARTING.is_terminal


def test_execution_state_machine():
    check_execution_transition(ExecutionState.SCHEDULED, ExecutionState.DEPLOYING)
    with pytest.raises(IllegalTransition):
        check_execution_transition(ExecutionState.CANCELING, ExecutionState.RUNNING)
    with pytest.raises(IllegalTransition):
        check_execution_transition(ExecutionState.FAILED, ExecutionState.RUNNING)


def test_heartbeat_monitor_with_fake_clock():
    clock = FakeClock()
    hb = HeartbeatMonitor(clock, interval_s=2, timeout_s=10)
    hb.monitor("tm-a")
    hb.monitor("tm-b")
    clock.advance(8)
    hb.record("tm-a")
    clock.advance(3)
    assert hb.expired() == ["tm-b"]
    assert not hb.record("tm-b")
    assert hb.expired() == []


def test_heartbeat_interval_must_be_below_timeout():
    with pytest.raises(ValueError):
        HeartbeatMonitor(FakeClock(), interval_s=10, timeout_s=10)
    with pytest.raises(ValueError):
        Settings(heartbeat_interval_s=5, heartbeat_timeout_s=4)


def test_settings_from_env_and_yaml(tmp_path, monkeypatch):
    cfg = tmp_path / "h.yaml"
    cfg.write_text("heartbeat_timeout_s: 20\ntaskmanager_slots: 3\n")
    monkeypatch.setenv("HEADRACE_CONFIG", str(cfg))
    monkeypatch.setenv("HEADRACE_TASKMANAGER_SLOTS", "5")
    s = Settings()
    assert s.heartbeat_timeout_s == 20 and s.taskmanager_slots == 5  # env beats the file


def test_task_state_changed_carries_flink_state_names():
    msg = TaskStateChanged(execution_id="e", job_id="j", taskmanager_id="t", state=ExecutionState.RUNNING)
    assert '"RUNNING"' in msg.model_dump_json()
