"""At start-up a TaskManager proves that the checkpoint directory is the one every other
TaskManager sees: it writes a probe file with a fresh random value there, announces that value in
Redis, and reads back the files of the other live TaskManagers. A directory that is local to each
host (a path that exists everywhere but is not shared) fails here, with a message saying which
TaskManager's file is missing, instead of at the first restore on another host."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from shared import streams
from shared.errors import TaskError

PROBE_DIR = ".headrace-probe"


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
        raise StorageNotShared(f"the checkpoint directory {directory} is not usable by TaskManager {taskmanager_id}: "
                               f"{exc}; it must be writable by every TaskManager and Spark worker") from None
    if back != nonce:
        raise StorageNotShared(f"the checkpoint directory {directory} did not return what TaskManager "
                               f"{taskmanager_id} wrote to {path}")
    return nonce


def check_shared(directory: Path, taskmanager_id: str, client) -> list[str]:
    """Write this TaskManager's probe, then read every other live TaskManager's; returns the ids
    checked. Raises StorageNotShared."""
    nonce = write_probe(directory, taskmanager_id)
    # Announced only after the file exists, so whoever reads the value finds the file.
    client.hset(streams.TM_STORAGE_PROBE_KEY, taskmanager_id, nonce)
    checked = []
    for raw_id, raw_value in client.hgetall(streams.TM_STORAGE_PROBE_KEY).items():
        other = raw_id.decode() if isinstance(raw_id, bytes) else str(raw_id)
        expected = raw_value.decode() if isinstance(raw_value, bytes) else str(raw_value)
        if other == taskmanager_id or not client.exists(streams.tm_endpoint_key(other)):
            continue  # only TaskManagers that run now: a stopped one's file may be long gone
        path = _probe_file(directory, other)
        try:
            seen = path.read_text()
        except FileNotFoundError:
            seen = None
        except OSError as exc:
            raise StorageNotShared(f"cannot read {path} in the checkpoint directory: {exc}") from None
        if seen != expected:
            what = "is missing here" if seen is None else "holds another value here"
            raise StorageNotShared(
                f"the checkpoint directory {directory} is not shared: TaskManager {other} wrote its probe to "
                f"{path}, which {what} (on TaskManager {taskmanager_id}). Every TaskManager and Spark worker "
                f"must see the same directory: mount one shared filesystem at that path on every host, or "
                f"set HEADRACE_CHECKPOINT_DIR to such a mount (docs/runbooks/shared-storage.md)")
        checked.append(other)
    return checked
