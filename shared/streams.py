"""Every Redis key, stream and queue name, in one place (as arq keeps its constants).

Streams (consumer group = the receiving service):
  hr:stream:rm          -> ResourceManager: the JobManager's slot requests and releases
  hr:stream:rm:tm:{id}  -> ResourceManager: one TaskManager's registrations, heartbeats and
                           unregistration (read after hr:stream:rm, so allocation never waits
                           behind a heartbeat backlog)
  hr:stream:jm          -> JobManager: submissions, cancels, slot answers (control plane)
  hr:stream:jm:tm:{id}  -> JobManager: one TaskManager's task states, progress, checkpoint answers
  hr:stream:tm:{id}     -> one TaskManager's inbox: heartbeat acks from the ResourceManager
  hr:stream:dlq         dead letters of the control plane: entries and commands that could not be
                        read or handled, with the error (capped: DLQ_MAXLEN entries of at most a
                        few KB each)
  hr:stream:dlq:tm:{id} one TaskManager's dead letters (what it refused of its queue and inbox)
A TaskManager writes only to streams of its own: Redis cannot refuse `XADD ... MAXLEN 0`, so a
stream it shared with others would be one it could empty (services/cluster/redis_auth.py). A
process simulating many TaskManagers writes to the streams of its own id (`--id`), as it reads
one queue. The control plane finds the streams by the TaskManagers' named connections and the
catalog (services/resourcemanager/report_streams.py).
Celery queues: tm.{taskmanager_id}, one per TaskManager, for DeployTask, CancelTask and
TriggerCheckpoint commands.
"""

from __future__ import annotations

PREFIX = "hr"
RM_STREAM = f"{PREFIX}:stream:rm"
RM_HEARTBEAT_STREAM = f"{PREFIX}:stream:rm:heartbeats"
JM_STREAM = f"{PREFIX}:stream:jm"
DLQ_STREAM = f"{PREFIX}:stream:dlq"
# Dead letters are kept for operators, not forever: about this many (trimmed exactly, it is a
# quiet stream), each with a bounded copy of the original (shared/transport/dead_letters.py).
DLQ_MAXLEN = 5_000
JM_EPOCH_KEY = f"{PREFIX}:jm:epoch"
RM_SESSION_KEY = f"{PREFIX}:rm:session"  # the RM's half of the heartbeat: refreshed every interval
RM_STATS_KEY = f"{PREFIX}:rm:stats"  # JSON, refreshed every second: heartbeat rate and lag
# Hash: TaskManager id -> JSON {"address", "log"}, where it serves its log files, as its signed
# registration says (services/resourcemanager/claims.py); what the dispatcher fetches logs from.
RM_TM_ENDPOINTS_KEY = f"{PREFIX}:rm:tm-endpoints"
# JSON {"id", "epoch", "mode", "since"} of the leading JobManager, refreshed every 2 s and expiring
# after 6 s: the dispatcher shows it, so "no JobManager is leading" is visible, not a silent wait.
JM_LEADER_KEY = f"{PREFIX}:jm:leader"
JM_LEADER_TTL_MS = 6000
RM_GROUP = "resourcemanager"
JM_GROUP = "jobmanager"
TM_GROUP = "taskmanager"


def tm_inbox(taskmanager_id: str) -> str:
    return f"{PREFIX}:stream:tm:{taskmanager_id}"


def tm_warm_key(taskmanager_id: str) -> str:
    """JSON {"ready": n, "starting": m, "parallelism": p, "urgent": b, ...}: the TaskManager's warm
    Spark drivers (services/taskmanager/drivers/warm_pool.py status; read through shared/warm_pools.py)."""
    return f"{PREFIX}:tm:{taskmanager_id}:warm"


def tm_queue(taskmanager_id: str) -> str:
    return f"tm.{taskmanager_id}"


def tm_rm_stream(taskmanager_id: str) -> str:
    """A TaskManager's (or simulating process's) registrations and heartbeats."""
    return f"{PREFIX}:stream:rm:tm:{taskmanager_id}"


def tm_jm_stream(taskmanager_id: str) -> str:
    """A TaskManager's (or simulating process's) reports on its tasks."""
    return f"{PREFIX}:stream:jm:tm:{taskmanager_id}"


def tm_dead_letters(taskmanager_id: str) -> str:
    return f"{DLQ_STREAM}:tm:{taskmanager_id}"


def taskmanager_routes(taskmanager_id: str) -> dict[str, str]:
    """Where a TaskManager process writes what it addresses to the control plane's streams."""
    return {
        RM_STREAM: tm_rm_stream(taskmanager_id),
        RM_HEARTBEAT_STREAM: tm_rm_stream(taskmanager_id),
        JM_STREAM: tm_jm_stream(taskmanager_id),
        DLQ_STREAM: tm_dead_letters(taskmanager_id),
    }


