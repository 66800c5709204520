"""One lineage writes a declared Redis key at a time (shared/redis_key_grants.py, issue 43.5).

A job that declares the keys it writes (`headrace.redis.keys.write`) is refused with 409 while a
job of another lineage that has not ended declares a write pattern reaching the same keys: its
lineage's Redis user would otherwise be granted the other's streams, and could trim or delete
them. Jobs that declare nothing (the cluster setting `pipeline_redis_keys: shared`) reach every
data key anyway and are not counted. Two submissions at the same moment are not serialised: the
check reads the catalog as it is when each arrives.
"""

from __future__ import annotations

from services.dispatcher.errors import ApiError
from shared import redis_key_grants
from shared.catalog import Catalog, repository
from shared.job_lineage import Lineages
from shared.states import JobStatus

LIVE = [status for status in JobStatus if not status.is_terminal]


def check_no_other_writer(catalog: Catalog, config: dict, lineage: str | None, deployment: str | None = None) -> None:
    """409 naming the other job when a key this job would write is another lineage's (`lineage`:
    the one the job continues, None for a new one; a `deployment`'s own jobs are its own)."""
    mine = redis_key_grants.grants_of(config)
    if mine is None or not mine.write:
        return
    lineages = Lineages()
    with catalog.session() as s:
        for job in repository.list_jobs(s, statuses=LIVE):
            theirs = redis_key_grants.grants_of(job.config)
            if theirs is None or not theirs.write or (deployment is not None and job.deployment == deployment):
                continue
            if lineage is not None and lineages.of(s, job) == lineage:
                continue
            clash = redis_key_grants.write_clash(mine, theirs)
            if clash is not None:
                own, other = clash
                raise ApiError.of(
                    409,
                    f"Redis key pattern {own!r} reaches keys that job {job.id} ({job.name or 'unnamed'}, "
                    f"{job.status}) writes through {other!r}: a key is written by one lineage at a time",
                    field=redis_key_grants.WRITE_OPTION,
                    expected="keys no running job of another lineage writes",
                    got=own,
                    hint=f"choose another stream or prefix, or stop job {job.id} first (headrace cancel {job.id}); "
                    "a job that continues it (restored from its snapshot) may write them",
                    prefix=False,
                )
