"""ZooKeeper adapter for JobManager high availability (the only module that knows kazoo).

ZooKeeper holds pointers only, under one root (default `/headrace`):

    <root>/jobmanager/election/   kazoo Lock contenders (ephemeral sequential nodes; lowest leads)
    <root>/jobmanager/epoch       leader epoch counter (compare-and-set increments)
    <root>/jobmanager/leader      the current leader: JSON {id, epoch, since}; ephemeral

A contender blocks in `LeaderElection.campaign()` until it leads, and gets a `Leadership`. The
leadership is revoked at once when the ZooKeeper connection is SUSPENDED or LOST: a leader that
cannot prove its session is alive must stop acting, because its lock node may already be gone
and another JobManager may lead. It is revoked too when its lock node is deleted: a standby that
found the leader's process dead (`leader_dead`, its Redis connections gone) deletes the leader's
lock node instead of waiting for its session to expire. Revocation is a flag the JobManager loop checks between batches;
everything it sends carries its epoch, so anything in flight from a deposed leader is fenced off
by the ResourceManager, the TaskManagers and the catalog.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import BadVersionError, ConnectionLoss, KazooException, LockTimeout, NodeExistsError, NoNodeError

from shared.errors import CoordinationError

log = logging.getLogger("headrace.zookeeper")


class HAUnavailable(CoordinationError, RuntimeError):
    """ZooKeeper cannot be reached (at start) within the connection timeout."""


@dataclass
class Leadership:
    contender_id: str
    epoch: int
    revoked: threading.Event = field(default_factory=threading.Event)
    reason: str | None = None

    def revoke(self, reason: str) -> None:
        if not self.revoked.is_set():
            self.reason = reason
            self.revoked.set()


class LeaderElection:
    def __init__(
        self,
        quorum: str,
        *,
        root: str = "/headrace",
        contender_id: str,
        session_timeout_s: float = 10.0,
        connect_timeout_s: float = 15.0,
    ):
        self.root = "/" + root.strip("/")
        self.contender_id = contender_id
        # Kazoo's default reconnect backoff doubles up to an hour: after a long ZooKeeper outage
        # no JobManager would lead for about as long again. Retry every few seconds at most.
        retry = {"max_tries": -1, "delay": 0.2, "backoff": 2, "max_delay": 3.0}
        self.zk = KazooClient(hosts=quorum, timeout=session_timeout_s, connection_retry=retry)
        self.connect_timeout_s = connect_timeout_s
        self._lock = self.zk.Lock(f"{self.root}/jobmanager/election", contender_id)
        self._current: Leadership | None = None
        self._unreleased = False  # our lock node may outlive a revocation: delete it before contending
        self.zk.add_listener(self._on_state)

    # --- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        """Connect; raises HAUnavailable if ZooKeeper does not answer within the timeout (the
        caller decides whether to wait longer)."""
        try:
            self.zk.start(timeout=self.connect_timeout_s)
            self.zk.ensure_path(f"{self.root}/jobmanager")
        except Exception as exc:  # noqa: BLE001 - kazoo raises its own timeout type, and socket errors
            try:
                self.zk.stop()
            except KazooException:
                pass
            raise HAUnavailable(
                f"ZooKeeper at {self.zk.hosts} not reachable within {self.connect_timeout_s:g} s: {exc}"
            ) from None

    def close(self) -> None:
        self.resign()
        try:
            self.zk.stop()
            self.zk.close()
        except KazooException:
            pass

    # --- election ----------------------------------------------------------------------

    def campaign(
        self,
        *,
        stop: Callable[[], bool],
        epoch_floor: Callable[[], int] = lambda: 0,
        poll_s: float = 0.25,
        leader_dead: Callable[[str], bool] | None = None,
    ) -> Leadership | None:
        """Block until this contender leads (returns its Leadership) or `stop()` says so (None).
        The epoch is the ZooKeeper counter's next value, raised above `epoch_floor()` (the
        catalog's newest epoch) if ZooKeeper lost its data. `leader_dead(contender_id)`: asked
        about the lock's holder while we wait; True deposes it (see `depose`)."""
        while not stop():
            if self.zk.state != KazooState.CONNECTED:
                time.sleep(poll_s)
                continue
            if self._unreleased:
                # Revoked while disconnected; if the session survived, so did our old lock
                # node, and every contender (us included) would wait behind it forever.
                self._release()
                continue
            try:
                if not self._lock.acquire(timeout=poll_s):
                    continue
            except LockTimeout:
                # Someone else leads; look again (and at `stop`) shortly.
                if leader_dead is not None:
                    self._depose_if_dead(leader_dead)
                continue
            except KazooException as exc:
                log.warning("election attempt failed (%s); trying again", exc)
                time.sleep(poll_s)
                continue
            try:
                epoch = self._next_epoch(epoch_floor())
                self._publish_leader(epoch)
            except Exception:
                # Whatever failed (ZooKeeper, or the catalog/Redis behind epoch_floor), do not sit
                # on the lock: another contender may be able to lead.
                self._release()
                raise
            self._current = Leadership(self.contender_id, epoch)
            self._watch_own_node(self._current)
            if self.zk.state != KazooState.CONNECTED:  # lost while we were winning
                self._current.revoke("ZooKeeper connection lost while taking leadership")
            log.info("%s leads with epoch %d", self.contender_id, epoch)
            return self._current
        return None

    def resign(self) -> None:
        """Give leadership up (graceful stop, or after a revocation): the next contender wins
        at once instead of after the session timeout."""
        if self._current is not None:
            self._current.revoke("resigned")
            self._current = None
        self._release()

    def leader(self) -> dict | None:
        """Who leads now, as published in the leader node (None when nobody does)."""
        try:
            data, _ = self.zk.get(f"{self.root}/jobmanager/leader")
        except NoNodeError:
            return None
        return json.loads(data)

    def holder(self) -> tuple[str, str] | None:
        """(lock node path, contender id) of the contender holding the lock, if any."""
        base = f"{self.root}/jobmanager/election"
        try:
            children = [c for c in self.zk.get_children(base) if "__lock__" in c]
        except NoNodeError:
            return None
        for child in sorted(children, key=lambda c: c[-10:]):  # the sequence suffix orders them
            try:
                data, _ = self.zk.get(f"{base}/{child}")
            except NoNodeError:
                continue
            return f"{base}/{child}", data.decode("utf-8", "replace")
        return None

    def contenders(self) -> list[str]:
        """Every contender's id, the leader (lowest sequence) first."""
        return [str(c) for c in self._lock.contenders()]

    def depose(self, contender_id: str) -> bool:
        """Delete the lock node of `contender_id` if it holds the lock: the next contender
        leads at once. Only for a leader known dead; a live one is revoked by its node watch
        and fenced off by its epoch meanwhile."""
        held = self.holder()
        if held is None or held[1] != contender_id or contender_id == self.contender_id:
            return False
        try:
            self.zk.delete(held[0])
        except NoNodeError:
            return False
        log.warning(
            "deposed %s (its process is gone) without waiting for its ZooKeeper session to expire", contender_id
        )
        return True

    # --- internals ---------------------------------------------------------------------

    def _depose_if_dead(self, leader_dead: Callable[[str], bool]) -> None:
        try:
            held = self.holder()
            if held is not None and held[1] != self.contender_id and leader_dead(held[1]):
                self.depose(held[1])
        except KazooException as exc:
            log.debug("could not look at the lock holder: %s", exc)

    def _watch_own_node(self, lease: Leadership) -> None:
        node = getattr(self._lock, "node", None)
        if not node:
            return
        path = f"{self._lock.path}/{node}"

        def gone(event) -> None:  # kazoo's thread: only flip the flag
            if event is not None and event.type == "DELETED":
                lease.revoke("our lock node was deleted (a standby found this leader dead, or it resigned)")

        try:
            if self.zk.exists(path, watch=gone) is None:
                lease.revoke("our lock node is gone")
        except KazooException:
            lease.revoke("cannot watch our lock node")

    def _next_epoch(self, floor: int) -> int:
        counter = self.zk.Counter(f"{self.root}/jobmanager/epoch")
        counter += 1
        epoch = counter.value
        if epoch <= floor:
            counter += floor + 1 - epoch
            epoch = counter.value
        return epoch

    def _publish_leader(self, epoch: int) -> None:
        path = f"{self.root}/jobmanager/leader"
        data = json.dumps({"id": self.contender_id, "epoch": epoch, "since": time.time()}).encode()
        try:
            self.zk.create(path, data, ephemeral=True)
        except NodeExistsError:
            # Left by the previous leader's session, which has not expired yet although its lock
            # node has (it resigned): we hold the lock, so the node is ours to replace.
            self.zk.delete(path)
            self.zk.create(path, data, ephemeral=True)

    def _release(self) -> None:
        if self.zk.state != KazooState.CONNECTED:
            self._unreleased = True  # no ZooKeeper call now: it would block until reconnected
            return
        try:
            if self._lock.is_acquired:
                self._lock.release()
            self._unreleased = False
        except KazooException:
            self._unreleased = True
            return
        try:
            data, _ = self.zk.get(f"{self.root}/jobmanager/leader")
            if json.loads(data).get("id") == self.contender_id:
                self.zk.delete(f"{self.root}/jobmanager/leader")
        except (KazooException, ValueError):
            pass

    def _on_state(self, state: str) -> None:
        # Runs on kazoo's thread: only flip flags here.
        if state in (KazooState.SUSPENDED, KazooState.LOST) and self._current is not None:
            log.warning("ZooKeeper connection %s: leadership of %s revoked", state, self.contender_id)
            self._current.revoke(f"ZooKeeper connection {state}")


