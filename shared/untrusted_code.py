"""How a process that runs a pipeline's code is started: an allow-listed environment, and the
unprivileged OS user of the drivers when this process may switch to it.

Pipelines are code the cluster did not write. Wherever one runs (a TaskManager's driver, the
dispatcher's planner that builds it to check a restore), it must not inherit the service's
environment (HEADRACE_CONFIG names a file with Redis passwords, HEADRACE_CLUSTER_SECRET is the
key every signature derives from) nor its OS user (which may read the services' config files,
credentials and the catalog). The TaskManager's driver sandbox (services/taskmanager/drivers/env.py,
drivers/user.py) and the dispatcher's restore check (services/dispatcher/submission/restore_check.py) both
build on this module.
"""

from __future__ import annotations

import os
import pwd
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

# Kept as they are, when the starting process has them. JDK_JAVA_OPTIONS is the operator's way to
# give every JVM a driver starts the same options (the JDK's launcher reads it; no secret).
ALLOWED = frozenset(
    {
        "PATH",
        "LANG",
        "LANGUAGE",
        "TZ",
        "JAVA_HOME",
        "JDK_JAVA_OPTIONS",
        "PYTHONPATH",
        "PYTHONDONTWRITEBYTECODE",
        "PYTHONUNBUFFERED",
        "PYTHONIOENCODING",
        "PYTHONHASHSEED",
    }
)
ALLOWED_PREFIXES = ("LC_", "SPARK_", "PYSPARK_")
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"


def allowed(name: str) -> bool:
    return name in ALLOWED or name.startswith(ALLOWED_PREFIXES)


def environment(
    environ: Mapping[str, str], *, home: Path, user: str | None, import_root: Path | None = None
) -> dict[str, str]:
    """The environment of untrusted code working in `home` (its HOME and TMPDIR too), run as
    `user` (None: the caller's own), with `import_root` first on PYTHONPATH."""
    env = {k: v for k, v in environ.items() if allowed(k)}
    env.setdefault("PATH", DEFAULT_PATH)
    env.update(HOME=str(home), TMPDIR=str(home), PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if import_root is not None:
        paths.insert(0, str(import_root))
    if paths:
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    if user:
        env.update(USER=user, LOGNAME=user)
    return env


@dataclass(frozen=True)
class UntrustedUser:
    """The OS user untrusted code runs as; name None means the caller's own (no isolation)."""

    name: str | None
    uid: int
    gid: int
    groups: tuple[int, ...] = ()  # supplementary groups (the drivers' shared group)

    @property
    def isolated(self) -> bool:
        return self.name is not None

    def popen_kwargs(self) -> dict:
        """subprocess.Popen arguments that start a process as this user, with only its own
        supplementary groups (root's would follow it otherwise) and a umask that keeps what it
        writes to itself."""
        if not self.isolated:
            return {}
        return {"user": self.uid, "group": self.gid, "extra_groups": list(self.groups), "umask": 0o077}

    def own(self, path: Path) -> None:
        """Give `path` (a directory made for this process, not a symlink) to this user."""
        if self.isolated and not path.is_symlink():
            os.chown(path, self.uid, self.gid, follow_symlinks=False)


def switchable_user(name: str | None) -> UntrustedUser | None:
    """The user `name` when this process can start processes as it (root, and the user exists);
    the caller's own user when `name` is empty; None when `name` is set but cannot be used
    (the caller decides whether that is fatal or a logged fallback)."""
    if not name:
        return UntrustedUser(None, os.getuid(), os.getgid())
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        return None
    if entry.pw_uid == os.geteuid():
        return UntrustedUser(None, entry.pw_uid, entry.pw_gid)
    if os.geteuid() != 0:
        return None
    return UntrustedUser(name, entry.pw_uid, entry.pw_gid)
