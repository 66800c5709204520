"""What a task is given of the storage roots, and taken back from it.

The TaskManager runs as root and its drivers as users of their own (drivers/user.py), and it works
in the same directories they write: the job's checkpoint directory, the snapshot targets. So it
never opens a path there by name (shared/safe_fs.py): every storage root and every directory
between a root and what a task writes stays root's, created and checked one component at a time
through directory descriptors, and a task is handed exactly the directories made for it:

- its attempt directory `<checkpoints>/<job>/<vertex>/live/<execution>` (spec.checkpoint_dir), made
  anew for its user (0700); the directories above it are root's (0711) and a previous attempt's
  directory left there (its TaskManager was killed) is taken back;
- each snapshot target (a checkpoint `<checkpoints>/<job>/chk-<n>`, a savepoint
  `<target>/savepoint-<job>-<hex>`): the directory itself, made by root for the task's user, which
  writes the snapshot into it (shared/checkpoint_storage); never its parent, never a storage root.

A snapshot the driver reports taken is sealed before the JobManager hears of it (`seal`): its
directory becomes root's and closed (0700), its files readable, and its `_metadata` is rewritten
by root with what the TaskManager knows of the task (job, attempt, pipeline, lineage), so that what
a restore trusts is never what a pipeline wrote. When the task ends (`release`), everything its
user still owns of its snapshots becomes root's: a later holder of the same user reaches none of it.

A task that restores reads its snapshot through a view (`<attempt>/.restore-<hex>`): root's
directories and hard links to the snapshot's files, which the task may read and not change, and a
`_metadata` with the lineage the TaskManager trusts. The lineage a snapshot names counts only if
its `_metadata` was sealed (root's) or predates per-task users; one a pipeline could still have
written starts a lineage of its own (shared/lineage.py).
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path, PurePath

from shared import safe_fs
from shared import task_protocol as tp
from shared.checkpoint_storage import METADATA_FILE
from shared.errors import TaskError
from shared.lineage import lineage_of
from shared.untrusted_code import UntrustedUser

log = logging.getLogger("headrace.taskmanager.storage")

MAX_METADATA_BYTES = 16 * 1024**2
VIEW_PREFIX = ".restore-"


class StorageRefused(TaskError, OSError):
    """A path the TaskManager will not hand to a task; the message says why."""


@dataclass(frozen=True)
class StorageRoots:
    """The allowed storage roots (shared/storage_roots.py), as configured and as resolved."""

    roots: tuple[Path, ...]
    owners: safe_fs.Ownership = field(default_factory=safe_fs.Ownership)

    def locate(self, path: Path) -> tuple[Path, PurePath]:
        """(root, the path relative to it) of the innermost root `path` lies lexically under."""
        path = Path(os.path.normpath(path))
        found = []
        for root in self.roots:
            for form in {root, Path(os.path.realpath(root))}:
                if path == form or form in path.parents:
                    found.append((form, path.relative_to(form)))
        if not found:
            raise StorageRefused(
                f"{path} is not under a storage root ({', '.join(map(str, self.roots))}) as "
                f"written: give the path below the root itself, not through a link to it"
            )
        return max(found, key=lambda f: len(f[0].parts))

    def open_parent(self, path: Path, *, create: bool = True) -> tuple[int, str]:
        """The fd of `path`'s parent (root's, every component checked; created unless not
        `create`) and its name."""
        root, rel = self.locate(path)
        if not rel.parts:
            raise StorageRefused(f"{path} is a storage root itself: a task is never handed one")
        if create:
            root.mkdir(parents=True, exist_ok=True)  # the operator's path, as configured
        with safe_fs.opened(safe_fs.open_trusted(root)) as root_fd:
            return safe_fs.ensure_dirs(root_fd, rel.parent, self.owners, where=str(root), create=create), rel.name


class TaskStorage:
    """The storage grants of one task, run by `user`."""

    def __init__(self, roots: StorageRoots, user: UntrustedUser):
        self.roots, self.user = roots, user
        self.lineage: dict = {}
        self.spec: tp.TaskSpec | None = None
        self.targets: list[Path] = []  # snapshot directories made for the task
        self.view_of: dict[str, str] = {}  # view name -> the snapshot it shows
        self.view_trusted: dict[str, bool] = {}  # view name -> whether its lineage was root's word

    @property
    def owner(self) -> tuple[int, int]:
        return (self.user.uid, self.user.gid) if self.user.isolated else (os.geteuid(), os.getegid())

    def prepare(self, spec: tp.TaskSpec) -> dict:
        """Make the attempt directory (and the restore view in it); the spec's changed fields."""
        self.spec = spec
        attempt = Path(spec.checkpoint_dir)
        parent_fd, name = self.roots.open_parent(attempt)
        update: dict = {}
        with safe_fs.opened(parent_fd):
            self._take_back_siblings(parent_fd, name)
            safe_fs.remove(parent_fd, name)  # a redelivered deploy's, from before
            with safe_fs.opened(
                safe_fs.make_dir(parent_fd, name, mode=0o700, uid=os.geteuid(), gid=os.getegid())
            ) as fd:
                meta = None
                if spec.restore_from:
                    try:
                        view, meta = self._view(fd, Path(spec.restore_from))
                        update["restore_from"] = str(attempt / view)
                    except (OSError, ValueError) as exc:
                        # Left to the driver, whose restore fails with SnapshotRestoreError: the
                        # JobManager's cue to fall back to an older snapshot.
                        log.warning(
                            "task %s: no view of its snapshot %s (%s)", spec.execution_id, spec.restore_from, exc
                        )
                self.lineage = lineage_of(spec, meta)  # the driver's own rule, on what root trusts
                uid, gid = self.owner
                os.fchown(fd, uid, gid)  # last: from here on the task may write in it
        return update

    def _take_back_siblings(self, parent_fd: int, keep: str) -> None:
        """Attempt directories a killed TaskManager left with their users: root's again."""
        for entry in os.listdir(parent_fd):
            if entry == keep:
                continue
            try:
                st = os.lstat(entry, dir_fd=parent_fd)
                if self.roots.owners.driver_uid(st.st_uid):
                    with safe_fs.opened(safe_fs.open_dir_at(parent_fd, entry)) as fd:
                        safe_fs.chown_tree(fd, os.geteuid(), os.getegid(), only=self.roots.owners.driver_uid)
                        os.fchmod(fd, 0o700)
            except (OSError, ValueError) as exc:
                log.warning("could not take back %s: %s", entry, exc)

    def _view(self, into_fd: int, snapshot: Path) -> tuple[str, dict]:
        """A view of `snapshot` made in the directory `into_fd`: its name and the metadata it shows."""
        parent_fd, name = self.roots.open_parent(snapshot, create=False)
        with safe_fs.opened(parent_fd), safe_fs.opened(safe_fs.open_dir_at(parent_fd, name)) as src:
            data, st = safe_fs.read_file(src, METADATA_FILE, max_bytes=MAX_METADATA_BYTES)
            meta = json.loads(data)
            if not isinstance(meta, dict):
                raise StorageRefused(f"{snapshot}/{METADATA_FILE} is not a snapshot's metadata")
            trusted = not self.roots.owners.driver_uid(st.st_uid)
            if not trusted and self.spec is not None:
                # Written by a pipeline and never sealed: its lineage is not believed.
                log.warning(
                    "the snapshot %s was not sealed by a TaskManager: job %s starts a lineage of its own",
                    snapshot,
                    self.spec.job_id,
                )
                meta["lineage"] = {"id": self.spec.job_id, "generation": -1}
            view = f"{VIEW_PREFIX}{os.urandom(6).hex()}"
            with safe_fs.opened(
                safe_fs.make_dir(into_fd, view, mode=0o755, uid=os.geteuid(), gid=os.getegid())
            ) as view_fd:
                safe_fs.link_tree(src, view_fd)
                safe_fs.write_file(view_fd, METADATA_FILE, json.dumps(meta).encode(), mode=0o644)
        self.view_of[view] = str(snapshot)
        self.view_trusted[view] = trusted
        return view, meta

    def request_view(self, snapshot: str) -> str:
        """A view, in the attempt directory, of another snapshot of the task's own lineage (its
        job's, or one whose sealed metadata names the lineage); StorageRefused for any other."""
        if self.spec is None:
            raise StorageRefused("no task")
        path = Path(os.path.normpath(snapshot))
        job_dir = Path(self.spec.checkpoint_dir).parents[2]  # <checkpoints>/<job>
        attempt = Path(self.spec.checkpoint_dir)
        parent_fd, name = self.roots.open_parent(attempt, create=False)
        with safe_fs.opened(parent_fd), safe_fs.opened(safe_fs.open_dir_at(parent_fd, name)) as fd:
            view, meta = self._view(fd, path)
            named = (meta.get("lineage") or {}).get("id")
            ours = job_dir in path.parents or (self.view_trusted.get(view, False) and named == self.lineage.get("id"))
            if not ours:
                safe_fs.remove(fd, view)
                self.view_of.pop(view, None)
                raise StorageRefused(f"{snapshot} is not a snapshot of this task's lineage {self.lineage.get('id')}")
        return str(attempt / view)

    def snapshot_target(self, target: Path) -> None:
        """Make the directory a snapshot is written into, for the task's user."""
        parent_fd, name = self.roots.open_parent(target)
        with safe_fs.opened(parent_fd):
            uid, gid = self.owner
            os.close(safe_fs.make_dir(parent_fd, name, mode=0o700, uid=uid, gid=gid))
        self.targets.append(Path(os.path.normpath(target)))

    def seal(self, event: tp.SnapshotTaken) -> None:
        """The snapshot `event` reports, made root's before anyone is told of it (module docstring);
        raises StorageRefused for a path that is not a target made for this task."""
        path = Path(os.path.normpath(event.path))
        if path not in self.targets or self.spec is None:
            raise StorageRefused(f"the driver reported a snapshot at {event.path}, which is not a target it was given")
        parent_fd, name = self.roots.open_parent(path, create=False)
        with safe_fs.opened(parent_fd), safe_fs.opened(safe_fs.open_dir_at(parent_fd, name)) as fd:
            os.fchown(fd, os.geteuid(), os.getegid())
            os.fchmod(fd, 0o700)
            data, _ = safe_fs.read_file(fd, METADATA_FILE, max_bytes=MAX_METADATA_BYTES)
            meta = json.loads(data)
            if not isinstance(meta, dict):
                raise StorageRefused(f"{path}/{METADATA_FILE} is not a snapshot's metadata")
            ours = tp.snapshot_metadata(
                self.spec, kind=str(meta.get("kind", "checkpoint")), checkpoint_id=event.checkpoint_id
            )
            plan = (meta.get("pipeline") or {}).get("plan") if isinstance(meta.get("pipeline"), dict) else None
            meta.update(ours)
            meta["pipeline"]["plan"] = plan
            meta["lineage"] = {
                "id": self.lineage.get("id", self.spec.job_id),
                "generation": self.lineage.get("generation", 0),
            }
            safe_fs.write_file(fd, METADATA_FILE, json.dumps(meta, indent=2, sort_keys=True).encode(), mode=0o644)
            safe_fs.add_read(fd)

    def original(self, text: str) -> str:
        """`text` with every view's path replaced by the snapshot it shows (for failure causes)."""
        if self.spec is None:
            return text
        for view, snapshot in self.view_of.items():
            text = text.replace(str(Path(self.spec.checkpoint_dir) / view), snapshot)
        return text

    def release(self) -> None:
        """The task ended and its processes are gone: what its user owns of its snapshots is root's."""
        for target in self.targets:
            try:
                parent_fd, name = self.roots.open_parent(target, create=False)
                with safe_fs.opened(parent_fd), safe_fs.opened(safe_fs.open_dir_at(parent_fd, name)) as fd:
                    safe_fs.chown_tree(fd, os.geteuid(), os.getegid(), only=self.roots.owners.driver_uid)
                    os.fchmod(fd, 0o700)
            except FileNotFoundError:
                continue  # discarded meanwhile (a declined or aborted snapshot)
            except OSError as exc:
                log.warning("could not take back the snapshot directory %s: %s", target, exc)
        self.targets.clear()
