"""The cluster secret and the keys derived from it: who can prove what inside the cluster.

One random secret per cluster (32 bytes, hex in settings or a 0600 file) is held only by the
control plane: the JobManagers, the ResourceManager and the dispatchers. Everything else gets a
key derived from it for one purpose and one name, and cannot go back to the secret or sideways
to another name's key (HMAC-SHA256 is a one-way, keyed function):

    sender_key(secret, "tm-1")          signs what tm-1 publishes (reports, registrations); the
                                        control plane derives it again to check the signature,
                                        so a message signed with tm-2's key never passes as tm-1's
    command_key(secret, "tm-1")         signs the JobManager's commands to tm-1; tm-1 holds it to
                                        check them, and no other TaskManager or pipeline has it
    redis_password(secret, "tm-1")      tm-1's own Redis ACL user (services/cluster/redis_auth.py)

A TaskManager is given its three derived values (the operator's `headrace credentials
taskmanager ID`, or `headrace up` for the ones it starts) and never the secret, so a
TaskManager that is not registered that way has nothing it could sign with. Pipelines get none
of them (their drivers run as another OS user with a scrubbed environment).

Rotation: a new secret changes every derived value at once; restart the control plane with it
and give each TaskManager its new credentials.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from pathlib import Path

from shared.errors import ConfigError

SECRET_BYTES = 32
SECRET_FILE = "cluster-secret"


class ClusterSecretError(ConfigError, ValueError):
    """A cluster secret (or a key derived from it) that is missing or malformed."""


def new_secret() -> str:
    return secrets.token_hex(SECRET_BYTES)


def parse_secret(text: str, *, what: str = "cluster secret") -> bytes:
    """A hex secret (at least 32 bytes of it) as bytes, or a clear error."""
    value = (text or "").strip()
    try:
        raw = bytes.fromhex(value)
    except ValueError:
        raise ClusterSecretError(
            f'the {what} must be hexadecimal (e.g. from `python3 -c "import secrets; print(secrets.token_hex(32))"`)'
        ) from None
    if len(raw) < SECRET_BYTES:
        raise ClusterSecretError(
            f"the {what} must hold at least {SECRET_BYTES} bytes ({2 * SECRET_BYTES} hex digits); it has {len(raw)}"
        )
    return raw


def load_or_create_secret(directory: Path) -> bytes:
    """The secret kept in directory/cluster-secret, created (0600, in a 0700 directory) on first
    use. A file readable by others is refused rather than trusted."""
    directory.mkdir(parents=True, exist_ok=True)
    os.chmod(directory, 0o700)
    path = directory / SECRET_FILE
    if not path.exists():
        tmp = path.with_name(f".{SECRET_FILE}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(new_secret() + "\n")
        try:
            os.link(tmp, path)  # never replaces a secret another process created meanwhile
        except FileExistsError:
            pass
        finally:
            os.unlink(tmp)
    if path.stat().st_mode & 0o077:
        raise ClusterSecretError(f"{path} is readable by others; `chmod 600 {path}` (and rotate it if it leaked)")
    return parse_secret(path.read_text(), what=f"cluster secret in {path}")


def derive(secret: bytes, purpose: str, name: str) -> bytes:
    if not purpose or ":" in purpose:
        raise ValueError(f"purpose {purpose!r} must be non-empty and free of ':'")
    return hmac.new(secret, f"headrace:{purpose}:{name}".encode(), hashlib.sha256).digest()


def sender_key(secret: bytes, sender: str) -> bytes:
    return derive(secret, "sender", sender)


def service_key(secret: bytes, service: str) -> bytes:
    # The control plane's own signing keys, in a namespace of their own: a TaskManager someone
    # named "jobmanager" must not hold the JobManager's key (shared/message_auth.py).
    return derive(secret, "service", service)


def command_key(secret: bytes, taskmanager_id: str) -> bytes:
    return derive(secret, "command", taskmanager_id)


def redis_password(secret: bytes, taskmanager_id: str) -> str:
    # URL-safe: it goes into redis:// URLs unquoted, as the services' generated passwords do.
    return derive(secret, "redis-password", taskmanager_id).hex()


def sign(key: bytes, payload: bytes) -> str:
    return hmac.new(key, payload, hashlib.sha256).hexdigest()


def verify(key: bytes, payload: bytes, signature: str | bytes | None) -> bool:
    if signature is None:
        return False
    if isinstance(signature, bytes):
        try:
            signature = signature.decode("ascii")
        except UnicodeDecodeError:
            return False
    return hmac.compare_digest(sign(key, payload), signature)