class ZooKeeperCheckpointStore:
    """Checkpoint metadata in ZooKeeper, as Flink keeps it in HA mode: per job a checkpoint id
    counter and one pointer node per retained completed checkpoint (the data itself stays in
    checkpoint storage). A new leader reads the pointers and continues the numbering, so no
    checkpoint is lost or its id reused across a leader change.

        <root>/jobs/<job-id>/checkpoint-counter          kazoo Counter (compare-and-set)
        <root>/jobs/<job-id>/checkpoints/<id, 19 digits> JSON {"id", "path", "batch_id", "kind", "at"}

    Runs on the leader's own ZooKeeper session; a ZooKeeper error raises (KazooException), which
    fails the unit of work like any catalog error. No call waits for ZooKeeper longer than
    `op_timeout_s`, and none is sent while the session is not connected: kazoo queues a request
    made while SUSPENDED until the connection comes back, and a leader cut off ZooKeeper sat in
    such a call for as long as the cut lasted, inside a catalog transaction whose row locks held
    up the new leader (tests/e2e/test_multihost_e2e.py, the ZooKeeper cut).
    """

    def __init__(self, zk: KazooClient, root: str = "/headrace", op_timeout_s: float = 5.0):
        self.zk = zk
        self.root = "/" + root.strip("/")
        self.op_timeout_s = op_timeout_s

    def _job(self, job_id: str) -> str:
        return f"{self.root}/jobs/{job_id}"

    def _wait(self, request):
        """The result of an async kazoo request, or ConnectionLoss after op_timeout_s."""
        try:
            return request.get(timeout=self.op_timeout_s)
        except self.zk.handler.timeout_exception:
            raise ConnectionLoss(f"ZooKeeper did not answer within {self.op_timeout_s:g} s") from None

    def _connected(self) -> None:
        if not self.zk.connected:
            raise ConnectionLoss(f"not connected to ZooKeeper (state {self.zk.state})")

    def next_id(self, job_id: str, *, floor: int = 0) -> int:
        """Increment the job's counter by compare-and-set; never below `floor` + 1."""
        path = f"{self._job(job_id)}/checkpoint-counter"
        while True:
            self._connected()
            try:
                data, stat = self._wait(self.zk.get_async(path))
            except NoNodeError:
                try:
                    self._wait(self.zk.create_async(path, str(max(1, floor + 1)).encode(), makepath=True))
                    return max(1, floor + 1)
                except NodeExistsError:
                    continue  # another writer created it: read it again
            value = max(int(data or b"0") + 1, floor + 1)
            try:
                self._wait(self.zk.set_async(path, str(value).encode(), version=stat.version))
                return value
            except BadVersionError:
                continue

    def add(self, job_id: str, checkpoint_id: int, pointer: dict) -> None:
        path = f"{self._job(job_id)}/checkpoints/{checkpoint_id:019d}"
        data = json.dumps({"id": checkpoint_id, **pointer}).encode()
        self._connected()
        try:
            self._wait(self.zk.create_async(path, data, makepath=True))
        except NodeExistsError:
            self._wait(self.zk.set_async(path, data))

    def completed(self, job_id: str) -> list[dict]:
        """Pointers to the job's retained completed checkpoints, oldest first."""
        base = f"{self._job(job_id)}/checkpoints"
        self._connected()
        try:
            children = sorted(self._wait(self.zk.get_children_async(base)))
        except NoNodeError:
            return []
        out = []
        for child in children:
            try:
                data, _ = self._wait(self.zk.get_async(f"{base}/{child}"))
                out.append(json.loads(data))
            except (NoNodeError, ValueError):
                continue
        return out

    def remove(self, job_id: str, checkpoint_id: int) -> None:
        self._connected()
        try:
            self._wait(self.zk.delete_async(f"{self._job(job_id)}/checkpoints/{checkpoint_id:019d}"))
        except NoNodeError:
            pass

    def remove_job(self, job_id: str) -> None:
        """A globally terminal job's HA data goes; its checkpoint files stay as retention says."""
        self._connected()
        try:
            self.zk.delete(self._job(job_id), recursive=True)  # several requests: kazoo's own helper
        except NoNodeError:
            pass
