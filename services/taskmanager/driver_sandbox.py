"""What confines a TaskManager's Spark drivers: the OS user they run as (driver_user.py), their
cgroups (task_processes.py), the memory limit of their tasks (memory_limit.py), their log's cap
(rotating_log.py), and what a task is handed (`task_spec`, `prepare_target`).

A task's spec reaches its driver without the control catalog's URL (`catalog_url` is the
pipeline's own database, `pipeline_catalog_url`, or nothing) and with a copy of its artifact in the
driver's own work directory, so the driver never needs to read the artifact directory.

At start (`secure_home`) the TaskManager closes its home to others (the catalog, the run
directories with their config files, the secrets and Redis credentials, the artifacts): only
traversal (o+x) stays where a driver must pass, to its work, checkpoint and savepoint directories;
the lake directory (`lake_dir`, the pipelines' Delta tables) is created and handed to the drivers' user.
"""

from __future__ import annotations

import logging
import shutil
import stat
from dataclasses import dataclass, field
from pathlib import Path

from services.taskmanager import memory_limit
from services.taskmanager.driver_user import DriverUser, resolve, runtime_paths, unreachable
from services.taskmanager.task_processes import DriverCgroups, cluster_cgroups, sweep
from shared import task_protocol as tp
from shared.spark_runtime import SparkRuntime
from shared.storage_roots import configured_roots

log = logging.getLogger("headrace.taskmanager.sandbox")

ARTIFACT_DIR = "artifact"
# Directories of $HEADRACE_HOME whose contents no driver may list or read (the TaskManager's own
# work directory is traversed to reach the drivers' directories, and is closed the same way).
PRIVATE = ("secrets", "redis", "runs", "artifacts")


@dataclass
class DriverSandbox:
    user: DriverUser = field(default_factory=lambda: DriverUser(None, -1, -1))
    cgroups: DriverCgroups | None = None
    memory_limit: int | None = None  # bytes for a task that sets none; None: no limit
    log_max_bytes: int = 50 * 1024**2
    log_backups: int = 3
    spark_ui: bool = False
    control_catalog: str | None = None  # never handed to a pipeline
    writable_roots: tuple[Path, ...] = ()  # where a snapshot's parent may be handed to the driver user

    @classmethod
    def from_settings(cls, settings, taskmanager_id: str) -> "DriverSandbox":
        """Raises DriverUserError or ValueError (a bad driver_memory_limit) with what to change."""
        user = resolve(settings.driver_user)
        missing = unreachable(user, runtime_paths(SparkRuntime.from_settings(settings)))
        if missing:
            from services.taskmanager.driver_user import DriverUserError

            raise DriverUserError(f"the driver user {user.name!r} cannot reach what a driver runs: "
                                  + "; ".join(missing) + ". Run scripts/bootstrap as root "
                                  "(python -m services.taskmanager.driver_user --prepare)")
        cgroups = DriverCgroups.create(settings.workdir, taskmanager_id) if settings.driver_cgroups else None
        sandbox = cls(user=user, cgroups=cgroups,
                      memory_limit=memory_limit.default_limit(settings.driver_memory_limit, settings.driver_memory),
                      log_max_bytes=settings.driver_log_max_bytes, log_backups=settings.driver_log_backups,
                      spark_ui=settings.spark_ui, control_catalog=settings.catalog,
                      writable_roots=tuple(Path(r) for r in configured_roots(settings)))
        log.info("drivers run as %s; their processes are tracked by %s; task memory limit %s, enforced by %s",
                 user.name or "this TaskManager's own user (no isolation)",
                 f"the cgroup {cgroups.root}" if cgroups else "a /proc scan (session, descendants, environment mark)",
                 memory_limit.gb(sandbox.memory_limit) if sandbox.memory_limit else "none",
                 "the kernel (memory.max on the cgroup's charge)" if cgroups and cgroups.memory
                 else "a watchdog summing the PSS of its processes")
        return sandbox

    def secure_home(self, settings, taskmanager_workdir: Path) -> None:
        """Close the services' files to others and open the way to what drivers write."""
        home = settings.home
        _restrict(home, keep_traversal=True)
        for private in (*(home / name for name in PRIVATE), taskmanager_workdir / "logs"):
            # Created here if missing: a directory another service makes later gets its default mode.
            private.mkdir(mode=0o700, parents=True, exist_ok=True)
            _restrict(private, keep_traversal=False)
        if settings.catalog.startswith("sqlite:///"):
            db = Path(settings.catalog.split("///", 1)[1])
            for f in (db, *(db.with_name(db.name + s) for s in ("-wal", "-shm", "-journal"))):
                _restrict(f, keep_traversal=False)
        settings.lake.mkdir(parents=True, exist_ok=True)  # the pipelines' Delta tables (connectors/delta_paths.py)
        if not self.user.isolated:
            return
        self.user.make_traversable(settings.lake / "x")
        self.user.hand_over(settings.lake)  # the drivers create their tables there
        drivers = taskmanager_workdir / "drivers"
        for d in (drivers, settings.checkpoints, settings.savepoints):
            d.mkdir(parents=True, exist_ok=True)
            for changed in self.user.make_traversable(d / "x"):
                log.info("made %s traversable (o+x) for the driver user %s", changed, self.user.name)
        for d in (taskmanager_workdir, settings.workdir):
            _restrict(d, keep_traversal=True)

    def task_spec(self, spec: tp.TaskSpec, workdir: Path) -> tp.TaskSpec:
        """The spec as the driver gets it: no control catalog URL, its artifact copied into the
        driver's own directory, the job's checkpoint directory the driver user's."""
        update: dict = {}
        if self.control_catalog and spec.catalog_url == self.control_catalog:
            log.warning("task %s came with the control catalog's URL as its pipeline database; not handed to "
                        "the driver (set pipeline_catalog_url)", spec.execution_id)
            update["catalog_url"] = ""
        if spec.artifact_path:
            source = Path(spec.artifact_path)
            copy = workdir / ARTIFACT_DIR / source.name
            copy.parent.mkdir(exist_ok=True)
            shutil.copyfile(source, copy, follow_symlinks=False)
            self.user.hand_over(copy.parent, 0o700)
            self.user.hand_over(copy, 0o600)
            update["artifact_path"] = str(copy)
        self._open_chain(Path(spec.checkpoint_dir).parent)
        return spec.model_copy(update=update) if update else spec

    def prepare_target(self, target: Path) -> None:
        """Before a snapshot into `target`: its parent exists and the driver user may write there."""
        self._open_chain(target.parent)

    def _open_chain(self, directory: Path) -> None:
        """Create `directory` for the driver to write in. Under a storage root (the checkpoint and
        savepoint directories, `storage_roots`), the directories created here and `directory`
        itself become the driver user's, and those above it traversable; elsewhere (a target no
        root allows, refused by the JobManager anyway) it is only created."""
        root = next((r for r in self.writable_roots if directory == r or r in directory.parents), None)
        created = [d for d in (directory, *directory.parents) if root is not None and root in d.parents
                   and not d.exists()]
        directory.mkdir(parents=True, exist_ok=True)
        if root is None or not self.user.isolated:
            return
        self.user.make_traversable(directory / "x")
        for d in reversed(created):
            self.user.hand_over(d)
        if self.user.blocked_at(directory, write=True) is not None:
            self.user.hand_over(directory)


