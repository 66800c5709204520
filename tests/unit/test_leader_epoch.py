"""Receivers fence JobManager messages by the CURRENT leader epoch, never by the highest seen
(issue 7, gaps 3 and 10): the ResourceManager's fence and the TaskManager's command intake, on
an in-memory transport with the published epoch faked. The same on a real cluster is in
tests/integration/test_receiver_fencing.py."""

from __future__ import annotations

import json

import pytest

from services.resourcemanager.fencing import JobManagerFence
from services.resourcemanager.service import ResourceManager
from services.taskmanager.commands import CommandIntake
from shared import streams
from shared.catalog import Catalog
from shared.clock import FakeClock
from shared.ids import new_allocation_id, new_execution_id, new_job_id
from shared.leader_epoch import LeaderEpochFence
from shared.message_auth import ClusterAuth
from shared.messages import (
    CancelSlotRequest,
    CancelTask,
    CommandRejected,
    DeployTask,
    RegisterTaskManager,
    ReleaseSlots,
    RequestSlots,
    SlotsAllocated,
    encode,
    wrap,
)
from shared.settings import Settings
from shared.transport import InMemoryTransport

FORGED = 10**12


class Published:
    """The leader epoch as Redis holds it (None: the key is missing)."""

    def __init__(self, epoch: int | None):
        self.epoch = epoch

    def __call__(self) -> int | None:
        return self.epoch


def fence_for(published: Published, clock: FakeClock) -> LeaderEpochFence:
    return LeaderEpochFence(published, refresh_s=1.0, clock=clock.now)


def test_a_forged_future_epoch_does_not_make_the_current_one_stale():
    clock, published = FakeClock(), Published(5)
    fence = fence_for(published, clock)
    assert fence.accept(5)
    assert not fence.accept(FORGED)
    assert fence.accept(5)  # "highest seen" would refuse this from now on
    assert not fence.accept(4)


def test_a_new_leader_is_accepted_at_once_and_its_predecessor_refused():
    clock, published = FakeClock(), Published(5)
    fence = fence_for(published, clock)
    assert fence.accept(5)
    published.epoch = 6  # the new leader published, well within the cache's refresh time
    assert fence.accept(6)
    assert not fence.accept(5)


# --- ResourceManager --------------------------------------------------------------------------


class RM:
    def __init__(self, tmp_path, epoch: int | None = 5):
        self.clock = FakeClock()
        self.published = Published(epoch)
        self.t = InMemoryTransport(sender="resourcemanager")
        settings = Settings(home=tmp_path, heartbeat_interval_s=2, heartbeat_timeout_s=10)
        catalog = Catalog(settings.catalog)
        catalog.migrate()
        self.fence = JobManagerFence(fence_for(self.published, self.clock), clock=self.clock.now, hold_s=10)
        self.rm = ResourceManager(settings, catalog, self.t, self.clock, fence=self.fence)
        self.send(
            RegisterTaskManager(taskmanager_id="tm-1", host="h", slots=4, cores=1, memory_bytes=1, queue="tm.tm-1"),
            sender="taskmanager:tm-1",
            epoch=0,
        )

    def send(self, body, *, sender="jobmanager", epoch=5):
        self.t.publish_envelope(streams.RM_STREAM, wrap(body, sender=sender, epoch=epoch))
        self.t.drain(streams.RM_STREAM, streams.RM_GROUP, self.rm.handle)
        self.rm.tick()

    def allocated(self) -> list[SlotsAllocated]:
        return [b for b in self.t.bodies(streams.JM_STREAM) if isinstance(b, SlotsAllocated)]


def request(slots=1) -> RequestSlots:
    ex = new_execution_id()
    return RequestSlots(request_id=ex, job_id=new_job_id(), execution_id=ex, slots=slots, timeout_s=300)


@pytest.fixture
def rm(tmp_path):
    return RM(tmp_path)


def test_resourcemanager_refuses_every_jobmanager_message_of_another_epoch(rm):
    rm.send(request(), epoch=FORGED)
    rm.send(request(), epoch=4)
    assert rm.allocated() == []
    rm.send(request())  # the real leader, after a forged future epoch: obeyed
    [alloc] = rm.allocated()
    rm.send(ReleaseSlots(allocation_id=alloc.allocation_id), epoch=4)
    rm.send(ReleaseSlots(allocation_id=alloc.allocation_id), epoch=FORGED)
    assert rm.rm.slots.free_slots() == 3  # neither release was applied
    waiting = request(slots=4)
    rm.send(waiting)
    assert waiting.request_id in rm.rm.slots.pending
    rm.send(CancelSlotRequest(request_id=waiting.request_id), epoch=4)
    assert waiting.request_id in rm.rm.slots.pending
    rm.send(CancelSlotRequest(request_id=waiting.request_id))
    assert waiting.request_id not in rm.rm.slots.pending
    rm.send(ReleaseSlots(allocation_id=alloc.allocation_id))
    assert rm.rm.slots.free_slots() == 4
    assert rm.fence.refused == 5


