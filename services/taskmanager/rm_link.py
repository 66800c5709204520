"""The TaskManager's side of the two-way heartbeat with the ResourceManager.

Every interval each TaskManager of this process sends a heartbeat with its slot report. The
ResourceManager's half is a broadcast: it refreshes `hr:rm:session` (its session id, expiring
after the heartbeat timeout) so one GET per interval tells a whole process whether the
ResourceManager is alive and whether it is still the same incarnation. It writes to a
TaskManager's inbox only to confirm a registration or to say "unknown TaskManager".

- session key missing for the heartbeat timeout: the ResourceManager is lost; tasks keep
  running and heartbeats keep going out;
- a new session id (it restarted), or "unknown TaskManager": register again with everything
  this TaskManager runs, so the ResourceManager and the JobManager can reconcile.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, cast

import redis
from redis.typing import KeyT, StreamIdT

from services.taskmanager.memory import task_memory
from services.taskmanager.supervisor import TaskSupervisor
from shared import streams
from shared.ids import TaskManagerId
from shared.message_auth import SIGNATURE_FIELD
from shared.messages import (
    HeartbeatAck,
    RegisterTaskManager,
    TaskManagerHeartbeat,
    UndecodableMessage,
    UnregisterTaskManager,
    decode,
)
from shared.transport import dead_letters
from shared.transport.redis_streams import RedisStreamsTransport

log = logging.getLogger("headrace.taskmanager.rm")
# XREAD's answer as a client that does not decode responses reads it: per stream, its entries
# (id, fields).
InboxEntries = list[tuple[bytes | str, list[tuple[bytes | str, Mapping[Any, bytes]]]]]


def warm_drivers(sup: TaskSupervisor) -> dict[str, int]:
    """The warm drivers, for placement by the ResourceManager: how many are ready, their
    parallelism, and how many are still warming up with their session up (the message fields)."""
    pool = sup.warm
    if pool is None:
        return {"warm_ready": 0, "warm_parallelism": 0, "warm_warming": 0}
    status = pool.status()
    return {
        "warm_ready": int(status["ready"]),
        "warm_parallelism": int(status["parallelism"]),
        "warm_warming": int(status["warming"]),
    }


@dataclass
class LinkState:
    taskmanager_id: TaskManagerId
    registered: bool = False
    rm_session: str | None = None
    last_ack: float = 0.0
    rm_lost: bool = False
    inbox_cursor: str = "0"
    seq: int = 0
    # A registration not yet answered: when it was sent, and how long to wait before sending it
    # again (doubling, as Flink's TaskExecutor retries its registration).
    registration_sent: float | None = None
    registration_retry_s: float = 0.0


def registration_due(st: LinkState, now: float, *, interval_s: float, timeout_s: float) -> bool:
    """Send a registration now? Once at first, then again after a delay that doubles up to
    half the heartbeat timeout: a ResourceManager with a backlog answers every registration
    eventually, and resending each one every interval (10,000 TaskManagers at 1 Hz) only
    lengthened the backlog until nobody was answered in time. An answer resets it (_on_ack)."""
    if st.registration_sent is not None and now - st.registration_sent < st.registration_retry_s:
        return False
    st.registration_retry_s = (
        interval_s if st.registration_sent is None else min(timeout_s / 2, st.registration_retry_s * 2)
    )
    st.registration_sent = now
    return True


class ResourceManagerLink:
    def __init__(
        self,
        *,
        client: redis.Redis,
        transport: RedisStreamsTransport,
        supervisors: dict[TaskManagerId, TaskSupervisor],
        slots: int,
        cores: float,
        memory_bytes: int,
        interval_s: float,
        timeout_s: float,
        liveness_name: str,
        simulated: bool = False,
        queue_of: Callable[[str], str] = streams.tm_queue,
        liveness: redis.Redis | None = None,
        log_endpoint: str | None = None,
        main_log: str | None = None,
    ) -> None:
        self.client, self.transport, self.supervisors = client, transport, supervisors
        self.slots, self.cores, self.memory_bytes = slots, cores, memory_bytes
        self.interval_s, self.timeout_s = interval_s, timeout_s
        self.liveness_name, self.simulated, self.queue_of = liveness_name, simulated, queue_of
        self.liveness = liveness
        self.log_endpoint, self.main_log = log_endpoint, main_log  # told with each registration
        self.states = {tm: LinkState(tm) for tm in supervisors}
        self._stop = threading.Event()
        self._host = socket.gethostname()
        self._thread = threading.Thread(target=self._run, name="rm-link", daemon=True)

    def start(self) -> None:
        # Acks addressed to a previous incarnation of these TaskManagers mean nothing now; with
        # the inbox emptied, reading from "0" never misses an ack that lands between two reads.
        keys = [streams.tm_inbox(tm) for tm in self.states]
        for i in range(0, len(keys), 1000):
            self.client.delete(*keys[i : i + 1000])
        now = time.monotonic()
        for st in self.states.values():
            st.last_ack = now
        self._thread.start()

    def stop(self, *, unregister: bool = True) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        if unregister:
            try:
                self.transport.publish_many(
                    [(streams.RM_STREAM, UnregisterTaskManager(taskmanager_id=tm)) for tm in self.states]
                )
                self.client.delete(*[streams.tm_inbox(tm) for tm in self.states])
            except redis.RedisError:
                pass

    def _run(self) -> None:
        next_beat = 0.0
        while not self._stop.is_set():
            try:
                now = time.monotonic()
                if now >= next_beat:
                    self._beat(now)
                    next_beat = now + self.interval_s
                self._read_acks(block_ms=int(max(0.01, min(0.2, next_beat - time.monotonic())) * 1000))
            except redis.RedisError as exc:
                log.warning("Redis unreachable (%s); tasks keep running, retrying", exc)
                self._stop.wait(1.0)

    def _beat(self, now: float) -> None:
        if self.liveness is not None:
            self.liveness.ping()  # reopens the named connection if Redis dropped it
        stored = self.client.get(streams.RM_SESSION_KEY)
        session = (stored.decode() if isinstance(stored, bytes) else stored) or None
        out: list[tuple[str, object]] = []
        for tm, st in self.states.items():
            sup = self.supervisors[tm]
            if session is not None:
                st.last_ack = now
                if st.rm_lost:
                    log.info("ResourceManager is back for %s", tm)
                    st.rm_lost = False
                # rm_session is the session that confirmed our registration (see _on_ack).
                if st.registered and session != st.rm_session:
                    log.info("ResourceManager restarted (new session); re-registering %s", tm)
                    st.registered = False
            if not st.rm_lost and now - st.last_ack > self.timeout_s:
                st.rm_lost = True
                log.warning(
                    "ResourceManager lost for %s (no answer for %.0f s); tasks keep running", tm, self.timeout_s
                )
            if not st.registered:
                if registration_due(st, now, interval_s=self.interval_s, timeout_s=self.timeout_s):
                    out.append((streams.RM_STREAM, self._registration(tm, sup)))
            else:
                st.seq += 1
                sup.publish_warm_status()  # refreshes the key's TTL while the process lives
                task_memory.publish(self.client, tm, task_memory.figures(sup.task_drivers()), ttl_s=self.timeout_s)
                slot_report = sup.slot_report()
                warm = warm_drivers(sup)  # after the slot report: see slot_manager.py
                out.append(
                    (
                        streams.RM_HEARTBEAT_STREAM,
                        TaskManagerHeartbeat(taskmanager_id=tm, slot_report=slot_report, seq=st.seq, **warm),
                    )
                )
        self.transport.publish_many(out)

    def _registration(self, tm: TaskManagerId, sup: TaskSupervisor) -> RegisterTaskManager:
        return RegisterTaskManager(
            taskmanager_id=tm,
            host=self._host,
            slots=self.slots,
            cores=self.cores,
            memory_bytes=self.memory_bytes,
            queue=self.queue_of(tm),
            slot_report=sup.slot_report(),
            running=sup.running_reports(),
            simulated=self.simulated,
            liveness_name=self.liveness_name,
            **warm_drivers(sup),
            log_endpoint=self.log_endpoint,
            main_log=self.main_log,
        )

    def _read_acks(self, block_ms: int) -> None:
        keys: dict[KeyT, StreamIdT] = {streams.tm_inbox(tm): st.inbox_cursor for tm, st in self.states.items()}
        resp = cast("InboxEntries | None", self.client.xread(keys, block=block_ms, count=50))
        for stream, entries in resp or []:
            name = stream.decode() if isinstance(stream, bytes) else stream
            tm = TaskManagerId(name.rsplit(":", 1)[-1])
            st = self.states.get(tm)
            if st is None:
                continue
            for entry_id, fields in entries:
                st.inbox_cursor = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
                try:
                    env = decode(fields[b"m"])
                    # Only the control plane signs an inbox entry (with this TaskManager's command
                    # key): a forged "unknown TaskManager" must not make it stop its tasks.
                    error = self.transport.auth.check(
                        streams.tm_inbox(tm), env, fields[b"m"], fields.get(SIGNATURE_FIELD)
                    )
                except (UndecodableMessage, KeyError) as exc:
                    error = "entry has no 'm' field" if isinstance(exc, KeyError) else str(exc)
                if error is not None:
                    log.warning("dead-lettering entry %s of %s: %s", st.inbox_cursor, streams.tm_inbox(tm), error)
                    dead_letters.add_safely(
                        self.client,
                        error=error,
                        original=fields,
                        origin={"stream": streams.tm_inbox(tm), "entry_id": st.inbox_cursor},
                        stream=self.transport.route.get(streams.DLQ_STREAM, streams.DLQ_STREAM),
                    )
                    continue
                if isinstance(env.body, HeartbeatAck):
                    self._on_ack(st, env.body)

    def _on_ack(self, st: LinkState, ack: HeartbeatAck) -> None:
        """Registration confirmed (known) or refused as unknown (register again)."""
        st.last_ack = time.monotonic()
        st.rm_lost = False
        if not ack.known:
            if st.registered and ack.rm_session == st.rm_session:
                # The same ResourceManager that knew us forgot us: it declared us lost (we were
                # cut off or frozen), and the JobManager has run our tasks elsewhere since. Stop
                # them here at once, as Flink's TaskExecutor does, instead of letting them work
                # until the JobManager finds them at the re-registration.
                stopped = self.supervisors[st.taskmanager_id].abandon_tasks(
                    "the ResourceManager declared this TaskManager lost"
                )
                log.warning(
                    "%s was declared lost by the ResourceManager: stopped its %d task(s); re-registering",
                    st.taskmanager_id,
                    stopped,
                )
            elif st.registered:
                log.info("re-registering %s: the ResourceManager does not know it", st.taskmanager_id)
            st.registered = False
        else:
            st.registered = True
        st.registration_sent = None  # answered: the next registration (if any) goes at once
        st.rm_session = ack.rm_session
