"""Receivers fence JobManager messages by the current leader epoch (issue 7, gaps 3 and 10), and
the ResourceManager takes TaskManagers' slot reports as the truth (gap 4).

A real cluster (ResourceManager, JobManager, one TaskManager, dispatcher as processes, a real
redis-server, a PostgreSQL catalog) and no-op jobs. Forged messages are written straight into
Redis, as a hostile local user could: they must be refused, and must not make the receivers
refuse the real JobManager's messages afterwards ("the highest epoch seen" would).
"""

from __future__ import annotations

import time

import pytest
import redis

from services.resourcemanager.fencing import JobManagerFence
from services.resourcemanager.service import ResourceManager
from shared import leader_epoch, streams
from shared.catalog import Catalog
from shared.catalog import repository as repo
from shared.clock import FakeClock
from shared.commands import CommandGateway, make_celery
from shared.ids import new_execution_id, new_job_id
from shared.leader_epoch import LeaderEpochFence
from shared.message_auth import ClusterAuth, control_plane_auth
from shared.messages import (
    CancelTask,
    RegisterTaskManager,
    ReleaseSlots,
    RequestSlots,
    SlotState,
    TaskManagerHeartbeat,
    decode,
    encode,
    wrap,
)
from shared.settings import Settings
from shared.transport.redis_streams import RedisStreamsTransport
from tests.clusters import start_cluster
from tests.waiting import wait_for

FORGED_EPOCH = 10**12


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, pg_url_module):
    c = start_cluster(tmp_path_factory.mktemp("fence-home"), catalog_url=pg_url_module, taskmanagers=1, slots=4)
    yield c
    c.stop()


@pytest.fixture(scope="module")
def client(cluster):
    c = redis.Redis.from_url(cluster.redis_url)
    yield c
    c.close()


def noop(rest, jar, *, duration=-1, parallelism=1):
    return rest.run(
        jar, kind="noop", parallelism=parallelism, restartStrategy={"type": "none"}, config={"noop.duration": duration}
    )


# The forgers here hold the cluster's keys (signed messages are tests/integration/
# test_signed_messages.py's): what is tested is the epoch fence behind the signature check.
def forge_command(cluster, queue: str, body, *, epoch: int, sender: str = "jobmanager") -> None:
    app = make_celery(cluster.redis_url, "forger")
    try:
        CommandGateway(app, sender=sender, epoch=epoch, auth=control_plane_auth(cluster.settings)).cancel(queue, body)
    finally:
        app.close()


def forge_rm_message(cluster, client, body, *, epoch: int, sender: str = "jobmanager") -> None:
    raw = encode(wrap(body, sender=sender, epoch=epoch))
    client.xadd(
        streams.RM_STREAM, {b"m": raw, b"s": control_plane_auth(cluster.settings).sign(streams.RM_STREAM, sender, raw)}
    )


def wait_consumed(client, timeout_s: float = 10) -> None:
    """Both receivers have taken everything forged so far: the RM group has no lag and the
    TaskManager's Celery queue is empty."""

    def consumed() -> bool:
        groups = {g["name"]: g for g in client.xinfo_groups(streams.RM_STREAM)}
        rm = groups.get(streams.RM_GROUP.encode())
        return bool(rm and rm.get("lag") == 0 and rm["pending"] == 0 and client.llen(streams.tm_queue("tm-1")) == 0)

    wait_for("the forged messages consumed", consumed, timeout_s, poll_s=0.05)