def test_resourcemanager_refuses_jobmanager_messages_from_other_senders(rm):
    rm.send(request(), sender="taskmanager:tm-1")  # a TaskManager's: refused before the fence
    rm.send(request(), sender="operator")
    assert rm.allocated() == [] and rm.fence.refused == 1
    assert [d["error"] for d in rm.t.dead] == [
        "a TaskManager (taskmanager:tm-1) may not send RequestSlots: only the control plane does"
    ]


def test_resourcemanager_holds_jobmanager_messages_while_no_epoch_is_published(tmp_path):
    rm = RM(tmp_path, epoch=None)
    first, second = request(), request()
    rm.send(first)
    rm.send(CancelSlotRequest(request_id="nothing"))
    rm.send(second)
    assert rm.allocated() == [] and len(rm.fence.held) == 3
    rm.published.epoch = 5  # the leader publishes again (Redis had restarted empty)
    rm.clock.advance(1)
    rm.rm.tick()
    assert [a.request_id for a in rm.allocated()] == [first.request_id, second.request_id]
    # Held too long: dropped, not obeyed later.
    rm.published.epoch = None
    rm.clock.advance(2)
    rm.send(request())
    rm.clock.advance(11)
    rm.rm.tick()
    rm.published.epoch = 5
    rm.rm.tick()
    assert len(rm.allocated()) == 2 and not rm.fence.held


# --- TaskManager ------------------------------------------------------------------------------


class Supervisor:
    def __init__(self, fail: bool = False):
        self.calls: list[tuple[str, str]] = []
        self.fail = fail

    def deploy(self, cmd):
        if self.fail:
            raise RuntimeError("no driver")
        self.calls.append(("deploy", cmd.spec.execution_id))

    def cancel(self, execution_id, job_id=None):
        self.calls.append(("cancel", execution_id))

    def trigger_checkpoint(self, cmd):
        self.calls.append(("checkpoint", cmd.execution_id))


class DeadLetters:
    def __init__(self):
        self.entries: list[dict] = []

    def xadd(self, stream, fields, **_):
        assert stream == streams.DLQ_STREAM
        self.entries.append(fields)


class TM:
    def __init__(self, epoch: int | None = 5, fail: bool = False):
        self.clock = FakeClock()
        self.published = Published(epoch)
        self.sup = Supervisor(fail=fail)
        self.t = InMemoryTransport(sender="taskmanager:tm-1")
        self.dlq = DeadLetters()
        self.slept = 0.0

        def sleep(s):
            self.slept += s
            self.clock.advance(s)

        self.control_plane = ClusterAuth.ephemeral()
        self.intake = CommandIntake(
            supervisors={"tm-1": self.sup},
            fence=fence_for(self.published, self.clock),
            transport=self.t,
            dead_letter_client=self.dlq,
            clock=self.clock.now,
            sleep=sleep,
            auth=self.control_plane,
        )

    def send(self, body, *, epoch=5, sender="jobmanager"):
        self.send_raw(type(body), encode(wrap(body, sender=sender, epoch=epoch)).decode())

    def send_raw(self, expected, payload, signature: str | None = None):
        # Signed for tm-1 as the JobManager would: what is tested here comes after the signature.
        signature = signature or self.control_plane.sign_command("tm-1", payload.encode())
        self.intake.handle(expected, (payload, signature), {}, "tm.tm-1")

    def rejected(self) -> list[CommandRejected]:
        return [b for b in self.t.bodies(streams.JM_STREAM) if isinstance(b, CommandRejected)]


def spec(execution_id: str, job_id: str, **extra) -> dict:
    return {
        "job_id": job_id,
        "vertex_id": "v" * 32,
        "execution_id": execution_id,
        "attempt": 0,
        "parallelism": 1,
        "kind": "noop",
        "checkpoint_dir": "/tmp/x",
        "catalog_url": "sqlite://",
        "redis_url": "redis://",
        **extra,
    }


def deploy(execution_id=None, job_id=None, **spec_fields) -> DeployTask:
    ex, job = execution_id or new_execution_id(), job_id or new_job_id()
    return DeployTask(
        taskmanager_id="tm-1", allocation_id=new_allocation_id(), slot_indices=(0,), spec=spec(ex, job, **spec_fields)
    )


def with_spec(raw_spec: dict, *, epoch: int = 5) -> str:
    """A DeployTask envelope carrying `raw_spec` as it is: a spec that does not validate cannot
    be built as a DeployTask, only written by a broken or hostile sender."""
    envelope = json.loads(encode(wrap(deploy(), sender="jobmanager", epoch=epoch)))
    envelope["body"]["spec"] = raw_spec
    return json.dumps(envelope)


