"""Who may do what in the control-plane Redis: one password-protected ACL user per service.

Users (Redis 7 ACL syntax; `%R~` read-only keys, `%W~` write-only keys, `~` both):
  default          the operator's and the tests' user: everything (`redis-cli -a PASSWORD`)
  dispatcher       publishes to hr:stream:jm; reads hr:*
  jobmanager       consumes hr:stream:jm; owns hr:jm:*; publishes to hr:stream:rm and the
                   dead-letter stream; sends Celery commands (queues tm.*, kombu's _kombu.*) and
                   their task-sent events (channels /<db>.celeryev/*)
  resourcemanager  consumes hr:stream:rm and hr:stream:rm:heartbeats; owns hr:rm:*; publishes
                   to hr:stream:jm, the TaskManager inboxes hr:stream:tm:* and the dead letters;
                   lists client connections (TaskManager liveness)
  taskmanager      publishes to hr:stream:rm, hr:stream:rm:heartbeats, hr:stream:jm and the
                   dead letters; owns hr:stream:tm:* and hr:tm:*; runs a Celery worker (tm.*,
                   _kombu.*, unacked*, the worker's pidbox, its events /<db>.celeryev/*)
  pipeline         what a task's pipeline gets as ctx.redis_url: every key outside the control
                   plane (its source and sink streams, headrace:sink:* fences), none inside it
Every service user may read hr:* and write only what it owns or publishes to; none may run
the dangerous commands (FLUSHALL, KEYS, CONFIG, SHUTDOWN, ...). Each consumer also owns its
dedup hashes hr:done:<group>:*.

Passwords are random, stored 0600 in the directory given (for `headrace up`:
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

from shared import streams

ADMIN = "default"
SERVICES = ("dispatcher", "jobmanager", "resourcemanager", "taskmanager")
PIPELINE = "pipeline"
USERS = (ADMIN, *SERVICES, PIPELINE)

# Keys Celery (kombu's Redis transport, shared/commands.py) uses without a prefix of ours.
CELERY_PRODUCER_KEYS = ("tm.*", "_kombu.*")
CELERY_WORKER_KEYS = ("tm.*", "_kombu.*", "unacked", "unacked_index", "unacked_mutex", "*.celery.pidbox*")
# kombu's fanout exchanges are pub/sub channels "/<db>.<exchange>"; the worker's remote
# control (pidbox) listens on one with PSUBSCRIBE, which an ACL allows only for a pattern
# listed literally: one per database number.
CELERY_WORKER_CHANNELS = tuple(f"/{db}.celery.pidbox" for db in range(16))
# Celery events (Flower, `celery events`): the TaskManagers' workers and the JobManager's
# task-sent events PUBLISH to "/<db>.celeryev/<type>"; only the admin user subscribes.
CELERY_EVENT_CHANNELS = tuple(f"/{db}.celeryev/*" for db in range(16))
# What a pipeline must never touch: Headrace's own keys and Celery's.
CONTROL_PLANE_PREFIXES = (f"{streams.PREFIX}:", "tm.", "_kombu.", "unacked")

SERVICE_COMMANDS = "+@all -@dangerous"


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


def _keys(mode: str, patterns) -> list[str]:
    return [f"{mode}~{p}" for p in patterns]


def rules(user: str) -> str:
    """The ACL rules of `user`, without its password."""
    P = streams.PREFIX
    done = lambda group: f"{P}:done:{group}:*"  # noqa: E731 - transport.redis_streams' dedup hashes
    if user == ADMIN:
        return "~* &* +@all"
    read_all = _keys("%R", [f"{P}:*"])
    if user == "dispatcher":
        parts = read_all + _keys("", [streams.JM_STREAM])
    elif user == "jobmanager":
        parts = (read_all + _keys("", [streams.JM_STREAM, f"{P}:jm:*", done(streams.JM_GROUP), *CELERY_PRODUCER_KEYS])
                 + _keys("%W", [streams.RM_STREAM, streams.DLQ_STREAM]) + ["+client|list"]
                 + [f"&{c}" for c in CELERY_EVENT_CHANNELS])
    elif user == "resourcemanager":
        parts = (read_all + _keys("", [streams.RM_STREAM, streams.RM_HEARTBEAT_STREAM, f"{P}:rm:*",
                                       done(streams.RM_GROUP)])
                 + _keys("%W", [streams.JM_STREAM, streams.tm_inbox("*"), streams.DLQ_STREAM])
                 + ["+client|list"])
    elif user == "taskmanager":
        parts = (read_all + _keys("", [streams.tm_inbox("*"), f"{P}:tm:*", done(streams.TM_GROUP),
                                       *CELERY_WORKER_KEYS])
                 + _keys("%W", [streams.RM_STREAM, streams.RM_HEARTBEAT_STREAM, streams.JM_STREAM,
                                streams.DLQ_STREAM])
                 + [f"&{c}" for c in CELERY_WORKER_CHANNELS + CELERY_EVENT_CHANNELS])
    elif user == PIPELINE:
        parts = _keys("", outside(CONTROL_PLANE_PREFIXES))
    else:
        raise ValueError(f"unknown Redis user {user!r}; one of {', '.join(USERS)}")
    return f"resetchannels {SERVICE_COMMANDS} {' '.join(parts)}"


def password_hash(password: str) -> str:
    return hashlib.sha256(password.encode()).hexdigest()


def acl_file(passwords: dict[str, str]) -> str:
    """An ACL file for redis-server --aclfile. It names `default` too: a user left out of the
    file would be Redis's own default, which needs no password and may do anything."""
    return "".join(f"user {u} on #{password_hash(passwords[u])} {rules(u)}\n" for u in USERS)


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


def compose_variable(user: str) -> str:
    return f"HEADRACE_REDIS_PASSWORD_{'ADMIN' if user == ADMIN else user.upper()}"


def compose_files(directory: Path, *, rotate: bool = False) -> tuple[Path, Path]:
    """The compose stack's credentials: directory/.env, one password per user for compose's
    variable interpolation (0600), and directory/secrets/redis-users.acl, the ACL file the
    Redis container loads (hashes only, so readable by the container's redis user)."""
    env_file = directory / ".env"
    kept: dict[str, str] = {}
    lines: list[str] = []
    if env_file.exists():
        for line in env_file.read_text().splitlines():
            name, sep, value = line.partition("=")
            by_var = {compose_variable(u): u for u in USERS}
            if sep and name.strip() in by_var:
                kept[by_var[name.strip()]] = value.strip()
            else:
                lines.append(line)  # the operator's own variables stay
    passwords = new_passwords() | ({} if rotate else {u: p for u, p in kept.items() if p})
    if not any(line.startswith("COMPOSE_PROJECT_NAME=") for line in lines):
        # docker-compose 1.29 has no top-level `name:`; both it and compose v2 read this.
        lines.insert(0, "COMPOSE_PROJECT_NAME=headrace")
    lines += [f"{compose_variable(u)}={passwords[u]}" for u in USERS]
    write_private(env_file, "\n".join(lines) + "\n")
    secrets_dir = directory / "secrets"
    secrets_dir.mkdir(exist_ok=True)
    os.chmod(secrets_dir, 0o700)
    acl = secrets_dir / "redis-users.acl"
    write_private(acl, acl_file(passwords), mode=0o644)
    return env_file, acl
