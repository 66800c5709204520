"""GET /metrics: the cluster-wide numbers, read from the catalog and Redis at scrape time.

Jobs and attempts by state, restarts, failovers, checkpoints, the JobManager's outbox, the
control-plane streams and the dead letters. Numbers held in one process's memory (slots and
heartbeats in the ResourceManager, task progress in the TaskManagers) are on those processes'
own endpoints (docs/runbooks/metrics.md).
"""

from __future__ import annotations

import json

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, SummaryMetricFamily

from shared import metrics, streams
from shared.catalog import repository as repo
from shared.catalog.repository import deployments as deployments_repo
from shared.deployment_spec import DeploymentSpec
from shared.states import EXECUTION_STATE_NAMES, JOB_STATE_NAMES, JobStatus

router = APIRouter()

CONTROL_STREAMS = (streams.JM_STREAM, streams.RM_STREAM, streams.RM_HEARTBEAT_STREAM)
# The figures of a deployment's newest autoscaler evaluation (shared/autoscaling.py Figures.record):
# key -> (metric name after autoscaler_, help).
AUTOSCALER_FIGURES = {
    "busy": ("busy_ratio", "time in micro-batches over wall time, newest evaluation's window"),
    "arrivalRate": ("arrival_rows_per_second", "rows arriving per second (read plus the lag's growth)"),
    "capacity": ("capacity_rows_per_second", "rows per second the task can process at its parallelism"),
    "lag": ("source_lag", "entries the sources hold beyond what the task read"),
    "fixedCostS": ("batch_fixed_cost_seconds", "the fixed part of a micro-batch's cost, as estimated"),
}


class ClusterCollector(metrics.CachedCollector):
    def __init__(self, catalog, redis_client, **kw):
        super().__init__("dispatcher", **kw)
        self.catalog, self.redis = catalog, redis_client

    def gather(self):
        yield from self._catalog_families()
        yield from self._deployment_families()
        yield from self._redis_families()

    def _catalog_families(self):
        with self.catalog.session() as s:
            jobs = repo.count_jobs_by_status(s)
            attempts = repo.count_executions_by_state(s)
            restarts = repo.count_restarted_attempts(s)
            failovers = repo.count_transitions_to(s, JobStatus.RESTARTING)
            outbox = repo.count_outbox(s)
            checkpoints = repo.count_checkpoints_by_kind_and_status(s)
            completed = repo.completed_durations_by_kind(s)
            latest = repo.newest_completed_of_running_jobs(s)

        g = GaugeMetricFamily(metrics.name("jobs"), "jobs in the catalog by state", labels=["state"])
        for name in JOB_STATE_NAMES:  # every state, zeros too: a series that appears late breaks rate() and alerts
            g.add_metric([name], jobs.get(name, 0))
        yield g
        g = GaugeMetricFamily(metrics.name("attempts"), "task attempts (executions) by state", labels=["state"])
        for name in EXECUTION_STATE_NAMES:
            g.add_metric([name], attempts.get(name, 0))
        yield g
        yield CounterMetricFamily(
            metrics.name("attempt_restarts"),
            "attempts beyond each task's first (restarts after failures, rescales)",
            value=restarts or 0,
        )
        yield CounterMetricFamily(
            metrics.name("job_failovers"),
            "times a job went to RESTARTING (a failure the restart strategy allowed)",
            value=failovers or 0,
        )
        yield GaugeMetricFamily(
            metrics.name("outbox_entries"),
            "JobManager decisions committed but not yet handed to Redis or Celery",
            value=outbox or 0,
        )
        g = GaugeMetricFamily(
            metrics.name("checkpoints"), "checkpoints and savepoints by kind and status", labels=["kind", "status"]
        )
        for kind, status, n in checkpoints:
            g.add_metric([kind, status], n)
        yield g
        summary = SummaryMetricFamily(
            metrics.name("checkpoint_duration_seconds"),
            "trigger-to-acknowledgement time of completed checkpoints",
            labels=["kind"],
        )
        for kind, n, total_ms in completed:
            summary.add_metric([kind], count_value=n, sum_value=(total_ms or 0) / 1000)
        yield summary
        dur = GaugeMetricFamily(
            metrics.name("checkpoint_last_duration_seconds"),
            "duration of each running job's newest completed checkpoint",
            labels=["job"],
        )
        size = GaugeMetricFamily(
            metrics.name("checkpoint_last_size_bytes"),
            "state size of each running job's newest completed checkpoint",
            labels=["job"],
        )
        for job_id, duration_ms, state_size in latest:
            if duration_ms is not None:
                dur.add_metric([job_id], duration_ms / 1000)
            if state_size is not None:
                size.add_metric([job_id], state_size)
        yield dur
        yield size

    def _deployment_families(self):
        """Per deployment: the parallelism it runs at, the autoscaler's rescales and the figures of
        its newest evaluation (the dashboard's autoscaler panel draws the same from the REST API)."""
        with self.catalog.session() as s:
            rows = deployments_repo.list_deployments(s)
            last = {}  # the newest evaluation that read figures (one that waited has none)
            for r in rows:
                if (r.spec.get("autoscaler") or {}).get("enabled"):
                    read = [e for e in deployments_repo.autoscaler_evaluations(s, r.name, limit=20) if e.figures]
                    if read:
                        last[r.name] = read[-1]
            rescales = deployments_repo.count_autoscaler_rescales(s)
        g = GaugeMetricFamily(
            metrics.name("deployment_parallelism"),
            "the parallelism each deployment runs at (the autoscaler's choice or the spec's)",
            labels=["deployment"],
        )
        for r in rows:
            g.add_metric([r.name], DeploymentSpec.from_record(r.spec).effective_parallelism(r.parallelism))
        yield g
        c = CounterMetricFamily(
            metrics.name("autoscaler_rescales"), "rescales the autoscaler decided", labels=["deployment"]
        )
        for name, n in rescales:
            c.add_metric([name], n)
        yield c
        for figure, help_text in AUTOSCALER_FIGURES.items():
            g = GaugeMetricFamily(metrics.name(f"autoscaler_{help_text[0]}"), help_text[1], labels=["deployment"])
            for name, e in last.items():
                value = (e.figures or {}).get(figure)
                if isinstance(value, (int, float)):
                    g.add_metric([name], value)
            yield g

    def _redis_families(self):
        if self.redis is None:  # a dispatcher built on an in-memory transport (unit tests)
            return
        yield from metrics.stream_group_families(self.redis, CONTROL_STREAMS)
        pipe = self.redis.pipeline(transaction=False)
        pipe.xlen(streams.DLQ_STREAM)
        pipe.get(streams.JM_LEADER_KEY)
        dead, leader = pipe.execute()
        yield GaugeMetricFamily(
            metrics.name("dead_letters"),
            f"entries in the dead-letter stream {streams.DLQ_STREAM} (docs/runbooks/dead-letters.md)",
            value=dead or 0,
        )
        epoch = json.loads(leader).get("epoch") if leader else None
        yield GaugeMetricFamily(
            metrics.name("jobmanager_leading"),
            "1 while a JobManager announces leadership",
            value=1 if epoch is not None else 0,
        )
        if epoch is not None:
            yield GaugeMetricFamily(
                metrics.name("jobmanager_epoch"), "leader epoch of the leading JobManager", value=epoch
            )


def registry_for(catalog, redis_client) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ClusterCollector(catalog, redis_client))
    return registry


@router.get("/metrics", include_in_schema=False)
def scrape(request: Request) -> Response:
    return Response(generate_latest(request.app.state.metrics_registry), media_type=CONTENT_TYPE_LATEST)
