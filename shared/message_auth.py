"""Signed messages: who may say what on the bus (issue 21; docs/runbooks/auth.md "Signed messages").

Every stream entry carries, beside the envelope's exact bytes (`m`), an HMAC-SHA256 of those
bytes (`s`) under its sender's key, and every command to a TaskManager carries one under that
TaskManager's command key (shared/commands.py). The keys come from the cluster secret
(shared/cluster_keys.py):

    sender "taskmanager:<id>"       sender_key(secret, id): what that TaskManager publishes
    any other sender                service_key(secret, name): the control plane (jobmanager,
                                    resourcemanager, dispatcher), which holds the secret
    an entry of <id>'s inbox        command_key(secret, id), so the TaskManager can check it
    a Celery command to <id>        command_key(secret, id), over the envelope with its epoch

`ClusterAuth` holds the secret (the control plane): it signs as anyone and verifies everyone.
`TaskManagerAuth` holds only its TaskManagers' derived keys: it signs as them and checks what is
addressed to them, nothing else. A signature proves the sender; `rule_violation` then says what
that sender may send at all (a TaskManager only its own reports), and the receivers check the
rest against their state (the JobManager: is this the TaskManager that holds the execution?).
Whatever fails is dead-lettered, never handled.

Freshness: a signature says who sent a message, not when, so a copy kept and written again later
would check out. The consumers remember the ids they handled (shared/transport/redis_streams.py)
for DEDUP_WINDOW_S; a copy replayed within it is skipped, and one older than it is refused here
(`staleness`): an envelope whose sent-at is more than MAX_AGE_S before the receiver's clock, or
more than MAX_CLOCK_SKEW_S after it. MAX_AGE_S is the window less the skew allowed, so a copy is
either remembered or refused even when the sender's clock runs that far ahead.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, overload

from shared import cluster_keys, streams
from shared.errors import MessageError
from shared.messages import (
    CheckpointAcknowledged,
    CheckpointDeclined,
    CommandRejected,
    Envelope,
    RedisKeysClaimed,
    RegisterTaskManager,
    TaskManagerHeartbeat,
    TaskProgress,
    TaskStateChanged,
    TaskWaiting,
    UnregisterTaskManager,
)

log = logging.getLogger(__name__)

SIGNATURE_FIELD = b"s"
TASKMANAGER_PREFIX = "taskmanager:"
SECRETS_DIR = "secrets"
_INBOX_PREFIX = streams.tm_inbox("")
# Inbox entries are signed with the command key too: a distinct prefix keeps an inbox signature
# from ever passing as a command's.
_INBOX_DOMAIN = b"hr-inbox\0"
_CACHE_MAX = 200_000  # derived keys kept per process (10,000 TaskManagers need 20,000)
# How long a consumer remembers the message ids it handled (at least), and the clock skew
# between hosts that is tolerated: keep the hosts' clocks synchronised (NTP) well within it.
DEDUP_WINDOW_S = 2 * 3600
MAX_CLOCK_SKEW_S = 5 * 60
MAX_AGE_S = DEDUP_WINDOW_S - MAX_CLOCK_SKEW_S

# What a TaskManager may publish; each names itself where the body has a taskmanager_id.
TASKMANAGER_MESSAGES = (
    RegisterTaskManager,
    TaskManagerHeartbeat,
    UnregisterTaskManager,
    TaskStateChanged,
    TaskProgress,
    TaskWaiting,
    CheckpointAcknowledged,
    CheckpointDeclined,
    CommandRejected,
    RedisKeysClaimed,
)
# What only the TaskManager it names may send (the ResourceManager's sender check).
SELF_ONLY = (RegisterTaskManager, TaskManagerHeartbeat, UnregisterTaskManager)


class RefusedMessage(MessageError):
    """Raised by a handler for a message that authenticated but may not be obeyed (a report from
    a TaskManager that does not hold the execution): the transport dead-letters it with this
    reason at once instead of retrying it."""


class MissingKey(MessageError, ValueError):
    """This process holds no key to sign as a sender, or to check what it was sent."""


def taskmanager_sender(taskmanager_id: str) -> str:
    return TASKMANAGER_PREFIX + taskmanager_id


def taskmanager_of(sender: str | None) -> str | None:
    if sender and sender.startswith(TASKMANAGER_PREFIX):
        return sender[len(TASKMANAGER_PREFIX) :]
    return None


def staleness(env: Envelope, now: float | None = None) -> str | None:
    """Why this envelope is too old or too far in the future to be handled, or None."""
    now = time.time() if now is None else now
    age = now - env.sent_at
    sent = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(env.sent_at)) if abs(env.sent_at) < 1e11 else "?"
    if age > MAX_AGE_S:
        return (
            f"stale: this {env.body.type} from {env.sender!r} was sent at {sent}, {age / 60:.0f} min ago; "
            f"messages older than {MAX_AGE_S // 60} min are refused (past the {DEDUP_WINDOW_S // 3600} h "
            f"in which handled ids are remembered, a replayed copy would be handled again): a consumer "
            f"that was down that long, or a sender's clock more than {MAX_CLOCK_SKEW_S // 60} min behind"
        )
    if -age > MAX_CLOCK_SKEW_S:
        return (
            f"from the future: this {env.body.type} from {env.sender!r} was sent at {sent}, {-age:.0f} s "
            f"ahead of this receiver's clock; more than {MAX_CLOCK_SKEW_S} s of clock skew is refused "
            f"(synchronise the hosts' clocks)"
        )
    return None


def rule_violation(env: Envelope) -> str | None:
    """What is wrong with this (authenticated) sender sending this message, or None."""
    body, tm = env.body, taskmanager_of(env.sender)
    if tm is not None:
        if not isinstance(body, TASKMANAGER_MESSAGES):
            return f"a TaskManager ({env.sender}) may not send {body.type}: only the control plane does"
        named = getattr(body, "taskmanager_id", None)
        if named is not None and named != tm:
            return f"{body.type} names TaskManager {named!r} but was sent by TaskManager {tm!r}"
        if isinstance(body, RegisterTaskManager) and body.queue != streams.tm_queue(tm) and not body.simulated:
            # Its deploys would go to another TaskManager's queue, signed for this one. (A
            # benchmark's simulated TaskManagers share their process's queue; they run no-op tasks.)
            return (
                f"TaskManager {tm!r} registers with queue {body.queue!r}; its command queue is {streams.tm_queue(tm)!r}"
            )
        return None
    if isinstance(body, SELF_ONLY):
        return (
            f"{body.type} of TaskManager {body.taskmanager_id!r} must come from that TaskManager, not from "
            f"{env.sender!r}"
        )
    return None


class KeyedMac:
    """HMAC-SHA256 under one key, keyed once: each message copies the keyed state (the standard
    library's HMAC, whose copy carries both padded-key hash states) instead of keying afresh (a
    ResourceManager checks 10,000 heartbeats a second)."""

    __slots__ = ("_keyed",)

    def __init__(self, key: bytes):
        self._keyed = hmac.new(key, digestmod=hashlib.sha256)

    def hexdigest(self, payload: bytes) -> str:
        mac = self._keyed.copy()
        mac.update(payload)
        return mac.hexdigest()


def _same(expected: str, signature) -> bool:
    if isinstance(signature, bytes):
        try:
            signature = signature.decode("ascii")
        except UnicodeDecodeError:
            return False
    return isinstance(signature, str) and hmac.compare_digest(expected, signature)


def inbox_owner(stream: str) -> str | None:
    return stream[len(_INBOX_PREFIX) :] if stream.startswith(_INBOX_PREFIX) else None


def _unsigned(sender: str) -> str:
    return (
        f"unsigned message from {sender!r}: every message on the bus carries an HMAC of its sender's key "
        f"(a producer without the cluster's keys, or an old version)"
    )


class ClusterAuth:
    """The control plane's view: holds the cluster secret, derives every key (cached)."""

    def __init__(self, secret: bytes):
        self._secret = secret
        self._senders: dict[str, bytes] = {}
        self._commands: dict[str, bytes] = {}
        self._macs: dict[bytes, KeyedMac] = {}

    def _sign(self, key: bytes, payload: bytes) -> str:
        mac = self._macs.get(key)
        if mac is None:
            if len(self._macs) >= _CACHE_MAX:
                self._macs.clear()
            mac = self._macs[key] = KeyedMac(key)
        return mac.hexdigest(payload)

    def _matches(self, key: bytes, payload: bytes, signature) -> bool:
        return _same(self._sign(key, payload), signature)

    @classmethod
    def ephemeral(cls) -> "ClusterAuth":
        """A secret of its own: for a transport nobody gave keys (tests, one process talking to
        itself). Nothing signed with it passes anywhere else, so a service wired without its keys
        shows up as dead letters, never as an open door."""
        return cls(cluster_keys.parse_secret(cluster_keys.new_secret()))

    def sender_for(self, body, default: str) -> str:
        return default

    def sender_key(self, sender: str) -> bytes:
        key = self._senders.get(sender)
        if key is None:
            tm = taskmanager_of(sender)
            key = (
                cluster_keys.sender_key(self._secret, tm)
                if tm is not None
                else cluster_keys.service_key(self._secret, sender)
            )
            if len(self._senders) >= _CACHE_MAX:
                self._senders.clear()
            self._senders[sender] = key
        return key

    def command_key(self, taskmanager_id: str) -> bytes:
        key = self._commands.get(taskmanager_id)
        if key is None:
            key = cluster_keys.command_key(self._secret, taskmanager_id)
            if len(self._commands) >= _CACHE_MAX:
                self._commands.clear()
            self._commands[taskmanager_id] = key
        return key

    def sign(self, stream: str, sender: str, raw: bytes) -> str:
        tm = inbox_owner(stream)
        if tm is not None:
            return self._sign(self.command_key(tm), _INBOX_DOMAIN + raw)
        return self._sign(self.sender_key(sender), raw)

    def check(self, stream: str, env: Envelope, raw: bytes, signature) -> str | None:
        """Why this entry may not be handled (unsigned, forged, against the sender rules), or None."""
        if signature is None:
            return _unsigned(env.sender)
        tm = inbox_owner(stream)
        try:
            if tm is not None:
                ok = self._matches(self.command_key(tm), _INBOX_DOMAIN + raw, signature)
            else:
                ok = self._matches(self.sender_key(env.sender), raw, signature)
        except MissingKey as exc:
            return str(exc)
        if not ok:
            return (
                f"bad signature: this {env.body.type} claims sender {env.sender!r} but is not signed with "
                f"its key (forged, or signed under another cluster secret)"
            )
        return staleness(env) or rule_violation(env)

    def sign_command(self, taskmanager_id: str, payload: bytes) -> str:
        return self._sign(self.command_key(taskmanager_id), payload)

    def check_command(self, taskmanager_id: str, payload: bytes, signature) -> str | None:
        if signature is None:
            return "unsigned command: the JobManager signs every command for its TaskManager"
        try:
            key = self.command_key(taskmanager_id)
        except MissingKey as exc:
            return str(exc)
        if not self._matches(key, payload, signature):
            return (
                f"bad signature: the command is not signed with TaskManager {taskmanager_id!r}'s command key "
                f"(forged, meant for another TaskManager, or signed under another cluster secret)"
            )
        return None


