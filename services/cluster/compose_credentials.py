"""The compose stack's credentials (`headrace redis-auth deploy`): deploy/.env for compose's
variable interpolation (0600) and deploy/secrets/redis-users.acl, the ACL file the Redis
container loads (hashes only, so readable by the container's redis user).

.env holds, and keeps across runs unless rotated:
  HEADRACE_REDIS_PASSWORD_<USER>   one random password per service user and the pipeline user
  HEADRACE_CLUSTER_SECRET          given to the control-plane containers only (JobManagers,
                                   ResourceManager, dispatcher)
and, derived from that secret for each TaskManager the compose file starts (`--id X`), what
only that TaskManager's container gets:
  HEADRACE_REDIS_PASSWORD_<X>, HEADRACE_TASKMANAGER_KEY_<X>, HEADRACE_TASKMANAGER_COMMAND_KEY_<X>
(X upper-cased, '-' and '.' as '_': tm-1 -> TM_1).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import yaml

from services.cluster import redis_auth
from shared import cluster_keys

SECRET_VARIABLE = "HEADRACE_CLUSTER_SECRET"
COMPOSE_FILE = "docker-compose.yml"


def compose_variable(user: str) -> str:
    return f"HEADRACE_REDIS_PASSWORD_{'ADMIN' if user == redis_auth.ADMIN else user.upper()}"


def suffix(taskmanager_id: str) -> str:
    return re.sub(r"[^A-Z0-9]", "_", redis_auth.check_taskmanager_id(taskmanager_id).upper())


def taskmanager_variables(secret: bytes, taskmanager_id: str) -> dict[str, str]:
    x = suffix(taskmanager_id)
    return {
        f"HEADRACE_REDIS_PASSWORD_{x}": cluster_keys.redis_password(secret, taskmanager_id),
        f"HEADRACE_TASKMANAGER_KEY_{x}": cluster_keys.sender_key(secret, taskmanager_id).hex(),
        f"HEADRACE_TASKMANAGER_COMMAND_KEY_{x}": cluster_keys.command_key(secret, taskmanager_id).hex(),
    }


def compose_taskmanagers(compose_file: Path) -> list[str]:
    """The ids of the TaskManagers a compose file starts (command: [taskmanager, ..., --id, X])."""
    try:
        doc = yaml.safe_load(compose_file.read_text()) or {}
    except FileNotFoundError:
        return []
    ids = []
    for name, service in (doc.get("services") or {}).items():
        command = service.get("command") if isinstance(service, dict) else None
        if isinstance(command, list) and command[:1] == ["taskmanager"]:
            if "--id" not in command[:-1]:
                raise ValueError(
                    f"{compose_file}: service {name} runs a TaskManager without --id; each needs a "
                    f"fixed id to get credentials of its own"
                )
            ids.append(command[command.index("--id") + 1])
    clashes = [x for x in {suffix(t) for t in ids} if sum(suffix(t) == x for t in ids) > 1]
    if clashes:
        raise ValueError(f"{compose_file}: TaskManager ids {sorted(ids)} share variable names ({clashes}); rename one")
    return ids


def compose_files(directory: Path, *, rotate: bool = False) -> tuple[Path, Path]:
    """Write directory/.env and directory/secrets/redis-users.acl; existing passwords and the
    cluster secret stay unless `rotate`."""
    env_file = directory / ".env"
    known = {compose_variable(u): u for u in redis_auth.USERS}
    kept: dict[str, str] = {}
    secret_text = ""
    lines: list[str] = []
    if env_file.exists():
        for line in env_file.read_text().splitlines():
            name, sep, value = (part.strip() for part in line.partition("="))
            if sep and name in known:
                kept[known[name]] = value
            elif sep and name == SECRET_VARIABLE:
                secret_text = value
            elif sep and name.startswith(("HEADRACE_REDIS_PASSWORD_", "HEADRACE_TASKMANAGER_")):
                continue  # derived values: written afresh below
            else:
                lines.append(line)  # the operator's own variables stay
    passwords = redis_auth.new_passwords() | ({} if rotate else {u: p for u, p in kept.items() if p})
    if rotate or not secret_text:
        secret_text = cluster_keys.new_secret()
    secret = cluster_keys.parse_secret(secret_text, what=f"{SECRET_VARIABLE} in {env_file}")
    taskmanagers = compose_taskmanagers(directory / COMPOSE_FILE)
    if not any(line.startswith("COMPOSE_PROJECT_NAME=") for line in lines):
        # docker-compose 1.29 has no top-level `name:`; both it and compose v2 read this.
        lines.insert(0, "COMPOSE_PROJECT_NAME=headrace")
    lines += [f"{compose_variable(u)}={passwords[u]}" for u in redis_auth.USERS]
    lines.append(f"{SECRET_VARIABLE}={secret_text}")
    for tm in taskmanagers:
        lines += [f"{k}={v}" for k, v in taskmanager_variables(secret, tm).items()]
    redis_auth.write_private(env_file, "\n".join(lines) + "\n")
    secrets_dir = directory / "secrets"
    secrets_dir.mkdir(exist_ok=True)
    os.chmod(secrets_dir, 0o700)
    acl = secrets_dir / "redis-users.acl"
    tm_passwords = {tm: cluster_keys.redis_password(secret, tm) for tm in taskmanagers}
    redis_auth.write_private(acl, redis_auth.acl_file(passwords, tm_passwords), mode=0o644)
    return env_file, acl