def reporter_of_queue(queue: str) -> str | None:
    """The id whose report streams serve the TaskManager(s) of this command queue (a simulating
    process's TaskManagers share its queue and its streams); None for no queue of ours."""
    prefix = tm_queue("")
    return queue[len(prefix) :] or None if queue.startswith(prefix) else None


def reporter_name(taskmanager_id: str) -> str:
    """Redis CLIENT SETNAME of a TaskManager process's connections that publish: the
    ResourceManager finds a new TaskManager's report streams by it (CLIENT LIST)."""
    return f"{REPORTER_NAME_PREFIX}{taskmanager_id}"


REPORTER_NAME_PREFIX = f"{PREFIX}-reports-"


def done_hash(group: str, hour: int) -> str:
    """Message ids a consumer group has handled, one hash per hour (shared/transport/redis_streams.py)."""
    return f"{PREFIX}:done:{group}:{hour}"


def liveness_name(process_id: str) -> str:
    """Redis CLIENT SETNAME of a TaskManager's liveness connection: the ResourceManager sees it
    vanish the moment the process dies, long before a heartbeat times out."""
    return f"{PREFIX}-tm-{process_id}"


INBOX_MAXLEN = 200


def maxlen_for(stream: str, default: int) -> int:
    """Inboxes hold only recent heartbeat acks; with thousands of TaskManagers a large cap
    per inbox would add up to gigabytes."""
    return INBOX_MAXLEN if stream.startswith(f"{PREFIX}:stream:tm:") else default


def jm_liveness_name(contender_id: str) -> str:
    """Redis CLIENT SETNAME of a JobManager's connections: a standby sees the leader's vanish the
    moment its process dies and takes over without waiting for its ZooKeeper session to expire."""
    return f"{PREFIX}-jm-{contender_id}".replace(" ", "_")


def tm_endpoint_key(taskmanager_id: str) -> str:
    """JSON {"address": "http://host:port", "log": "<its own log file's name>"}: the TaskManager's
    own word on where it serves its metrics, refreshed every heartbeat and expiring after the
    heartbeat timeout: the mark of a running TaskManager (the storage probe). Logs are fetched
    from where its signed registration says (RM_TM_ENDPOINTS_KEY), never from this key."""
    return f"{PREFIX}:tm:{taskmanager_id}:endpoint"


def tm_memory_key(taskmanager_id: str) -> str:
    """JSON {execution_id: {"job_id", "used", "limit", "measure"}}: the latest memory figure of each
    task the TaskManager runs (services/taskmanager/memory/task_memory.py), rewritten every heartbeat and
    expiring after the heartbeat timeout."""
    return f"{PREFIX}:tm:{taskmanager_id}:memory"


def progress_key(taskmanager_id: str, execution_id: str) -> str:
    """Hash of an execution attempt's newest micro-batch figures (batch_id, rates, lag, ...),
    written by the TaskManager running it on each progress report, expiring PROGRESS_TTL_S after
    the last. Under that TaskManager's own hr:tm:<id>:, the keys only its Redis user may write
    (services/cluster/redis_auth.py): readers (the dashboard, the autoscaler) read the figures of
    the TaskManager the catalog placed the attempt on, so no other TaskManager can write them."""
    return f"{PREFIX}:tm:{taskmanager_id}:progress:{execution_id}"


# Long enough for slow triggers (a batch every few minutes); the TaskManager deletes the hash when
# the task ends, so this only bounds what a crashed TaskManager leaves behind.
PROGRESS_TTL_S = 3600


def progress_history_key(taskmanager_id: str, execution_id: str) -> str:
    """Stream of an execution attempt's recent figures, oldest first (the fields of
    `progress_key` without the ids), so a chart opened late draws the last minutes at once.
    Bounded three ways by its TaskManager: at most one point per PROGRESS_HISTORY_STEP_MS, entries
    older than PROGRESS_HISTORY_S trimmed, at most PROGRESS_HISTORY_POINTS; the key expires
    PROGRESS_HISTORY_S after the last point, so an ended attempt's history stays that long (what
    led to a failure) and then goes."""
    return f"{progress_key(taskmanager_id, execution_id)}:history"


PROGRESS_HISTORY_S = 600
PROGRESS_HISTORY_STEP_MS = 1000
PROGRESS_HISTORY_POINTS = 600


def tm_storage_probe_key(taskmanager_id: str) -> str:
    """The random value of the TaskManager's checkpoint-directory probe file, so each new
    TaskManager can check it sees the others' files (services/taskmanager/storage_probe.py).
    Under its own prefix: no other TaskManager can change it."""
    return f"{PREFIX}:tm:{taskmanager_id}:storage-probe"