def _restrict(path: Path, *, keep_traversal: bool) -> None:
    """Take group and other read/write (and, unless kept, search) permission off `path`."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode):
        return
    mode = stat.S_IMODE(st.st_mode)
    keep = 0o711 if keep_traversal and stat.S_ISDIR(st.st_mode) else 0o700
    new = mode & (keep | stat.S_ISVTX | stat.S_ISGID)
    if keep_traversal and stat.S_ISDIR(st.st_mode):
        new |= stat.S_IXOTH  # the driver user passes through
    if new != mode:
        path.chmod(new)
        log.info("%s: mode %o -> %o (no access for other users)", path, mode, new)


EXIT_SANDBOX = 5  # the TaskManager's exit code when it cannot confine its drivers


def start_sandbox(settings, taskmanager_id: str, workdir: Path) -> DriverSandbox:
    """The sandbox of a starting TaskManager, after ending what a predecessor's drivers left; exits
    the process (EXIT_SANDBOX) with the reason when the drivers cannot be confined as configured."""
    from services.taskmanager.driver_user import DriverUserError

    left = sweep_drivers(settings, taskmanager_id, workdir)
    if left:
        log.warning("killed %d processes left behind by the drivers of a previous TaskManager %s", left,
                    taskmanager_id)
    try:
        sandbox = DriverSandbox.from_settings(settings, taskmanager_id)
    except (DriverUserError, ValueError) as exc:
        log.error("cannot start the TaskManager: %s", exc)
        raise SystemExit(EXIT_SANDBOX) from None
    sandbox.secure_home(settings, workdir)
    return sandbox


def sweep_drivers(settings, taskmanager_id: str, workdir: Path) -> int:
    """End every process of this TaskManager's drivers, whatever its session (at stop and start)."""
    root = cluster_cgroups(settings.workdir)
    return sweep(workdir / "drivers", root / taskmanager_id if root is not None else None)