def cancel(ex="e" * 32) -> CancelTask:
    return CancelTask(taskmanager_id="tm-1", execution_id=ex, job_id="j" * 32)


def test_taskmanager_obeys_only_the_current_leader_after_a_forged_future_epoch():
    tm = TM()
    tm.send(cancel("forged"), epoch=FORGED)
    tm.send(cancel("stale"), epoch=4)
    tm.send(cancel("stranger"), sender="intruder")
    tm.send(cancel("real"))
    tm.send(deploy("d" * 32))
    assert tm.sup.calls == [("cancel", "real"), ("deploy", "d" * 32)]
    assert tm.rejected() == [] and tm.dlq.entries == []  # refused commands are only logged


def test_invalid_spec_of_the_current_leader_is_dead_lettered_and_rejected_with_its_ids():
    tm = TM()
    tm.send_raw(DeployTask, with_spec({"execution_id": "x" * 32, "job_id": "y" * 32, "kind": "noop"}))
    # A spec that does not validate makes the command undecodable: a stale one is kept as a dead
    # letter too, but not reported.
    tm.send_raw(DeployTask, with_spec({"execution_id": "z" * 32}, epoch=4))
    [r] = tm.rejected()
    assert (r.execution_id, r.job_id, r.command, r.taskmanager_id) == ("x" * 32, "y" * 32, "DeployTask", "tm-1")
    assert "undecodable DeployTask" in r.reason and "spec.vertex_id" in r.reason, r.reason
    letter, stale = tm.dlq.entries
    assert letter["queue"] == b"tm.tm-1" and b"spec.vertex_id" in letter["error"]
    assert b"z" * 32 in stale["orig.m"]
    assert tm.sup.calls == []


def test_undecodable_command_is_dead_lettered_and_rejected_only_if_it_is_the_current_leaders():
    tm = TM()
    tm.send_raw(DeployTask, "garbage")
    tm.send_raw(
        DeployTask,
        '{"sender": "jobmanager", "epoch": 4, "body": {"type": "DeployTask", "spec": {"execution_id": "old"}}}',
    )
    tm.send_raw(
        DeployTask,
        '{"sender": "jobmanager", "epoch": 5, "body": {"type": "DeployTask", '
        '"taskmanager_id": "tm-1", "spec": {"execution_id": "cur", "job_id": "j"}}}',
    )
    tm.intake.handle(CancelTask, (1, 2), {}, "tm.tm-1")  # not even one string
    assert len(tm.dlq.entries) == 4
    assert [(r.execution_id, r.job_id) for r in tm.rejected()] == [("cur", "j")]


def test_a_command_that_cannot_be_carried_out_is_rejected():
    tm = TM(fail=True)
    tm.send(deploy("a" * 32))
    tm.send(CancelTask(taskmanager_id="tm-9", execution_id="b" * 32, job_id="c" * 32))
    reasons = {r.execution_id: r.reason for r in tm.rejected()}
    assert "RuntimeError: no driver" in reasons["a" * 32]
    assert "tm-9 is not a TaskManager of this process" in reasons["b" * 32]
    assert tm.dlq.entries == []


def test_unsigned_or_foreign_signed_commands_are_dead_lettered_and_nobody_is_told():
    tm = TM()
    cp = tm.control_plane
    unsigned, for_tm2, by_tm1 = (
        encode(wrap(cancel(n), sender="jobmanager", epoch=5)).decode() for n in ("unsigned", "for-tm-2", "by-tm-1")
    )
    tm.intake.handle(CancelTask, (unsigned,), {}, "tm.tm-1")
    tm.send_raw(CancelTask, for_tm2, cp.sign_command("tm-2", for_tm2.encode()))
    tm.send_raw(CancelTask, by_tm1, cp.sign(streams.JM_STREAM, "taskmanager:tm-1", by_tm1.encode()))
    assert tm.sup.calls == [] and tm.rejected() == []
    errors = [e["error"] for e in tm.dlq.entries]
    assert errors[0].startswith(b"unsigned command") and all(b"bad signature" in e for e in errors[1:]), errors
    assert len(errors) == 3


def test_taskmanager_waits_a_little_for_a_missing_epoch_then_drops():
    """Redis restarted empty: the leader publishes its epoch again within 2 s."""
    tm = TM(epoch=None)
    tm.send(cancel("while-missing"))
    assert tm.sup.calls == [] and 4.5 <= tm.slept <= 5.5
    tm.send(cancel("still-missing"))  # the wait is not paid again for every command of a backlog
    assert tm.sup.calls == [] and tm.slept <= 5.5
    tm.published.epoch = 5
    tm.send(cancel("after"))
    assert tm.sup.calls == [("cancel", "after")]
