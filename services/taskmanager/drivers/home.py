"""A driver's user and directories, as the TaskManager (root) makes them and takes them back.

    <taskmanager>/drivers/<driver id>/            root's, group the driver's own (0750): it may
                                                  look in, never write
        work/                                     the driver's user's (0700): its HOME, TMPDIR,
                                                  working directory and --workdir
        artifact/<name>                           root's (0750 / 0640): the pipeline it runs
        .task-waiting                             made by root: a task waits (task_protocol.py)

Besides these, a task may be handed its lineage's pipelines database directory
(tasks/pipeline_database.py) and taken it back here when its driver is gone.

Whatever the TaskManager writes for a driver goes where the driver cannot write, so no name there
can be a link a pipeline planted (issue 43: an artifact copied as root through a symbolic link
in a driver's own directory). The driver's user is its own for as long as it lives
(shared/sandbox_users.py): given when it starts, scrubbed and given back when it has exited, after
its task's snapshots were taken back (tasks/storage.py).
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
from pathlib import Path
from typing import Any, Callable

from services.taskmanager.tasks.pipeline_database import LineageDatabase
from services.taskmanager.tasks.sink_claims import SinkClaims
from services.taskmanager.tasks.storage import StorageRoots, TaskStorage
from shared import safe_fs
from shared import task_protocol as tp
from shared.lineage import lineage_of
from shared.sandbox_users import Lease
from shared.untrusted_code import UntrustedUser

log = logging.getLogger("headrace.taskmanager.driver_home")

WORK = "work"
ARTIFACT = "artifact"


class DriverHome:
    """The directories of the driver `id` under `drivers`, for `user` (held through `lease`)."""

    def __init__(self, drivers: Path, driver_id: str, user: UntrustedUser, lease: Lease | None = None):
        self.dir = drivers / driver_id
        self.workdir = self.dir / WORK
        self.user, self.lease = user, lease
        self.storage: TaskStorage | None = None
        self.claims: SinkClaims | None = None  # the files sink directories its task was handed
        self.database: LineageDatabase | None = None  # its task's lineage's pipelines database

    @property
    def ids(self) -> tuple[int, int]:
        return (self.user.uid, self.user.gid) if self.user.isolated else (os.geteuid(), os.getegid())

    def make(self) -> None:
        """Create the driver's directory and its work directory (neither there before)."""
        self.dir.parent.mkdir(parents=True, exist_ok=True)
        uid, gid = self.ids
        with safe_fs.opened(safe_fs.open_trusted(self.dir.parent)) as drivers:
            with safe_fs.opened(
                safe_fs.make_dir(drivers, self.dir.name, mode=0o750, uid=os.geteuid(), gid=gid)
            ) as home:
                os.close(safe_fs.make_dir(home, WORK, mode=0o700, uid=uid, gid=gid))

    def waiting_marker(self) -> Path:
        return self.dir / tp.TASK_WAITING_MARKER

    def mark_waiting(self) -> None:
        """Tell the driver a task waits for it: a file in its directory, made by root."""
        with safe_fs.opened(safe_fs.open_trusted(self.dir)) as home:
            os.close(
                os.open(
                    tp.TASK_WAITING_MARKER, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=home
                )
            )

    def place_artifact(self, source: Path) -> Path:
        """A copy of the pipeline `source` the driver may read and not change."""
        _, gid = self.ids
        with safe_fs.opened(safe_fs.open_trusted(self.dir)) as home:
            with safe_fs.opened(
                safe_fs.make_dir(home, ARTIFACT, mode=0o750, uid=os.geteuid(), gid=gid, exist_ok=True)
            ) as art:
                safe_fs.remove(art, source.name)
                safe_fs.copy_file(source, art, source.name, mode=0o640, uid=os.geteuid(), gid=gid)
        return self.dir / ARTIFACT / source.name

    def grant_storage(self, roots: StorageRoots, spec: tp.TaskSpec) -> dict:
        """The task's attempt directory (and restore view); the spec's changed fields. Without
        storage roots (a sandbox made without settings) only the directory is made."""
        if not roots.roots:
            Path(spec.checkpoint_dir).mkdir(parents=True, exist_ok=True)
            return {}
        self.storage = TaskStorage(roots, self.user)
        self.claims = SinkClaims(roots.roots[0], roots.owners, self.user)  # the checkpoint directory
        return self.storage.prepare(spec)

    def grant_database(self, directory: Path, owners: safe_fs.Ownership, spec: tp.TaskSpec) -> str:
        """The URL of the task's lineage's own pipelines database, its directory made for the
        task's user (after grant_storage: the lineage the TaskManager trusts)."""
        lineage = self.storage.lineage["id"] if self.storage is not None else lineage_of(spec, None)["id"]
        self.database = LineageDatabase(directory, owners, self.user)
        return self.database.grant(lineage)

    def answer_claim(self, event: tp.ClaimDirectory) -> tp.Granted:
        """The answer to a files sink's claim of its directory (tasks/sink_claims.py), refusals included."""
        from services.taskmanager.runtime.connectors.ownership import SinkOwnedError, SinkOwner
        from services.taskmanager.runtime.connectors.sinks import SinkFencedError

        storage, claims = self.storage, self.claims
        try:
            if storage is None or claims is None or storage.spec is None:
                raise OSError("this driver has no task with a checkpoint directory to keep the sink's records in")
            lineage = storage.lineage
            owner = SinkOwner(lineage=lineage["id"], job_id=storage.spec.job_id, generation=lineage["generation"])
            # The fence is the TaskManager's too: the JobManager's token, not what the driver says.
            attempt = int(lineage.get("fence") or event.attempt) if event.kind == "streaming" else 0
            record = claims.claim(
                event.path, kind=event.kind, attempt=attempt, restored_batch_id=event.restored_batch_id, owner=owner
            )
            return tp.Granted(request_id=event.request_id, path=record)
        except SinkOwnedError as exc:
            return tp.Granted(
                request_id=event.request_id, error_name="SinkOwnedError", error=str(exc), error_args=exc.__reduce__()[1]
            )
        except SinkFencedError as exc:
            return tp.Granted(
                request_id=event.request_id,
                error_name="SinkFencedError",
                error=str(exc),
                error_args=(exc.sink, exc.attempt, exc.newer),
            )
        except Exception as exc:  # noqa: BLE001 - every refusal reaches the sink, which fails the task with it
            log.warning("claim of %s refused: %s", event.path, exc)
            return tp.Granted(request_id=event.request_id, error_name=type(exc).__name__, error=str(exc))

    def answer_view(self, event: tp.ViewSnapshot) -> tp.Granted:
        """A view of a snapshot of the task's lineage (tasks/storage.py), or the refusal."""
        try:
            if self.storage is None:
                raise OSError("this driver has no task whose lineage a snapshot could be of")
            return tp.Granted(request_id=event.request_id, path=self.storage.request_view(event.path))
        except Exception as exc:  # noqa: BLE001 - the refusal reaches the driver, which goes on without it
            log.warning("view of %s refused: %s", event.path, exc)
            return tp.Granted(request_id=event.request_id, error_name=type(exc).__name__, error=str(exc))

    def checked(self, event, send: Callable[[Any], bool]):
        """What an event of the driver means once the TaskManager checked it (None: not the
        JobManager's): a claim answered here, a snapshot sealed before it is reported
        (tasks/storage.py) or declined if that fails, a failure's paths the snapshot's, not its
        view's."""
        if isinstance(event, tp.ClaimDirectory):
            # Answered beside the events: a claim walks the sink's directory, a view the snapshot.
            threading.Thread(target=lambda: send(self.answer_claim(event)), name="claim", daemon=True).start()
            return None
        if isinstance(event, tp.ViewSnapshot):
            threading.Thread(target=lambda: send(self.answer_view(event)), name="view", daemon=True).start()
            return None
        storage = self.storage
        if storage is None:
            return event
        if isinstance(event, tp.SnapshotTaken):
            try:
                storage.seal(event)
            except (OSError, ValueError) as exc:
                log.warning("snapshot %s not sealed: %s", event.path, exc)
                return tp.SnapshotDeclined(
                    checkpoint_id=event.checkpoint_id, reason=f"the TaskManager could not seal the snapshot: {exc}"
                )
        elif isinstance(event, tp.Failed):
            return event.model_copy(update={"traceback": storage.original(event.traceback)})
        return event

    def remove(self) -> None:
        """After the driver exited and its processes are gone: its snapshots taken back, its
        directories removed, its user scrubbed and given back."""
        if self.storage is not None:
            self.storage.release()
        if self.claims is not None:
            self.claims.release()
        if self.database is not None:
            self.database.release()
        shutil.rmtree(self.dir, ignore_errors=True)
        if self.lease is not None:
            self.lease.release()
            self.lease = None
