"""What confines a TaskManager's Spark drivers: the OS users they run as, one of its own each
(drivers/user.py, shared/sandbox_users.py), their cgroups (drivers/task_processes.py), the memory limit of
their tasks (memory/limit.py), their log's cap (drivers/rotating_log.py), and what a task is handed
(`task_spec`): its artifact and storage (drivers/home.py, tasks/storage.py).

A task's spec reaches its driver without the control catalog's URL (`catalog_url` is the
pipeline's own database: the job's option `catalog_url`, else `pipeline_catalog_url`, else its
lineage's SQLite database under `pipeline_databases_dir`, made for its user
(tasks/pipeline_database.py), else nothing) and with a copy of its artifact beside the driver's
work directory, so the driver never needs to read the artifact directory.

At start (`secure_home`) the TaskManager closes its home to others (the catalog, the run
directories with their config files, the secrets and Redis credentials, the artifacts): only
traversal (o+x) stays where a driver must pass, to its work, checkpoint and savepoint directories.
Every storage root is made root's and closed to the drivers' writes: an older Headrace handed
some of them to the one user all drivers shared (issue 43). The lake directory (`lake_dir`, the
pipelines' Delta tables) is given to the drivers' group: a table outlives the pool user of the
attempt that created it, so every attempt after it must write there too.
"""

from __future__ import annotations

import logging
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from services.taskmanager.drivers.task_processes import DriverCgroups, cluster_cgroups, sweep
from services.taskmanager.drivers.user import (
    DriverUser,
    DriverUsers,
    give_to_drivers,
    resolve,
    runtime_paths,
    unreachable,
)
from services.taskmanager.memory.limit import UNBOUNDED, default_limit, gb, maximum_limit
from services.taskmanager.tasks import pipeline_database
from services.taskmanager.tasks.storage import StorageRoots
from shared import safe_fs
from shared import task_protocol as tp
from shared.spark_runtime import SparkRuntime
from shared.storage_roots import configured_roots

if TYPE_CHECKING:
    from services.taskmanager.drivers.home import DriverHome

log = logging.getLogger("headrace.taskmanager.sandbox")

# Directories of $HEADRACE_HOME whose contents no driver may list or read (the TaskManager's own
# work directory is traversed to reach the drivers' directories, and is closed the same way).
PRIVATE = ("secrets", "redis", "runs", "artifacts")


