"""Which lineage owns a files sink's directory, kept where no pipeline can write it.

A files sink (runtime/connectors/files.py) once kept its owner and fence records in the
directory it writes, which every driver could write: a pipeline rewrote another job's
`owner.json` and `fence.json` and then deleted all of its files (issue 43). Now:

- The records live in a registry of the TaskManagers, `<checkpoints>/_sinks/<key>.json` (key: a
  hash of the directory's real path), root's (0644 in a 0711 directory: drivers read their fence,
  nobody else writes). The checkpoint directory is shared by every TaskManager, like the records.
- A task's driver asks its TaskManager for the directory before it writes (a `claim_directory`
  event; shared/task_protocol.py). The TaskManager decides with the lineage *it* knows of the task
  (tasks/storage.py: never the one a pipeline wrote into a snapshot), applies the ownership rules
  (runtime/connectors/ownership.py) and the fence, records the claim, and only then hands the
  directory and everything in it to the task's user. A directory the TaskManager gives is one the
  pipeline could write itself (it made it, as its own user, or a task of its lineage did, or an
  older Headrace's drivers did); anything else, and a directory another pipeline's user made and
  no record gives to the claimant, is refused.
- When the task ends, what its user owns there becomes root's again: no other pipeline, and no
  later holder of the same user, can change it; the lineage's next attempt claims it anew.

Batch writes claim too (kind "batch"): refused on a streaming lineage's directory (its default
mode, overwrite, would delete that lineage's files); otherwise any batch job may take a batch
output over, as before.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from services.taskmanager.runtime.connectors.ownership import SinkOwnedError, SinkOwner, check_claim, replaced_after
from shared import safe_fs
from shared.errors import TaskError
from shared.untrusted_code import UntrustedUser

log = logging.getLogger("headrace.taskmanager.sinks")

REGISTRY = "_sinks"
MAX_RECORD_BYTES = 1024 * 1024
LEGACY = "_headrace"  # where an older Headrace kept the records, in the directory itself


def record_key(path: str | os.PathLike) -> str:
    return hashlib.sha256(os.path.realpath(path).encode()).hexdigest()[:40]


def record_path(checkpoints: Path, path: str | os.PathLike) -> Path:
    """Where the registry keeps the records of the files sink directory `path`."""
    return checkpoints / REGISTRY / f"{record_key(path)}.json"


class ClaimRefused(TaskError, OSError):
    """A directory the TaskManager will not hand to the task; the message says why and what to do."""


@dataclass
class Claim:
    """A directory handed to a task, to take back when it ends."""

    path: Path
    kind: str


@dataclass
class SinkClaims:
    """The claims of one task (its user, its owner as the TaskManager knows it)."""

    checkpoints: Path
    owners: safe_fs.Ownership
    user: UntrustedUser
    claimed: list[Claim] = field(default_factory=list)

    @property
    def ids(self) -> tuple[int, int]:
        return (self.user.uid, self.user.gid) if self.user.isolated else (os.geteuid(), os.getegid())

    def claim(self, path: str, *, kind: str, attempt: int, restored_batch_id: int, owner: SinkOwner) -> str:
        """Hand the directory `path` to the task; returns its record's path. Raises SinkOwnedError,
        SinkFencedError or ClaimRefused."""
        if not os.path.isabs(path):
            raise ClaimRefused(f"{path} is not an absolute path: a files sink names its directory in full")
        real = os.path.realpath(path)
        with safe_fs.opened(self._registry()) as reg, _locked(reg, record_key(real)):
            record = self._read(reg, real)
            with safe_fs.opened(_walk_to_parent(real)) as parent:
                name = os.path.basename(real)
                target = self._open_target(parent, name, real, kind)
                with safe_fs.opened(target if target is not None else os.dup(parent)):
                    if record is None and target is not None:
                        record = _legacy_record(target)
                    record = self._decide(real, kind, attempt, restored_batch_id, owner, record, target)
                    if target is not None:
                        uid, gid = self.ids
                        safe_fs.chown_tree(
                            target, uid, gid, only=lambda u: u == 0 or self.owners.driver_uid(u), adopt=True
                        )
            safe_fs.write_file(reg, f"{record_key(real)}.json", json.dumps(record, sort_keys=True).encode(), mode=0o644)
        self.claimed.append(Claim(Path(real), kind))
        log.info(
            "%s directory %s handed to job %s (lineage %s, attempt %d)",
            kind,
            real,
            owner.job_id,
            owner.lineage,
            attempt,
        )
        return str(record_path(self.checkpoints, real))

    def _registry(self) -> int:
        with safe_fs.opened(safe_fs.open_trusted(self.checkpoints)) as ck:
            return safe_fs.ensure_dirs(ck, REGISTRY, self.owners, where=str(self.checkpoints))

    def _read(self, reg: int, real: str) -> dict | None:
        try:
            data, _ = safe_fs.read_file(reg, f"{record_key(real)}.json", max_bytes=MAX_RECORD_BYTES)
        except FileNotFoundError:
            return None
        rec = json.loads(data)
        return rec if isinstance(rec, dict) else None

    def _open_target(self, parent: int, name: str, real: str, kind: str) -> int | None:
        """The directory, by fd, if it is there; None for a batch output not written yet. A
        streaming sink makes its directory itself (as its user) before it claims it."""
        try:
            fd = safe_fs.open_dir_at(parent, name)
        except FileNotFoundError:
            if kind == "batch":
                return None
            raise ClaimRefused(f"{real} does not exist: the sink makes it before it claims it") from None
        return fd

    def _decide(
        self,
        real: str,
        kind: str,
        attempt: int,
        restored: int,
        owner: SinkOwner,
        record: dict | None,
        target: int | None,
    ) -> dict:
        """The record after this claim, or the refusal (ownership.py's rules, then the fence)."""
        from services.taskmanager.runtime.connectors.sinks import SinkFencedError

        release = (
            f"cancel the owner's job, then delete the directory (`rm -rf {real}`; this deletes its output) "
            f"or move it away"
        )
        current = SinkOwner.from_record(record["owner"]) if record and record.get("owner") else None
        replaced = list((record or {}).get("owner", {}).get("replaced", [])) if record else []
        if kind == "batch":
            if current is not None:
                raise SinkOwnedError("directory", real, current.lineage, current.job_id, "a batch write", release)
            if target is not None:
                self._check_made_by_pipelines(target, real, record)
            return {"path": real, "kind": "batch"}
        if target is not None and current is None:
            self._check_made_by_pipelines(target, real, record)
        has_commits = target is not None and _has_commits(target)
        check_claim(
            "directory",
            real,
            owner,
            current,
            restored_batch_id=restored,
            has_commits=has_commits,
            release=release,
            replaced=replaced,
        )
        fence = (record or {}).get("fence") or {}
        if int(fence.get("attempt", -1)) > attempt:
            raise SinkFencedError(f"files:{real}", attempt, fence["attempt"])
        return {
            "path": real,
            "kind": "streaming",
            "owner": owner.record() | {"replaced": replaced_after(owner, current, replaced)},
            "fence": {"attempt": attempt, "restored_batch_id": restored},
        }

    def _check_made_by_pipelines(self, fd: int, real: str, record: dict | None) -> None:
        """A directory without an owner is handed over only if this task's user made it (or an
        older Headrace's drivers did, or a batch record says it is a batch output): never one of
        root's or the operator's, never one another running pipeline made."""
        st = os.fstat(fd)
        uid, _ = self.ids
        if st.st_uid == uid or (record is not None and record.get("kind") == "batch" and st.st_uid == 0):
            return
        if self.owners.driver_uid(st.st_uid) and not _in_pool_use(st.st_uid, self.user):
            return  # made by a driver that no longer runs (an older Headrace's, or a killed one's)
        raise ClaimRefused(
            f"{real} belongs to uid {st.st_uid} (mode {stat.filemode(st.st_mode)}) and no files sink owns it: a "
            f"files sink writes only a directory its pipeline makes (give the drivers' group the parent "
            f"directory, e.g. `chgrp headrace-driver {os.path.dirname(real)} && chmod 1770 "
            f"{os.path.dirname(real)}`), or one its lineage wrote before"
        )

    def release(self) -> None:
        """The task ended and its processes are gone: what its user owns of its claims is root's."""
        uid, _ = self.ids
        if uid == os.geteuid():
            self.claimed.clear()
            return
        for c in self.claimed:
            try:
                with (
                    safe_fs.opened(_walk_to_parent(str(c.path))) as parent,
                    safe_fs.opened(safe_fs.open_dir_at(parent, c.path.name)) as fd,
                ):
                    safe_fs.chown_tree(fd, os.geteuid(), os.getegid(), only=lambda u: u == uid)
            except FileNotFoundError:
                continue
            except OSError as exc:
                log.warning("could not take back the files sink directory %s: %s", c.path, exc)
        self.claimed.clear()


class _locked:
    """An exclusive flock on the registry's lock file of one directory (every TaskManager's)."""

    def __init__(self, reg: int, key: str):
        self.reg, self.key, self.fd = reg, key, -1

    def __enter__(self) -> None:
        self.fd = os.open(
            f"{self.key}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=self.reg
        )
        try:
            safe_fs.lock_exclusive(self.fd, f"the files sink claims' record {self.key}")
        except BaseException:
            os.close(self.fd)
            raise

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)