@dataclass(frozen=True)
class TaskManagerKeys:
    sender: bytes
    command: bytes

    @classmethod
    def derive(cls, secret: bytes, taskmanager_id: str) -> "TaskManagerKeys":
        return cls(cluster_keys.sender_key(secret, taskmanager_id), cluster_keys.command_key(secret, taskmanager_id))


class TaskManagerAuth(ClusterAuth):
    """A TaskManager process's view: its own TaskManagers' keys and nothing else. With the
    secret at hand (one machine, or a process simulating thousands of TaskManagers) it derives
    them for the ids it serves, and only for those."""

    def __init__(self, taskmanager_ids, *, keys: dict[str, TaskManagerKeys] | None = None, secret: bytes | None = None):
        super().__init__(b"")
        self._ids = frozenset(taskmanager_ids)
        self._keys = dict(keys or {})
        self._derive_from = secret
        missing = [tm for tm in self._ids if tm not in self._keys]
        if missing and secret is None:
            raise MissingKey(
                f"no keys for TaskManager(s) {', '.join(sorted(missing)[:5])}: set taskmanager_key and "
                f"taskmanager_command_key (`headrace credentials taskmanager ID`)"
            )

    def _of(self, taskmanager_id: str | None) -> TaskManagerKeys:
        if taskmanager_id is None or taskmanager_id not in self._ids:
            raise MissingKey(f"this process holds no keys of TaskManager {taskmanager_id!r}")
        keys = self._keys.get(taskmanager_id)
        if keys is None:
            if self._derive_from is None:  # refused by __init__ already: every id without keys needs the secret
                raise MissingKey(f"no keys for TaskManager {taskmanager_id!r} and no cluster secret to derive them")
            keys = self._keys[taskmanager_id] = TaskManagerKeys.derive(self._derive_from, taskmanager_id)
        return keys

    def sender_for(self, body, default: str) -> str:
        # One process may speak for several TaskManagers (simulated ones): each report goes out
        # as the TaskManager it is about.
        tm = getattr(body, "taskmanager_id", None)
        return taskmanager_sender(tm) if tm is not None and tm in self._ids else default

    def sender_key(self, sender: str) -> bytes:
        return self._of(taskmanager_of(sender)).sender

    def command_key(self, taskmanager_id: str) -> bytes:
        return self._of(taskmanager_id).command

    def sign(self, stream: str, sender: str, raw: bytes) -> str:
        if inbox_owner(stream) is not None:
            raise MissingKey("a TaskManager does not write to inboxes")
        return self._sign(self.sender_key(sender), raw)

    def check(self, stream: str, env: Envelope, raw: bytes, signature) -> str | None:
        if inbox_owner(stream) not in self._ids:
            return f"a TaskManager checks only its own inbox, not {stream}"
        return super().check(stream, env, raw, signature)


