"""Leader epochs. Standalone mode (the embedded default, as in Flink) has one JobManager; it
still takes a fresh epoch from a Redis counter at every start, so commands and catalog writes
from a previous incarnation that are still in flight are fenced off. ZooKeeper mode elects a
leader among several JobManagers and takes the epoch from ZooKeeper (shared/zookeeper.py)."""

from __future__ import annotations

import redis

from shared import leader_epoch, streams
from shared.catalog import Catalog
from shared.catalog import repository as repo


def newest_catalog_epoch(catalog: Catalog) -> int:
    """The newest epoch the catalog has seen: its leadership row, or any job's owner."""
    with catalog.session() as s:
        return max(repo.newest_job_epoch(s), repo.leadership_epoch(s))


def acquire_standalone_epoch(client: redis.Redis, catalog: Catalog) -> int:
    """A new epoch above every epoch the catalog has seen: if Redis lost its data (restarted
    without persistence) the counter starts from the catalog's memory, not from 1, so this
    leader's writes are not refused as stale. (In ZooKeeper mode the counter lives in
    ZooKeeper: shared/zookeeper.py.)"""
    newest = newest_catalog_epoch(catalog)
    epoch = int(client.incr(streams.JM_EPOCH_KEY))
    if epoch <= newest:
        epoch = leader_epoch.publish(client, newest + 1)
    return epoch
