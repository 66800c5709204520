"""Credentials of one TaskManager: its own Redis ACL user and its derived signing keys, issued
by whoever holds the cluster secret (the operator's `headrace credentials taskmanager ID`, or
`headrace up` for the TaskManagers it starts). A TaskManager gets these and never the secret.

The Redis user is `taskmanager.<id>` (services/cluster/redis_auth.taskmanager_rules), its password
cluster_keys.redis_password(secret, id): the same secret always gives the same password, so a
restarted Redis or a new `headrace up` needs no stored copy, and a new secret revokes them all.
"""

from __future__ import annotations

import re
from pathlib import Path

import redis

from services.cluster import redis_auth
from shared import cluster_keys

# Settings only the control plane may hold: a TaskManager's config file never carries them. A
# TaskManager never opens the catalog (its tasks get the pipeline's own database), so a host
# that is taken over learns no catalog password and cannot write the catalog (API tokens included).
CONTROL_PLANE_ONLY = ("cluster_secret", "catalog_url")
KEY_SETTING = "taskmanager_key"
COMMAND_KEY_SETTING = "taskmanager_command_key"
# One ACL rule argument: a whole selector "( ... )" or one plain token.
_RULE = re.compile(r"\([^)]*\)|\S+")


def rule_args(rules: str) -> list[str]:
    """ACL rules as ACL SETUSER arguments (a selector is one argument, spaces and all)."""
    return _RULE.findall(rules)


def taskmanager_config(base: dict, taskmanager_id: str, redis_url: str, secret: bytes) -> dict:
    """`base` (resolved settings) as one TaskManager's config: its Redis URL and its two keys,
    and nothing only the control plane may know."""
    redis_auth.check_taskmanager_id(taskmanager_id)
    config = {k: v for k, v in base.items() if k not in CONTROL_PLANE_ONLY}
    return config | {
        "redis_url": redis_url,
        KEY_SETTING: cluster_keys.sender_key(secret, taskmanager_id).hex(),
        COMMAND_KEY_SETTING: cluster_keys.command_key(secret, taskmanager_id).hex(),
    }


def passwords(secret: bytes, taskmanager_ids) -> dict[str, str]:
    return {tm: cluster_keys.redis_password(secret, redis_auth.check_taskmanager_id(tm)) for tm in taskmanager_ids}


def ids_in_acl_file(path: Path) -> list[str]:
    """The TaskManagers that have a user in an ACL file (e.g. added by `headrace credentials`
    and saved there), so that rewriting the file keeps them."""
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return []
    ids = []
    for line in lines:
        words = line.split(maxsplit=2)
        if len(words) >= 2 and words[0] == "user":
            tm = redis_auth.taskmanager_of(words[1])
            if tm is not None:
                ids.append(tm)
    return ids


def _save_acl(admin: redis.Redis) -> str | None:
    """ACL SAVE, so that a restarted server keeps the change. None when saved, else why not
    (the user then lives until the server stops: the operator must be told)."""
    if not admin.config_get("aclfile").get("aclfile"):
        return "this Redis has no ACL file"
    try:
        admin.execute_command("ACL", "SAVE")
    except redis.ResponseError as exc:  # e.g. compose's ACL file, a read-only secret
        return f"ACL SAVE failed ({exc})"
    return None


def grant(admin: redis.Redis, secret: bytes, taskmanager_id: str) -> str | None:
    """Create (or reset to today's rules) the TaskManager's Redis user; None when the server's
    ACL file now holds it, else why not."""
    user = redis_auth.taskmanager_user(taskmanager_id)
    password = cluster_keys.redis_password(secret, taskmanager_id)
    admin.execute_command(
        "ACL",
        "SETUSER",
        user,
        "reset",
        "on",
        f"#{redis_auth.password_hash(password)}",
        *rule_args(redis_auth.taskmanager_rules(taskmanager_id)),
    )
    return _save_acl(admin)


def revoke(admin: redis.Redis, taskmanager_id: str) -> tuple[bool, str | None]:
    """Delete the TaskManager's user; Redis closes every connection it has open (its worker,
    its liveness connection: the ResourceManager sees it gone at once). (deleted, why the ACL
    file could not be saved or None)."""
    deleted = bool(admin.execute_command("ACL", "DELUSER", redis_auth.taskmanager_user(taskmanager_id)))
    return deleted, _save_acl(admin)
