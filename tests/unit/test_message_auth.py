"""Signed messages (shared/message_auth.py): who can sign what, and what a receiver refuses.

Pure logic: keys, signatures and sender rules, and the in-memory transport that applies them
exactly as the Redis one does (tests/integration/test_signed_messages.py runs the hostile cases
on a real cluster)."""

from __future__ import annotations

import pytest

from shared import cluster_keys as ck
from shared import streams
from shared.message_auth import (
    ClusterAuth,
    MissingKey,
    TaskManagerAuth,
    TaskManagerKeys,
    load_secret,
    rule_violation,
    taskmanager_auth,
)
from shared.messages import (
    CancelJob,
    HeartbeatAck,
    RegisterTaskManager,
    SubmitJob,
    TaskManagerHeartbeat,
    TaskProgress,
    TaskStateChanged,
    encode,
    wrap,
)
from shared.settings import Settings
from shared.states import ExecutionState as ES
from shared.transport import InMemoryTransport

SECRET = ck.parse_secret(ck.new_secret())


def register(tm: str, queue: str | None = None) -> RegisterTaskManager:
    return RegisterTaskManager(taskmanager_id=tm, host="h", slots=2, cores=1, memory_bytes=1, queue=queue or f"tm.{tm}")


def entry(auth, stream, body, sender):
    env = wrap(body, sender=sender)
    raw = encode(env)
    return env, raw, auth.sign(stream, sender, raw)


def test_the_control_plane_verifies_what_a_taskmanager_signs_with_its_own_keys():
    cp, tm1 = ClusterAuth(SECRET), TaskManagerAuth(["tm-1"], keys={"tm-1": TaskManagerKeys.derive(SECRET, "tm-1")})
    env, raw, sig = entry(tm1, streams.RM_STREAM, register("tm-1"), "taskmanager:tm-1")
    assert cp.check(streams.RM_STREAM, env, raw, sig) is None
    assert "unsigned" in cp.check(streams.RM_STREAM, env, raw, None)
    assert "bad signature" in cp.check(streams.RM_STREAM, env, raw + b" ", sig)
    # Under another cluster's secret nothing verifies.
    assert "bad signature" in ClusterAuth(ck.parse_secret(ck.new_secret())).check(streams.RM_STREAM, env, raw, sig)


def test_signatures_are_plain_hmac_sha256_of_the_exact_bytes():
    cp = ClusterAuth(SECRET)
    for raw in (b"", b"x" * 351, b"y" * 5000):
        assert cp.sign(streams.JM_STREAM, "taskmanager:tm-1", raw) == ck.sign(ck.sender_key(SECRET, "tm-1"), raw)
        assert cp.sign(streams.JM_STREAM, "dispatcher", raw) == ck.sign(ck.service_key(SECRET, "dispatcher"), raw)
        assert cp.sign_command("tm-1", raw) == ck.sign(ck.command_key(SECRET, "tm-1"), raw)


def test_a_taskmanager_cannot_sign_as_another_or_as_the_control_plane():
    tm1 = TaskManagerAuth(["tm-1"], keys={"tm-1": TaskManagerKeys.derive(SECRET, "tm-1")})
    for sender in ("taskmanager:tm-2", "taskmanager:evil", "jobmanager", "dispatcher"):
        with pytest.raises(MissingKey):
            tm1.sign(streams.JM_STREAM, sender, b"{}")
    # Signing a registration of "evil" with tm-1's key, claiming sender evil, does not verify.
    env = wrap(register("evil"), sender="taskmanager:evil")
    raw = encode(env)
    forged = ck.sign(ck.sender_key(SECRET, "tm-1"), raw)
    assert "bad signature" in ClusterAuth(SECRET).check(streams.RM_STREAM, env, raw, forged)


def test_a_taskmanager_named_like_a_service_holds_no_service_key():
    assert ck.sender_key(SECRET, "jobmanager") != ck.service_key(SECRET, "jobmanager")
    cp = ClusterAuth(SECRET)
    env = wrap(CancelJob(job_id="j"), sender="jobmanager")
    raw = encode(env)
    assert "bad signature" in cp.check(streams.JM_STREAM, env, raw, ck.sign(ck.sender_key(SECRET, "jobmanager"), raw))


@pytest.mark.parametrize(
    "sender, body, refused",
    [
        ("taskmanager:tm-2", TaskManagerHeartbeat(taskmanager_id="tm-1", slot_report=()), "names TaskManager 'tm-1'"),
        ("taskmanager:tm-1", SubmitJob(job_id="j"), "may not send SubmitJob"),
        ("taskmanager:tm-1", CancelJob(job_id="j"), "may not send CancelJob"),
        ("dispatcher", register("tm-1"), "must come from that TaskManager"),
        ("resourcemanager", TaskManagerHeartbeat(taskmanager_id="tm-1", slot_report=()), "must come from that"),
        ("taskmanager:tm-1", TaskManagerHeartbeat(taskmanager_id="tm-1", slot_report=()), None),
        ("taskmanager:tm-1", register("tm-1", queue="tm.tm-2"), "its command queue is 'tm.tm-1'"),
        ("taskmanager:tm-1", TaskProgress(execution_id="e", job_id="j", batch_id=1), None),
        ("dispatcher", SubmitJob(job_id="j"), None),
    ],
)
def test_sender_rules(sender, body, refused):
    found = rule_violation(wrap(body, sender=sender))
    assert (found is None) if refused is None else (refused in found), found