@dataclass
class DriverSandbox:
    users: DriverUsers = field(default_factory=lambda: DriverUsers(None, DriverUser(None, os.geteuid(), os.getegid())))
    cgroups: DriverCgroups | None = None
    memory_limit: int | None = None  # bytes for a task that sets none; None: no limit
    memory_limit_max: int = UNBOUNDED  # what a job's own option may ask for
    log_max_bytes: int = 50 * 1024**2
    log_backups: int = 3
    spark_ui: bool = False
    control_catalog: str | None = None  # never handed to a pipeline
    storage: StorageRoots = field(default_factory=lambda: StorageRoots(()))  # where tasks write snapshots
    pipeline_databases: Path | None = None  # each lineage's own SQLite database is below (pipeline_databases_dir)

    @classmethod
    def from_settings(cls, settings, taskmanager_id: str) -> "DriverSandbox":
        """Raises DriverUserError or ValueError (a bad driver_memory_limit) with what to change."""
        users = resolve(settings.driver_user, settings.driver_users)
        missing = unreachable(users.sample, runtime_paths(SparkRuntime.from_settings(settings)))
        if missing:
            from services.taskmanager.drivers.user import DriverUserError

            raise DriverUserError(
                f"the drivers' user {users.sample.name!r} cannot reach what a driver runs: "
                + "; ".join(missing)
                + ". Run scripts/bootstrap as root "
                "(python -m services.taskmanager.drivers.user --prepare)"
            )
        cgroups = DriverCgroups.create(settings.workdir, taskmanager_id) if settings.driver_cgroups else None
        default = default_limit(settings.driver_memory_limit, settings.driver_memory)
        sandbox = cls(
            users=users,
            cgroups=cgroups,
            memory_limit=default,
            memory_limit_max=maximum_limit(
                settings.driver_memory_limit_max, default=default, taskmanager_memory=settings.taskmanager_memory_bytes
            ),
            log_max_bytes=settings.driver_log_max_bytes,
            log_backups=settings.driver_log_backups,
            spark_ui=settings.spark_ui,
            control_catalog=settings.catalog,
            storage=StorageRoots(tuple(Path(r) for r in configured_roots(settings)), users.ownership()),
            pipeline_databases=settings.pipeline_databases_dir,
        )
        log.info(
            "drivers run as %s; their processes are tracked by %s; task memory limit %s, enforced by %s",
            f"users of their own ({settings.driver_user}-0..{settings.driver_users - 1})"
            if users.isolated
            else "this TaskManager's own user (no isolation)",
            f"the cgroup {cgroups.root}" if cgroups else "a /proc scan (session, descendants, environment mark)",
            gb(sandbox.memory_limit) if sandbox.memory_limit else "none",
            "the kernel (memory.max on the cgroup's charge)"
            if cgroups and cgroups.memory
            else "a watchdog summing the PSS of its processes",
        )
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
        if self.pipeline_databases is not None:
            try:
                pipeline_database.prepare(self.pipeline_databases, self.storage.owners, in_use=_runs_as)
                if self.users.pool is not None:  # whoever hands out a pool user takes back its lineages first
                    self.users.pool.reclaim_below(self.pipeline_databases)
            except OSError as exc:  # each task handed a database there then fails, saying why
                log.error("cannot prepare the pipelines' databases in %s: %s", self.pipeline_databases, exc)
        if not self.users.isolated:
            return
        give_to_drivers(settings.lake, settings.driver_user)  # group-writable, setgid, sticky
        drivers = taskmanager_workdir / "drivers"
        for d in (drivers, settings.checkpoints, settings.savepoints):
            d.mkdir(parents=True, exist_ok=True)
            for changed in self.users.sample.make_traversable(d / "x"):
                log.info("made %s traversable (o+x) for the drivers' users", changed)
        for root in self.storage.roots:
            self._close_root(root)
        for d in (taskmanager_workdir, settings.workdir):
            _restrict(d, keep_traversal=True)

    def _close_root(self, root: Path) -> None:
        """A storage root no driver may write (a missing one is left to whoever creates it)."""
        try:
            fd = safe_fs.open_trusted(root)
        except FileNotFoundError:
            return
        with safe_fs.opened(fd):
            safe_fs.secure_dir(fd, self.storage.owners, where=str(root), mode_or=0o001)

    def task_spec(self, spec: tp.TaskSpec, home: "DriverHome") -> tp.TaskSpec:
        """The spec as the driver gets it: no control catalog URL, its artifact copied where it
        may read it, its attempt directory made for its user (and its snapshot shown through a
        view: tasks/storage.py)."""
        update: dict = {}
        if self.control_catalog and spec.catalog_url == self.control_catalog:
            log.warning(
                "task %s came with the control catalog's URL as its pipeline database; not handed to "
                "the driver (set pipeline_catalog_url)",
                spec.execution_id,
            )
            update["catalog_url"] = ""
        if spec.artifact_path:
            update["artifact_path"] = str(home.place_artifact(Path(spec.artifact_path)))
        update.update(home.grant_storage(self.storage, spec))
        own = update.get("catalog_url", spec.catalog_url) or spec.config.get("catalog_url")
        if self.pipeline_databases is not None and not own and spec.kind == "pyspark":
            update["catalog_url"] = home.grant_database(self.pipeline_databases, self.storage.owners, spec)
        return spec.model_copy(update=update) if update else spec


def _runs_as(uid: int) -> bool:
    from shared.sandbox_users import processes_of

    return bool(processes_of(uid))


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
    from services.taskmanager.drivers.user import DriverUserError

    left = sweep_drivers(settings, taskmanager_id, workdir)
    if left:
        log.warning("killed %d processes left behind by the drivers of a previous TaskManager %s", left, taskmanager_id)
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