def test_forged_future_epoch_does_not_make_real_messages_stale(cluster, rest, jar, client):
    # Like a hostile local user: a slot request and a cancel with an epoch far in the future.
    forge_rm_message(
        cluster,
        client,
        RequestSlots(
            request_id=new_execution_id(), job_id=new_job_id(), execution_id=new_execution_id(), slots=1, timeout_s=30
        ),
        epoch=FORGED_EPOCH,
    )
    forge_command(
        cluster,
        streams.tm_queue("tm-1"),
        CancelTask(taskmanager_id="tm-1", execution_id=new_execution_id(), job_id=new_job_id()),
        epoch=FORGED_EPOCH,
    )
    wait_consumed(client)
    # The real JobManager's RequestSlots and DeployTask come after them and must be accepted.
    job = noop(rest, jar)
    attempts = rest.wait_attempt_running(job, 0, timeout_s=20)
    execution = attempts[0]["execution-id"]

    # Forged cancels of the running attempt: a future epoch, an old epoch, a stranger's sender.
    current = leader_epoch.current(client)
    assert current is not None and current < FORGED_EPOCH
    for epoch, sender in ((FORGED_EPOCH, "jobmanager"), (current - 1, "jobmanager"), (current, "intruder")):
        forge_command(
            cluster,
            streams.tm_queue("tm-1"),
            CancelTask(taskmanager_id="tm-1", execution_id=execution, job_id=job),
            epoch=epoch,
            sender=sender,
        )
    wait_consumed(client)
    time.sleep(1.0)  # a cancel that got through would have reported CANCELED by now
    assert [(a["attempt"], a["status"]) for a in rest.attempts(job)] == [(0, "RUNNING")]

    # The real JobManager is still obeyed.
    rest.cancel(job)
    assert rest.wait_state(job, "CANCELED", timeout_s=15)["state"] == "CANCELED"
    assert rest.wait_free_slots(4) == 4


def test_forged_slot_requests_are_refused(cluster, rest, client):
    """Refused, not allocated: the ResourceManager holds no slot for them and the JobManager is
    never asked about them."""
    current = leader_epoch.current(client)
    forged = [(FORGED_EPOCH, "jobmanager"), (current - 1, "jobmanager"), (current, "taskmanager:tm-1")]
    before = client.xlen(streams.JM_STREAM)
    for epoch, sender in forged:
        forge_rm_message(
            cluster,
            client,
            RequestSlots(
                request_id=new_execution_id(),
                job_id=new_job_id(),
                execution_id=new_execution_id(),
                slots=4,
                timeout_s=30,
            ),
            epoch=epoch,
            sender=sender,
        )
    wait_consumed(client)
    time.sleep(0.7)  # the ResourceManager answers in its next tick
    answers = client.xrange(streams.JM_STREAM, count=10_000)[before:]
    assert [a for a in answers if b"SlotsAllocated" in a[1][b"m"] or b"SlotRequestPending" in a[1][b"m"]] == []
    assert rest.wait_free_slots(4) == 4


def test_parallelism_no_taskmanager_can_offer_says_why_at_once(rest, jar):
    job = noop(rest, jar, parallelism=64)
    reason = wait_for("a waiting reason", lambda: rest.job(job).get("waiting-reason"), 5)
    assert reason and "parallelism 64 needs 64 slots on one TaskManager; the largest has 4" in reason, reason
    rest.cancel(job)
    assert rest.wait_state(job, "CANCELED", timeout_s=15)["state"] == "CANCELED"


# --- ResourceManager reconciliation with TaskManager slot reports (real Redis, no cluster) ------


