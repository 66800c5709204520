"""Garbage-collector settings for the long-running control-plane services.

CPython's cyclic collector makes a young-generation pass every 700 net allocations and, every
hundred of those, a full pass over every object the process holds. A service holds a few
hundred thousand long-lived objects (SQLAlchemy's, pydantic's and Celery's own), and a burst of
messages allocates several ORM objects and models per message: with 2,000 tasks starting at
once, the JobManager spent about a fifth of its CPU in collections (bench/jobmanager_alone.py,
docs/benchmarks.md). Reference counting frees almost everything at once; only reference cycles
wait for the collector, so collecting less often costs a few MB at most.

`tune()` is called once a service has started: everything that exists then is moved out of the
collector's reach for good (gc.freeze: start-up objects are never garbage), and a young pass
runs every YOUNG_THRESHOLD net allocations.
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 10_000


def tune() -> None:
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, older, oldest)
