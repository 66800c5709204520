"""The JobManager's own metrics: whether this process leads, with which epoch, what it handled
and whether decisions wait in its outbox. Job, attempt and checkpoint counts are cluster-wide
and come from the dispatcher's /metrics (one source, so nothing is counted twice)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from shared import metrics


class JobManagerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r, n = self.registry, metrics.name
        self.leader = Gauge(n("jobmanager_is_leader"), "1 while this JobManager process leads", registry=r)
        self.epoch = Gauge(n("jobmanager_leader_epoch"), "epoch of this process's newest leadership term", registry=r)
        self.terms = Counter(
            n("jobmanager_leadership_terms"), "leadership terms this process started (failovers to it)", registry=r
        )
        self.handled = Counter(
            n("jobmanager_messages_handled"), "control-plane messages handled, by type", ["type"], registry=r
        )
        self.failed = Counter(
            n("jobmanager_messages_failed"), "messages whose handler raised (redelivered)", ["type"], registry=r
        )
        self.refused = Counter(
            n("messages_refused"),
            "messages dead-lettered unread because their sender may not "
            "send them (unsigned, forged, a report from a TaskManager "
            "that does not hold the execution)",
            ["stream", "type"],
            registry=r,
        )
        self._master = None
        Gauge(
            n("jobmanager_outbox_backlog"), "1 while committed decisions wait to be sent again", registry=r
        ).set_function(lambda: 1 if self._master is not None and self._master.outbox.backlog else 0)

    def count_refused(self, stream: str, message_type: str) -> None:
        self.refused.labels(stream=stream, type=message_type).inc()

    def leading(self, master, epoch: int) -> None:
        self._master = master
        self.leader.set(1)
        self.epoch.set(epoch)
        self.terms.inc()
        master.handle = self._counting(master.handle)

    def stopped_leading(self) -> None:
        self._master = None
        self.leader.set(0)

    def _counting(self, handle):
        def counted(env):
            kind = type(env.body).__name__
            try:
                handle(env)
            except Exception:
                self.failed.labels(kind).inc()
                raise
            self.handled.labels(kind).inc()

        return counted