@overload
def load_secret(settings, *, create: Literal[True]) -> bytes: ...
@overload
def load_secret(settings, *, create: bool) -> bytes | None: ...
def load_secret(settings, *, create: bool) -> bytes | None:
    """The cluster secret from settings.cluster_secret, else from $HEADRACE_HOME/secrets/
    cluster-secret (created there when `create`, for the control plane; a TaskManager only reads
    it, and gets None when it is absent or unreadable)."""
    if settings.cluster_secret:
        return cluster_keys.parse_secret(settings.cluster_secret, what="cluster_secret setting")
    directory = Path(settings.home) / SECRETS_DIR
    if create:
        return cluster_keys.load_or_create_secret(directory)
    try:
        text = (directory / cluster_keys.SECRET_FILE).read_text()
    except OSError:
        return None
    return cluster_keys.parse_secret(text, what=f"cluster secret in {directory}")


def control_plane_auth(settings) -> ClusterAuth:
    secret = load_secret(settings, create=True)
    if secret is None:  # create=True makes one where there is none
        raise MissingKey(f"no cluster secret in {Path(settings.home) / SECRETS_DIR}")
    return ClusterAuth(secret)


def taskmanager_auth(settings, taskmanager_ids) -> TaskManagerAuth:
    """Keys from taskmanager_key / taskmanager_command_key (one TaskManager per process), else
    derived from the cluster secret file when this process may read it; MissingKey otherwise."""
    ids = list(taskmanager_ids)
    if settings.taskmanager_key or settings.taskmanager_command_key:
        if not (settings.taskmanager_key and settings.taskmanager_command_key):
            raise MissingKey("set both taskmanager_key and taskmanager_command_key (or neither)")
        if len(ids) != 1:
            raise MissingKey("taskmanager_key serves one TaskManager; a simulating process needs the cluster secret")
        keys = TaskManagerKeys(
            _hex_key(settings.taskmanager_key, "taskmanager_key"),
            _hex_key(settings.taskmanager_command_key, "taskmanager_command_key"),
        )
        return TaskManagerAuth(ids, keys={ids[0]: keys})
    return TaskManagerAuth(ids, secret=load_secret(settings, create=False))


def _hex_key(text: str, what: str) -> bytes:
    try:
        key = bytes.fromhex(text.strip())
    except ValueError:
        raise MissingKey(f"{what} must be hexadecimal, as `headrace credentials taskmanager ID` prints it") from None
    if len(key) != 32:
        raise MissingKey(f"{what} must be 32 bytes (64 hex digits); it has {len(key)}")
    return key