class RMOnRedis:
    """A ResourceManager on a real Redis, driven by hand: a fake clock, a JobManager and a
    TaskManager that are just transports."""

    def __init__(self, tmp_path, redis_url):
        self.client = redis.Redis.from_url(redis_url)
        leader_epoch.publish(self.client, 3)
        self.clock = FakeClock()
        settings = Settings(home=tmp_path, redis_url=redis_url, heartbeat_interval_s=2, heartbeat_timeout_s=10)
        catalog = Catalog(settings.catalog)
        catalog.migrate()
        fence = JobManagerFence(LeaderEpochFence.from_redis(self.client), clock=self.clock.now)
        auth = ClusterAuth.ephemeral()  # one cluster: the three transports share its keys
        self.rm = ResourceManager(
            settings,
            catalog,
            RedisStreamsTransport(self.client, sender="resourcemanager", auth=auth),
            self.clock,
            fence=fence,
        )
        self.rm.adopt_previous_taskmanagers()
        self.jm = RedisStreamsTransport(self.client, sender="jobmanager", epoch=3, auth=auth)
        self.tm = RedisStreamsTransport(self.client, sender="taskmanager:tm-1", auth=auth)
        self.register(())

    def pump(self):
        for _ in range(3):
            self.rm.poll_once(block_ms=0)
            self.rm.tick()

    def register(self, report):
        self.tm.publish(
            streams.RM_STREAM,
            RegisterTaskManager(
                taskmanager_id="tm-1",
                host="h",
                slots=4,
                cores=1,
                memory_bytes=1,
                queue="tm.tm-1",
                slot_report=self.slots(report),
            ),
        )
        self.pump()

    def heartbeat(self, report):
        self.tm.publish(
            streams.RM_HEARTBEAT_STREAM, TaskManagerHeartbeat(taskmanager_id="tm-1", slot_report=self.slots(report))
        )
        self.pump()

    @staticmethod
    def slots(report) -> tuple[SlotState, ...]:
        """`report`: (allocation id, indices) pairs the TaskManager runs; every other slot is free."""
        held = {i: a for a, indices in report for i in indices}
        return tuple(
            SlotState(
                index=i,
                allocation_id=held.get(i),
                job_id="job-" + held[i] if i in held else None,
                execution_id="ex-" + held[i] if i in held else None,
            )
            for i in range(4)
        )

    def request(self, slots: int) -> str:
        ex = new_execution_id()
        self.jm.publish(
            streams.RM_STREAM,
            RequestSlots(request_id=ex, job_id=new_job_id(), execution_id=ex, slots=slots, timeout_s=300),
        )
        self.pump()
        [alloc] = [
            decode(f[b"m"]).body
            for _, f in self.client.xrange(streams.JM_STREAM)
            if b"SlotsAllocated" in f[b"m"] and ex.encode() in f[b"m"]
        ]
        return alloc.allocation_id

    def held(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for s in self.rm.slots.allocations_of("tm-1"):
            out.setdefault(s["allocation_id"], []).append(s["index"])
        return out

    def catalog_view(self) -> list[dict]:
        self.rm.flush_catalog()
        with self.rm.catalog.session() as s:
            return list(repo.get_taskmanager(s, "tm-1").allocations)


@pytest.fixture
def rmr(tmp_path, redis_url):
    r = RMOnRedis(tmp_path, redis_url)
    yield r
    r.client.close()


def test_registration_replaces_what_the_resourcemanager_held(rmr):
    a = rmr.request(2)
    rmr.heartbeat([(a, (0, 1))])
    assert rmr.held() == {a: [0, 1]}
    # The TaskManager came back without that task (say, its process restarted): its report wins.
    rmr.register([("zz", (3,))])
    assert rmr.held() == {"zz": [3]}
    assert rmr.rm.slots.free_slots() == 3
    assert [(s["allocation_id"], s["index"]) for s in rmr.catalog_view()] == [("zz", 3)]


def test_heartbeat_slot_reports_repair_drift(rmr):
    grace = rmr.rm.members.in_flight_grace_s
    # Held, never reported: in flight for the grace period, then freed.
    a = rmr.request(1)
    for _ in range(int(grace // 5)):
        rmr.clock.advance(5)
        rmr.heartbeat([])
    assert a in rmr.held()
    rmr.clock.advance(5)
    rmr.heartbeat([])
    assert a not in rmr.held() and rmr.rm.slots.free_slots() == 4
    # Reported once, then not any more (the task ended before the JobManager released it): freed at once.
    b = rmr.request(2)
    rmr.heartbeat([(b, rmr.held()[b])])
    rmr.heartbeat([])
    assert rmr.held() == {} and rmr.rm.slots.free_slots() == 4
    # Reported but unknown (an allocation made before a ResourceManager lost its memory): adopted.
    rmr.heartbeat([("x1", (0, 1))])
    assert rmr.held() == {"x1": [0, 1]}
    assert {(s["job_id"], s["execution_id"]) for s in rmr.catalog_view()} == {("job-x1", "ex-x1")}
    # Released by the JobManager: a report sent before the release does not bring it back.
    rmr.jm.publish(streams.RM_STREAM, ReleaseSlots(allocation_id="x1"))
    rmr.pump()
    rmr.heartbeat([("x1", (0, 1))])
    assert rmr.held() == {}
    # A task the TaskManager runs on slots we gave to an allocation still in flight: the report wins.
    c = rmr.request(4)
    rmr.heartbeat([("y1", (2,))])
    assert rmr.held() == {"y1": [2]} and c not in rmr.held()
    assert rmr.rm.slots.free_slots() == 3
