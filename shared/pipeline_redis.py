"""What a pipeline may touch in the cluster's Redis: its data, and its own lineage's sink
bookkeeping, never another's (issue 43.5; docs/runbooks/auth.md "Redis users").

A pipeline reads and writes streams whose names its author chose (`ctx.sources.redis_stream`,
`ctx.sinks.redis_stream`): sources and sink streams are shared data, as Kafka topics are, and
several lineages may append to one stream. So a pipeline may read and write every *data* key:
any key outside the control plane's (`hr:`, the Celery queues and tables) and outside the sinks'
bookkeeping `headrace:sink:`. The bookkeeping (a sink's last committed batch, its fence, its
batches' entry ids and its owner record, redis_sink_fence.py) decides what a sink may write and
undo: a pipeline that could set another lineage's fence to 2^62 would stop that lineage's sink
for good. Sink ids are `<lineage>:<stream>`, so each lineage's bookkeeping is under
`headrace:sink:<lineage>:`, and each running lineage gets a Redis user of its own,
`pipeline.<lineage>`, that may touch that prefix and no other lineage's. The JobManager creates
it when it deploys one of the lineage's tasks (services/jobmanager/pipeline_redis_users.py) and
hands the task its URL; its password is derived from the cluster secret, so nothing stores it.

A job may declare the data keys it reads and writes (shared/redis_key_grants.py); its lineage's
user then reaches those and its bookkeeping only.

The shared `pipeline` user (the dispatcher's restore-check planner, and any pipeline when its
lineage's user cannot be made) has the data keys only: a Redis sink's bookkeeping is refused to
it, with an error that says so.
"""

from __future__ import annotations

import re

from shared import cluster_keys, streams

PIPELINE = "pipeline"
LINEAGE_USER_PREFIX = f"{PIPELINE}."
SINK_PREFIX = "headrace:sink:"
# What a pipeline must never touch: Headrace's own keys and Celery's.
CONTROL_PLANE_PREFIXES = (f"{streams.PREFIX}:", "tm.", "_kombu.", "unacked")
# A lineage id goes into a key pattern and a user name: a job id (32 hex digits), or what an
# older snapshot recorded; no glob characters, no ':' (it ends the sink prefix), no spaces.
LINEAGE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
COMMANDS = "+@all -@dangerous"


def outside(prefixes: tuple[str, ...]) -> list[str]:
    """Glob patterns that together match every key starting with none of `prefixes`.

    Redis ACLs cannot exclude a key pattern, but a glob's `[^...]` can: walk the prefixes as a
    trie; at each inner node s, allow s itself and s followed by any character that does not
    continue towards a prefix."""
    for p in prefixes:
        if not p or any(c in p for c in "*?[]\\^"):
            raise ValueError(f"prefix {p!r} must be non-empty plain text")
    patterns: list[str] = []

    def walk(node: str) -> None:
        nexts = sorted({p[len(node)] for p in prefixes if p.startswith(node) and len(p) > len(node)})
        patterns.append(f"{node}[^{''.join(nexts)}]*")
        for c in nexts:
            child = node + c
            if child in prefixes:
                continue
            patterns.append(child)
            walk(child)

    walk("")
    return patterns


def data_patterns() -> list[str]:
    """Every key a pipeline's data may be: outside the control plane and the sinks' bookkeeping."""
    return outside((*CONTROL_PLANE_PREFIXES, SINK_PREFIX))


def check_lineage(lineage: str) -> str:
    if not isinstance(lineage, str) or not LINEAGE_ID.fullmatch(lineage):
        raise ValueError(f"lineage id {lineage!r} must be 1-100 letters, digits, '.', '_' or '-'")
    return lineage


def lineage_user(lineage: str) -> str:
    return LINEAGE_USER_PREFIX + check_lineage(lineage)


def lineage_of_user(user: str) -> str | None:
    rest = user[len(LINEAGE_USER_PREFIX) :] if user.startswith(LINEAGE_USER_PREFIX) else None
    return rest if rest is not None and LINEAGE_ID.fullmatch(rest) else None


def lineage_password(secret: bytes, lineage: str) -> str:
    # URL-safe hex: it goes into a redis:// URL unquoted.
    return cluster_keys.derive(secret, "pipeline-redis-password", check_lineage(lineage)).hex()


def sink_keys(lineage: str) -> str:
    """The pattern of a lineage's sink bookkeeping keys (redis_sink_fence.py: sink ids are
    `<lineage>:<stream>`)."""
    return f"{SINK_PREFIX}{check_lineage(lineage)}:*"


def shared_rules() -> str:
    """The shared `pipeline` user's rules (without its password)."""
    return f"resetchannels {COMMANDS} " + " ".join(f"~{p}" for p in data_patterns())


def lineage_rules(lineage: str, data: list[str] | None = None) -> list[str]:
    """A lineage's user's rules as ACL SETUSER arguments (without its password): `data`, the key
    rules of what its job declared (shared/redis_key_grants.py), else every data key."""
    if data is None:
        data = [f"~{p}" for p in data_patterns()]
    return ["resetchannels", "resetkeys", *COMMANDS.split(), *data, f"~{sink_keys(lineage)}"]
