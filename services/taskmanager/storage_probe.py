"""At start-up a TaskManager proves that the checkpoint directory is the one every other
TaskManager sees: it writes a probe file with a fresh random value there, announces that value in
Redis, and reads back the files of the other live TaskManagers. A directory that is local to each
host (a path that exists everywhere but is not shared) fails here, with a message saying which
TaskManager's file is missing, instead of at the first restore on another host.

Each value is kept under its TaskManager's own prefix (streams.tm_storage_probe_key), which only
that TaskManager's Redis user may write: no TaskManager can plant a value in another's name. One
can still misstate its own value: its file here with another value than it announces still shows
the directory is shared (a host-local directory holds no file of another host's TaskManager), so
the newcomer starts and warns naming it; a Redis credential cannot remove the file. A newcomer
that sees the files of some TaskManagers and not of others starts too, and warns naming the
others (theirs is the odd directory); it refuses to start only when every file it looked for is
missing. The live TaskManagers are
found by their endpoint keys (a SCAN, once per start, bounded by FIND_TIMEOUT_S)."""

from __future__ import annotations

import logging
import os
import secrets
import time
from pathlib import Path

from shared import streams
from shared.errors import TaskError
from shared.ids import TASKMANAGER_ID

PROBE_DIR = ".headrace-probe"
FIND_TIMEOUT_S = 10.0
log = logging.getLogger("headrace.taskmanager")


class StorageNotShared(TaskError, RuntimeError):
    """The checkpoint directory is not usable, or not the same one the other TaskManagers use."""


def _probe_file(directory: Path, taskmanager_id: str) -> Path:
    return directory / PROBE_DIR / taskmanager_id


def write_probe(directory: Path, taskmanager_id: str) -> str:
    nonce = secrets.token_hex(16)
    path = _probe_file(directory, taskmanager_id)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{nonce[:8]}")
        tmp.write_text(nonce)
        os.replace(tmp, path)
        back = path.read_text()
    except OSError as exc:
        raise StorageNotShared(
            f"the checkpoint directory {directory} is not usable by TaskManager {taskmanager_id}: "
            f"{exc}; it must be writable by every TaskManager and Spark worker"
        ) from None
    if back != nonce:
        raise StorageNotShared(
            f"the checkpoint directory {directory} did not return what TaskManager {taskmanager_id} wrote to {path}"
        )
    return nonce


def check_shared(directory: Path, taskmanager_id: str, client) -> list[str]:
    """Write this TaskManager's probe, then read every other live TaskManager's; returns the ids
    whose files it sees. Raises StorageNotShared when it sees none of those it checked."""
    nonce = write_probe(directory, taskmanager_id)
    # Announced only after the file exists, so whoever reads the value finds the file.
    client.set(streams.tm_storage_probe_key(taskmanager_id), nonce)
    checked: list[str] = []
    unseen: list[tuple[str, str]] = []  # (TaskManager, why)
    misstated: list[tuple[str, str]] = []
    for other in running_taskmanagers(client):
        if other == taskmanager_id:
            continue
        raw_value = client.get(streams.tm_storage_probe_key(other))
        if raw_value is None:
            continue  # it has not probed yet (or runs a version without probes)
        expected = raw_value.decode() if isinstance(raw_value, bytes) else str(raw_value)
        path = _probe_file(directory, other)
        try:
            seen = path.read_text()
        except FileNotFoundError:
            seen = None
        except OSError as exc:
            raise StorageNotShared(f"cannot read {path} in the checkpoint directory: {exc}") from None
        if seen is None:
            unseen.append((other, f"TaskManager {other} wrote its probe to {path}, which is missing here"))
        elif seen != expected:
            misstated.append(
                (other, f"TaskManager {other}'s probe file {path} is here but holds another value than it announces")
            )
        else:
            checked.append(other)
    for other, why in misstated:
        log.warning(
            "the checkpoint directory %s holds TaskManager %s's probe file, so it is shared with it, but: "
            "%s (its Redis credential may be in other hands; see docs/runbooks/shared-storage.md)",
            directory,
            other,
            why,
        )
    if unseen and not checked and not misstated:
        raise StorageNotShared(
            f"the checkpoint directory {directory} is not shared: {unseen[0][1]} (on TaskManager {taskmanager_id}). "
            f"Every TaskManager and Spark worker must see the same directory: mount one shared filesystem at "
            f"that path on every host, or set HEADRACE_CHECKPOINT_DIR to such a mount "
            f"(docs/runbooks/shared-storage.md)"
        )
    for other, why in unseen:
        log.warning(
            "the checkpoint directory %s is shared with %s but not with TaskManager %s: %s; that "
            "TaskManager's directory is another one, or it misstates its probe (see "
            "docs/runbooks/shared-storage.md)",
            directory,
            ", ".join(checked),
            other,
            why,
        )
    return checked


def running_taskmanagers(client) -> list[str]:
    """The ids of the TaskManagers that announce an endpoint now (its key expires with their
    heartbeats): a stopped one's file may be long gone. At most FIND_TIMEOUT_S of SCAN; those
    found by then are checked."""
    pattern = streams.tm_endpoint_key("*")
    prefix, suffix = pattern.split("*", 1)
    deadline = time.monotonic() + FIND_TIMEOUT_S
    found = []
    for raw in client.scan_iter(match=pattern, count=1000):
        name = raw.decode() if isinstance(raw, bytes) else str(raw)
        tm = name[len(prefix) : len(name) - len(suffix)]
        # Only a TaskManager's own endpoint key: an id has no ':', so a key some TaskManager made
        # deeper under its own prefix (hr:tm:<id>:x:endpoint) names no TaskManager.
        if TASKMANAGER_ID.fullmatch(tm):
            found.append(tm)
        if time.monotonic() > deadline:
            log.warning(
                "finding the running TaskManagers took over %.0f s (a large keyspace); checking the %d found so far",
                FIND_TIMEOUT_S,
                len(found),
            )
            break
    return sorted(set(found))