def _walk_to_parent(real: str) -> int:
    """The parent of `real` (a resolved path), reached from / without following any link: one
    appearing meanwhile is refused."""
    fd = os.open("/", safe_fs.DIR_FLAGS)
    try:
        for part in Path(real).parent.parts[1:]:
            nxt = safe_fs.open_dir_at(fd, part)
            os.close(fd)
            fd = nxt
        return fd
    except BaseException:
        os.close(fd)
        raise


def _legacy_record(fd: int) -> dict | None:
    """The records an older Headrace kept in the directory itself (adopted once)."""
    try:
        with safe_fs.opened(safe_fs.open_dir_at(fd, LEGACY)) as meta:
            owner = json.loads(safe_fs.read_file(meta, "owner.json", max_bytes=MAX_RECORD_BYTES)[0])
            try:
                fence = json.loads(safe_fs.read_file(meta, "fence.json", max_bytes=MAX_RECORD_BYTES)[0])
            except FileNotFoundError:
                fence = {}
    except (FileNotFoundError, ValueError, safe_fs.UnsafePath):
        return None
    if not isinstance(owner, dict) or not owner.get("lineage"):
        return None
    return {"owner": owner, "fence": fence if isinstance(fence, dict) else {}}


def _has_commits(fd: int) -> bool:
    try:
        with (
            safe_fs.opened(safe_fs.open_dir_at(fd, LEGACY)) as meta,
            safe_fs.opened(safe_fs.open_dir_at(meta, "commits")) as commits,
        ):
            return any(n.endswith(".json") and not n.startswith(".") for n in os.listdir(commits))
    except (FileNotFoundError, safe_fs.UnsafePath):
        return False


def _in_pool_use(uid: int, me: UntrustedUser) -> bool:
    """Whether a process runs as `uid` now (another running pipeline's user)."""
    from shared.sandbox_users import processes_of

    return uid != me.uid and bool(processes_of(uid))
