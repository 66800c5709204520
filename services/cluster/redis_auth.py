"""Who may do what in the control-plane Redis: one password-protected ACL user per service and
one per TaskManager.

Users (Redis 7 ACL syntax; `%R~` read-only keys, `~` read and write; a `(...)` selector grants
its commands on its keys only):
  default          the operator's and the tests' user: everything (`redis-cli -a PASSWORD`)
  dispatcher       reads hr:*; XADDs to hr:stream:jm and the dead letters
  jobmanager       consumes hr:stream:jm and the TaskManagers' hr:stream:jm:tm:*; owns hr:jm:*;
                   XADDs to hr:stream:rm and the dead letters; LPUSHes Celery commands onto tm.*
                   (and kombu's _kombu.* tables) and publishes their task-sent events (channels
                   /<db>.celeryev/*); makes and deletes the lineages' users pipeline.<lineage>
  resourcemanager  consumes hr:stream:rm, hr:stream:rm:heartbeats and the TaskManagers'
                   hr:stream:rm:tm:*; owns hr:rm:*; XADDs to hr:stream:jm, the TaskManager inboxes
                   hr:stream:tm:* and the dead letters; lists client connections and reads INFO
                   (TaskManager liveness, and the TaskManagers whose streams it reads)
  taskmanager.<id> one per TaskManager, its password derived from the cluster secret
                   (shared/cluster_keys.redis_password): consumes only its own queue tm.<id> and
                   inbox hr:stream:tm:<id>, owns hr:tm:<id>:*, XADDs its reports to its own
                   streams hr:stream:rm:tm:<id>, hr:stream:jm:tm:<id> and hr:stream:dlq:tm:<id>
                   (no stream another TaskManager or the control plane writes: an XADD may trim);
                   its Celery worker may listen on the remote-control channel but not publish to it
  pipeline         the dispatcher's restore-check planner: a pipeline's data keys, outside the
                   control plane and the sinks' bookkeeping headrace:sink:*
  pipeline.<lineage> made by the JobManager for each running lineage, what its tasks get as
                   ctx.redis_url: the data keys and its own headrace:sink:<lineage>:* only
                   (shared/pipeline_redis.py)
A stream is deleted, trimmed or has its groups changed only by its consumer and the admin:
publishers get XADD alone (an XADD with MAXLEN is still XADD; Redis cannot tell it apart, see
docs/runbooks/auth.md "Redis users"). Nobody but the admin may trim or delete the dead letters.
No service user may run the dangerous commands (FLUSHALL, KEYS, CONFIG, SHUTDOWN, ...).

Service passwords are random, stored 0600 in the directory given (for `headrace up`:
$HEADRACE_HOME/redis/credentials.json) and reused, so an operator's `REDISCLI_AUTH` keeps
working across restarts. The ACL file holds SHA-256 hashes only.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

from shared import pipeline_redis, streams
from shared.ids import TASKMANAGER_ID

ADMIN = "default"
SERVICES = ("dispatcher", "jobmanager", "resourcemanager")
TASKMANAGER = "taskmanager"  # the role; each TaskManager's user is taskmanager_user(its id)
PIPELINE = "pipeline"
USERS = (ADMIN, *SERVICES, PIPELINE)
TASKMANAGER_USER_PREFIX = f"{TASKMANAGER}."
# What may follow "tm.<id>" in one of its queue's keys (kombu's priority queues "tm.<id>\x06\x16<n>")
# but never continues an id: so tm-1's patterns do not reach tm-10's queue.
NOT_IN_AN_ID = "[^-a-zA-Z0-9._]"

# Keys Celery (kombu's Redis transport, shared/commands.py) uses without a prefix of ours.
CELERY_PRODUCER_KEYS = ("_kombu.*",)
CELERY_QUEUES = "tm.*"
# The remote-control (pidbox) binding tables every worker refreshes and kombu's sweep of expired
# ones (a script over _kombu.binding_deadlines); the TaskManager's transport keeps no unacked copy
# (shared/transport/kombu_redis.py), so none of kombu's unacked* keys.
CELERY_PIDBOX_KEYS = (
    "_kombu.binding.celery.pidbox",
    "_kombu.binding_permanent.celery.pidbox",
    "_kombu.binding.reply.celery.pidbox",
    "_kombu.binding_permanent.reply.celery.pidbox",
    "_kombu.binding_deadlines",
)
# The reply queues of `celery inspect` (<ticket>.reply.celery.pidbox): a worker answers there.
CELERY_REPLY_QUEUES = "*.reply.celery.pidbox"
# kombu's fanout exchanges are pub/sub channels "/<db>.<exchange>"; the worker's remote
# control (pidbox) listens on one with PSUBSCRIBE, which an ACL allows only for a pattern
# listed literally: one per database number.
CELERY_WORKER_CHANNELS = tuple(f"/{db}.celery.pidbox" for db in range(16))
# Celery events (Flower, `celery events`): the TaskManagers' workers and the JobManager's
# task-sent events PUBLISH to "/<db>.celeryev/<type>"; only the admin user subscribes.
CELERY_EVENT_CHANNELS = tuple(f"/{db}.celeryev/*" for db in range(16))
CONTROL_PLANE_PREFIXES = pipeline_redis.CONTROL_PLANE_PREFIXES

SERVICE_COMMANDS = "+@all -@dangerous"


def check_taskmanager_id(taskmanager_id: str) -> str:
    if not isinstance(taskmanager_id, str) or not TASKMANAGER_ID.fullmatch(taskmanager_id):
        raise ValueError(
            f"TaskManager id {taskmanager_id!r} must be 1-100 letters, digits, '.', '_' or '-', "
            f"starting with a letter or digit (it names a Redis user and its keys)"
        )
    return taskmanager_id


def taskmanager_user(taskmanager_id: str) -> str:
    return TASKMANAGER_USER_PREFIX + check_taskmanager_id(taskmanager_id)


def taskmanager_of(user: str) -> str | None:
    """The TaskManager id of a per-TaskManager user name, else None."""
    if user.startswith(TASKMANAGER_USER_PREFIX) and TASKMANAGER_ID.fullmatch(user[len(TASKMANAGER_USER_PREFIX) :]):
        return user[len(TASKMANAGER_USER_PREFIX) :]
    return None


def _only(command: str, patterns) -> str:
    """A selector: `command` alone on these keys (e.g. XADD to a stream one only publishes to)."""
    return "(" + " ".join(f"~{p}" for p in patterns) + f" +{command})"


outside = pipeline_redis.outside  # shared with the JobManager's lineage users (shared/pipeline_redis.py)


def _keys(mode: str, patterns) -> list[str]:
    return [f"{mode}~{p}" for p in patterns]


def rules(user: str) -> str:
    """The ACL rules of `user` (a service, the pipeline, or a TaskManager's taskmanager.<id>),
    without its password."""
    P = streams.PREFIX
    done = lambda group: f"{P}:done:{group}:*"  # noqa: E731 - transport.redis_streams' dedup hashes
    if user == ADMIN:
        return "~* &* +@all"
    tm = taskmanager_of(user)
    if tm is not None:
        return taskmanager_rules(tm)
    read_all = _keys("%R", [f"{P}:*"])
    if user == "dispatcher":
        parts = read_all + [_only("xadd", [streams.JM_STREAM, streams.DLQ_STREAM])]
    elif user == "jobmanager":
        parts = (
            read_all
            + _keys(
                "",
                [
                    streams.JM_STREAM,
                    streams.tm_jm_stream("*"),
                    f"{P}:jm:*",
                    done(streams.JM_GROUP),
                    *CELERY_PRODUCER_KEYS,
                ],
            )
            + ["+client|list"]
            + [f"&{c}" for c in CELERY_EVENT_CHANNELS]
            # The running lineages' users (services/jobmanager/pipeline_redis_users.py).
            + ["+acl|setuser", "+acl|deluser", "+acl|getuser", "+acl|users", "+acl|save"]
            + [_only("xadd", [streams.RM_STREAM, streams.DLQ_STREAM]), _only("lpush", [CELERY_QUEUES])]
        )
    elif user == "resourcemanager":
        parts = (
            read_all
            + _keys(
                "",
                [
                    streams.RM_STREAM,
                    streams.RM_HEARTBEAT_STREAM,
                    streams.tm_rm_stream("*"),
                    f"{P}:rm:*",
                    done(streams.RM_GROUP),
                ],
            )
            # INFO's run_id tells a Redis restart (every connection dropped) from deaths.
            + ["+client|list", "+info"]
            + [_only("xadd", [streams.JM_STREAM, streams.tm_inbox("*"), streams.DLQ_STREAM])]
        )
    elif user == PIPELINE:
        return pipeline_redis.shared_rules()
    else:
        raise ValueError(
            f"unknown Redis user {user!r}; one of {', '.join(USERS)} or {TASKMANAGER_USER_PREFIX}<TaskManager id>"
        )
    return f"resetchannels {SERVICE_COMMANDS} {' '.join(parts)}"


def taskmanager_rules(taskmanager_id: str) -> str:
    """One TaskManager's rules: its own queue, inbox and keys; XADD alone on what it reports to;
    the remote-control channel to listen on, never to publish to (so no `celery control`
    command can come from a TaskManager)."""
    P = streams.PREFIX
    tm = check_taskmanager_id(taskmanager_id)
    queue = streams.tm_queue(tm)
    # What it reads of others: the leader epoch, the ResourceManager's session, the other
    # TaskManagers' endpoints and probe values (storage probe); no other stream, queue or inbox.
    # What it writes is under its own hr:tm:<id>: (its progress figures and storage probe among
    # them, streams.py), so it cannot change another TaskManager's.
    reads = _keys("%R", [f"{P}:jm:*", f"{P}:rm:*", f"{P}:tm:*"])
    own = _keys(
        "",
        [
            streams.tm_inbox(tm),
            f"{P}:tm:{tm}:*",
            queue,
            f"{queue}{NOT_IN_AN_ID}*",
            f"_kombu.binding.{queue}",
            f"_kombu.binding_permanent.{queue}",
            f"{tm}@*.celery.pidbox*",
            *CELERY_PIDBOX_KEYS,
        ],
    )  # its worker <id>@<host>'s own pidbox
    selectors = [
        _only("xadd", [streams.tm_rm_stream(tm), streams.tm_jm_stream(tm), streams.tm_dead_letters(tm)]),
        _only("lpush", [CELERY_REPLY_QUEUES]),
        "(" + " ".join(f"&{c}" for c in CELERY_WORKER_CHANNELS) + " +psubscribe +subscribe)",
        "(" + " ".join(f"&{c}" for c in CELERY_EVENT_CHANNELS) + " +publish)",
    ]
    return f"resetchannels {SERVICE_COMMANDS} {' '.join(reads + own + selectors)}"


def password_hash(password: str) -> str:
    return hashlib.sha256(password.encode()).hexdigest()


def acl_line(user: str, password: str) -> str:
    return f"user {user} on #{password_hash(password)} {rules(user)}\n"


def acl_file(passwords: dict[str, str], taskmanagers: dict[str, str] | None = None) -> str:
    """An ACL file for redis-server --aclfile: the services' users and one per TaskManager
    (id -> its password). It names `default` too: a user left out of the file would be Redis's
    own default, which needs no password and may do anything."""
    return "".join(
        [acl_line(u, passwords[u]) for u in USERS]
        + [acl_line(taskmanager_user(tm), pw) for tm, pw in sorted((taskmanagers or {}).items())]
    )


def new_passwords() -> dict[str, str]:
    # URL-safe: they go into redis:// URLs and compose files unquoted.
    return {u: secrets.token_urlsafe(24) for u in USERS}


def write_private(path: Path, text: str, mode: int = 0o600) -> None:
    """Write `text` so that it is never readable by others, not even for a moment."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def load_or_create_passwords(directory: Path) -> dict[str, str]:
    """The passwords kept in directory/credentials.json (created 0600 on first use; a user
    added since is given one)."""
    directory.mkdir(parents=True, exist_ok=True)
    os.chmod(directory, 0o700)
    path = directory / "credentials.json"
    stored: dict[str, str] = {}
    if path.exists():
        try:
            stored = json.loads(path.read_text())
        except ValueError:
            raise ValueError(f"{path} is not valid JSON; delete it to have new passwords generated") from None
    passwords = new_passwords() | {u: p for u, p in stored.items() if u in USERS and isinstance(p, str) and p}
    if passwords != stored or (path.stat().st_mode & 0o077):
        write_private(path, json.dumps(passwords, indent=2) + "\n")
    return passwords


def url_for(base_url: str, user: str, password: str) -> str:
    """base_url (redis://host:port/db) with this user's credentials."""
    parts = urlsplit(base_url)
    host = parts.hostname or "127.0.0.1"
    netloc = f"{quote(user, safe='')}:{quote(password, safe='')}@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def masked(url: str) -> str:
    """The URL with its password replaced, for logs, terminals and cluster.json."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = f"{parts.username}:" if parts.username else ":"
    netloc = f"{user}****@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
