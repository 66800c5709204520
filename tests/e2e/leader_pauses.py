"""The paused-leader drill's steps, shared by tests/e2e/test_paused_leader_e2e.py and
bench/paused_leader.py: find the leading JobManager, stop its process group (SIGSTOP) while a
catalog session of it is inside a write transaction when it can be caught so, time how long until another
JobManager leads and announces itself, wake the stopped one and wait until it stands by again."""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import dataclass

import psycopg
from kazoo.client import KazooClient

from services.cluster.local_cluster import LocalCluster
from tests.clusters import Rest
from tests.waiting import wait_for

# How long the drill looks for the leader inside a write transaction before it stops it wherever it is.
CATCH_IN_TRANSACTION_S = 5.0
STOPPED_SETTLE_S = 0.5
TAKEOVER_WAIT_S = 90.0
STANDBY_WAIT_S = 60.0


@dataclass(frozen=True)
class Pause:
    stopped: str  # the child name of the JobManager that was stopped
    epoch: int  # its epoch
    in_transaction: bool  # a catalog session of it was inside a transaction that had written
    takeover_s: float  # SIGSTOP -> another JobManager announces itself with a newer epoch
    new_epoch: int
    sessions_left: int  # sessions named for the stopped leader's epoch once the new one led

    def describe(self) -> str:
        where = "inside a write transaction" if self.in_transaction else "outside any write transaction"
        return (
            f"{self.stopped} (epoch {self.epoch}) stopped {where}: epoch {self.new_epoch} leads after "
            f"{self.takeover_s:.2f} s; {self.sessions_left} session(s) of epoch {self.epoch} left"
        )


class LeaderPauses:
    def __init__(self, cluster: LocalCluster, rest: Rest):
        self.c, self.rest = cluster, rest

    def leader(self) -> tuple[str, int]:
        """(child name, epoch) of the leading JobManager, from ZooKeeper's leader node."""
        deadline = time.monotonic() + TAKEOVER_WAIT_S
        while time.monotonic() < deadline:
            zk = KazooClient(hosts=self.c.zookeeper_quorum)
            try:
                zk.start(timeout=5)
                node = json.loads(zk.get("/headrace/jobmanager/leader")[0])
            except Exception:  # noqa: BLE001 - nobody leads yet, or ZooKeeper is busy
                node = None
            finally:
                zk.stop()
                zk.close()
            if node is not None:
                pid = int(node["id"].rsplit(":", 1)[1])
                name = next(
                    (ch.name for ch in self.c.children if ch.name.startswith("jobmanager") and ch.proc.pid == pid), None
                )
                if name is not None:
                    return name, int(node["epoch"])
            time.sleep(0.2)
        raise AssertionError(f"no JobManager led within {TAKEOVER_WAIT_S:.0f} s")

    def _sessions(self, conn: psycopg.Connection, epoch: int) -> list[tuple[int, bool]]:
        """(pid, inside a transaction that has written) of the catalog sessions named for `epoch`:
        one that wrote holds the locks of the rows it wrote until it ends."""
        rows = conn.execute(
            "SELECT pid, backend_xid IS NOT NULL FROM pg_stat_activity WHERE datname = "
            "current_database() AND application_name LIKE %s",
            (f"headrace-jobmanager epoch {epoch} %",),
        ).fetchall()
        return [(pid, bool(busy)) for pid, busy in rows]

    def pause(self) -> Pause:
        """Stop the leader (inside a write transaction if one is seen within CATCH_IN_TRANSACTION_S),
        time the takeover, wake it, and wait until it stands by again."""
        name, epoch = self.leader()
        pid = self.c.child(name).proc.pid
        log = self.c.run_path / "logs" / f"{name}.log"
        standbys_before = log.read_text(errors="replace").count(" is standby: ")
        with psycopg.connect(self.c.catalog_url, autocommit=True) as conn:
            deadline = time.monotonic() + CATCH_IN_TRANSACTION_S
            while not any(busy for _, busy in self._sessions(conn, epoch)) and time.monotonic() < deadline:
                time.sleep(0.001)
            os.killpg(pid, signal.SIGSTOP)
            t0 = time.monotonic()
            try:
                # A COMMIT the leader sent just before it stopped is still carried out: judge a
                # moment later whether the transaction stays open.
                time.sleep(STOPPED_SETTLE_S)
                in_transaction = any(busy for _, busy in self._sessions(conn, epoch))
                new_epoch = self._wait_for_new_leader(epoch)
                takeover = time.monotonic() - t0
                left = len(self._sessions(conn, epoch))
            finally:
                os.killpg(pid, signal.SIGCONT)
        self._wait_standby(log, standbys_before)
        return Pause(name, epoch, in_transaction, takeover, new_epoch, left)

    def _wait_for_new_leader(self, epoch: int) -> int:
        """The epoch of the JobManager that announces itself next (it announces once it recovered)."""
        now = wait_for(
            f"a JobManager with an epoch above {epoch} to announce itself after the leader's SIGSTOP",
            lambda: (self.rest.get("/overview")["jobmanager"] or {}).get("epoch") or 0,
            TAKEOVER_WAIT_S,
            poll_s=0.05,
            until=lambda now: now > epoch,
            ignoring=(Exception,),
        )  # a slow answer on a loaded machine: ask again
        return int(now)

    def _wait_standby(self, log, before: int) -> None:
        wait_for(
            f"the woken JobManager to stand by again (see {log})",
            lambda: log.read_text(errors="replace").count(" is standby: "),
            STANDBY_WAIT_S,
            poll_s=0.2,
            until=lambda standbys: standbys > before,
        )