def test_commands_verify_only_with_the_addressed_taskmanagers_command_key():
    cp = ClusterAuth(SECRET)
    payload = b'{"epoch": 3}'
    sig = cp.sign_command("tm-2", payload)
    tm2 = TaskManagerAuth(["tm-2"], keys={"tm-2": TaskManagerKeys.derive(SECRET, "tm-2")})
    tm1 = TaskManagerAuth(["tm-1"], keys={"tm-1": TaskManagerKeys.derive(SECRET, "tm-1")})
    assert tm2.check_command("tm-2", payload, sig) is None
    assert "bad signature" in tm2.check_command("tm-2", payload.replace(b"3", b"4"), sig)  # another epoch
    assert "holds no keys" in tm1.check_command("tm-2", payload, sig)
    assert "bad signature" in tm1.check_command("tm-1", payload, sig)
    assert "unsigned" in tm2.check_command("tm-2", payload, None)
    # tm-1 signing "as the JobManager" with what it holds does not pass either.
    assert "bad signature" in tm2.check_command("tm-2", payload, tm1.sign_command("tm-1", payload))


def test_inbox_entries_are_signed_with_the_taskmanagers_command_key():
    cp = ClusterAuth(SECRET)
    tm1 = TaskManagerAuth(["tm-1"], keys={"tm-1": TaskManagerKeys.derive(SECRET, "tm-1")})
    inbox = streams.tm_inbox("tm-1")
    env, raw, sig = entry(
        cp, inbox, HeartbeatAck(taskmanager_id="tm-1", rm_session="s", known=False), "resourcemanager"
    )
    assert tm1.check(inbox, env, raw, sig) is None
    # Another TaskManager (tm-2 holds its own keys only) cannot write an ack tm-1 accepts.
    tm2 = TaskManagerAuth(["tm-2"], keys={"tm-2": TaskManagerKeys.derive(SECRET, "tm-2")})
    assert "bad signature" in tm1.check(inbox, env, raw, ck.sign(tm2.command_key("tm-2"), raw))
    # A command signature is no inbox signature (and the other way round).
    assert "bad signature" in tm1.check(inbox, env, raw, cp.sign_command("tm-1", raw))
    assert "checks only its own inbox" in tm1.check(streams.tm_inbox("tm-2"), env, raw, sig)


def test_a_simulating_process_speaks_as_each_of_its_taskmanagers():
    auth = TaskManagerAuth(["base-sim00000", "base-sim00001"], secret=SECRET)
    body = TaskStateChanged(execution_id="e", job_id="j", taskmanager_id="base-sim00001", state=ES.RUNNING)
    assert auth.sender_for(body, "taskmanager:base") == "taskmanager:base-sim00001"
    assert (
        auth.sender_for(
            TaskStateChanged(execution_id="e", job_id="j", taskmanager_id="tm-9", state=ES.RUNNING), "taskmanager:base"
        )
        == "taskmanager:base"
    )
    env, raw, sig = entry(auth, streams.JM_STREAM, body, "taskmanager:base-sim00001")
    assert ClusterAuth(SECRET).check(streams.JM_STREAM, env, raw, sig) is None
    with pytest.raises(MissingKey):  # never derives for an id it does not serve
        auth.sign(streams.JM_STREAM, "taskmanager:tm-1", raw)


def test_taskmanager_keys_from_settings_and_clear_errors(tmp_path):
    keys = TaskManagerKeys.derive(SECRET, "tm-1")
    s = Settings(home=tmp_path, taskmanager_key=keys.sender.hex(), taskmanager_command_key=keys.command.hex())
    auth = taskmanager_auth(s, ["tm-1"])
    assert auth.sender_key("taskmanager:tm-1") == ck.sender_key(SECRET, "tm-1")
    with pytest.raises(MissingKey, match="both"):
        taskmanager_auth(Settings(home=tmp_path, taskmanager_key=keys.sender.hex()), ["tm-1"])
    with pytest.raises(MissingKey, match="hexadecimal"):
        taskmanager_auth(Settings(home=tmp_path, taskmanager_key="zz", taskmanager_command_key="zz"), ["tm-1"])
    # No keys and no cluster secret file: a clear refusal naming the settings.
    with pytest.raises(MissingKey, match="taskmanager_key"):
        taskmanager_auth(Settings(home=tmp_path / "empty"), ["tm-1"])
    # The control plane creates the secret (0600); a TaskManager of the same home derives from it.
    secret = load_secret(Settings(home=tmp_path), create=True)
    assert (tmp_path / "secrets" / ck.SECRET_FILE).stat().st_mode & 0o777 == 0o600
    assert taskmanager_auth(Settings(home=tmp_path), ["tm-1"]).sender_key("taskmanager:tm-1") == ck.sender_key(
        secret, "tm-1"
    )


def test_in_memory_transport_dead_letters_unsigned_forged_and_foreign_messages():
    t = InMemoryTransport(sender="dispatcher")
    seen = []
    t.publish(streams.JM_STREAM, SubmitJob(job_id="ok"))
    t.append_raw(streams.JM_STREAM, encode(wrap(CancelJob(job_id="unsigned"), sender="dispatcher")))
    forged = encode(wrap(CancelJob(job_id="forged"), sender="dispatcher"))
    t.append_raw(streams.JM_STREAM, forged, ck.sign(ck.sender_key(SECRET, "tm-1"), forged))
    t.publish(streams.JM_STREAM, CancelJob(job_id="from-a-tm"), sender="taskmanager:tm-1")
    t.drain(streams.JM_STREAM, "g", lambda env: seen.append(env.body.job_id))
    assert seen == ["ok"]
    errors = [d["error"] for d in t.dead]
    assert "unsigned" in errors[0] and "bad signature" in errors[1] and "may not send CancelJob" in errors[2]
