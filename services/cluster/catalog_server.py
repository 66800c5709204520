"""The PostgreSQL server `headrace up --ha` runs as its catalog, unless a catalog URL is configured.

Why not the SQLite file the cluster uses otherwise: a JobManager stopped (SIGSTOP, a paused VM, a
long swap) inside a write transaction keeps SQLite's lock, and no standby can take the leadership
until it wakes, since nobody can take a lock from a stopped process. A PostgreSQL row lock belongs
to a session, and the next leader ends the sessions of older epochs
(services/jobmanager/leader_sessions.py).

The server is one more supervised child of the cluster, like its Redis and ZooKeeper: its data in
$HEADRACE_HOME/postgres/data (made by initdb once and kept from one run to the next, as the SQLite
catalog and Redis's AOF are), listening on 127.0.0.1 only, on `catalog_port` (0: a free one), with
no Unix socket. Authentication is a password (scram-sha-256) for the superuser `headrace`, kept in
$HEADRACE_HOME/postgres/pgpass (0600, libpq's password file format) and named by the catalog URL
(`?passfile=`), so no configuration file, log or cluster.json holds it. Not trust: a pipeline's
driver on this host would then reach the catalog, and as a superuser could run programs as the
server's OS user. PostgreSQL refuses to run as root: a root `headrace up` starts it as the
`postgres` OS user (Debian's package creates it). It is stopped by its PID with the cluster, with
a fast shutdown (SIGINT to the postmaster: sessions are ended, nothing is lost).
"""

from __future__ import annotations

import os
import pwd
import re
import secrets
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable
from urllib.parse import quote

import psycopg

from services.cluster.infrastructure import ClusterError, Spawn, port_taken
from services.taskmanager.drivers.user import DriverUser
from shared.ports import free_port
from shared.settings import Settings

if TYPE_CHECKING:
    from services.cluster.child_processes import Child

CHILD = "postgres"  # the child's name, as the compose stack's service is named
DIRECTORY = "postgres"
DATABASE = "headrace"
USER = "headrace"
OS_USER = "postgres"  # what a root `headrace up` runs the server as
HOST = "127.0.0.1"
START_TIMEOUT_S = 60.0  # initdb'd and started, a server answers within seconds; a loaded CI host is slower
INITDB_TIMEOUT_S = 180.0
DEBIAN_BINARIES = Path("/usr/lib/postgresql")


@dataclass(frozen=True)
class CatalogServer:
    """Where the server keeps its data, the port it listens on, and who runs it."""

    data_dir: Path
    passfile: Path
    port: int
    binaries: Path
    os_user: str | None  # None: this process's own user

    @property
    def url(self) -> str:
        """The catalog URL the services get: the password is read from the passfile by libpq."""
        return self.admin_url(DATABASE)

    def admin_url(self, database: str = "postgres") -> str:
        return f"postgresql://{USER}@{HOST}:{self.port}/{database}?passfile={quote(str(self.passfile))}"

    def command(self) -> list[str]:
        """The postmaster in the foreground. Under another OS user through setpriv, which execs it:
        the postmaster is the child's own process, in its own group, signalled by its PID."""
        cmd = [
            str(self.binaries / "postgres"),
            "-D",
            str(self.data_dir),
            "-p",
            str(self.port),
            "-c",
            f"listen_addresses={HOST}",
            "-c",
            "unix_socket_directories=",
            "-c",
            "password_encryption=scram-sha-256",
        ]
        return _as_user(self.os_user) + cmd


def binaries_dir() -> Path:
    """The directory of `postgres` and `initdb`: on PATH, else the newest of Debian's
    /usr/lib/postgresql/<version>/bin."""
    on_path = shutil.which("postgres")
    if on_path and shutil.which("initdb"):
        return Path(on_path).parent
    versions = sorted(
        (d for d in DEBIAN_BINARIES.glob("*/bin") if (d / "postgres").exists() and (d / "initdb").exists()),
        key=lambda d: _version(d.parent.name),
    )
    if not versions:
        raise ClusterError(
            "headrace up --ha runs its catalog on PostgreSQL, which is not installed (Debian: "
            "apt-get install postgresql; scripts/bootstrap installs it), or set HEADRACE_CATALOG_URL "
            "to a PostgreSQL server of yours"
        )
    return versions[-1]


def _version(name: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", name)) or (0,)


def _os_user() -> str | None:
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam(OS_USER)
    except KeyError:
        raise ClusterError(
            f"PostgreSQL refuses to run as root, and there is no {OS_USER!r} OS user to run the "
            "catalog as (Debian's postgresql package creates it), or set HEADRACE_CATALOG_URL to a "
            "PostgreSQL server of yours"
        ) from None
    return OS_USER


def _as_user(name: str | None) -> list[str]:
    if name is None:
        return []
    return ["setpriv", f"--reuid={name}", f"--regid={name}", "--init-groups", "--"]


def start(settings: Settings, spawn: Spawn, env: dict) -> tuple[CatalogServer, Child]:
    """Prepare the server (`prepare`) and start it as the cluster's child `postgres`;
    `wait_until_ready` waits for it."""
    server = prepare(settings)
    child = spawn(CHILD, server.command(), environment(env))
    child.shutdown_signal = signal.SIGINT  # the postmaster's fast shutdown, to it alone
    return server, child


def prepare(settings: Settings) -> CatalogServer:
    """The server's directory, password and data (initdb on the first run); nothing is started."""
    binaries = binaries_dir()
    os_user = _os_user()
    base = settings.home / DIRECTORY
    base.mkdir(parents=True, exist_ok=True)
    os.chmod(base, 0o711)  # the server's user passes through to its data; the passfile stays ours
    passfile = base / "pgpass"
    password = _password(passfile)
    data = base / "data"
    if os_user is not None:  # o+x on the directories above (a root home is often 0700), never read
        pw = pwd.getpwnam(os_user)
        DriverUser(os_user, pw.pw_uid, pw.pw_gid).make_traversable(base)
    if not (data / "PG_VERSION").exists():
        _initdb(binaries, data, password, os_user)
    port = settings.catalog_port or free_port()
    if settings.catalog_port and port_taken(HOST, port):
        raise ClusterError(
            f"the catalog's port {port} (catalog_port) is taken on {HOST}: another server or process "
            f"listens there (ss -ltnp 'sport = :{port}'); stop it or set HEADRACE_CATALOG_PORT to a "
            "free port (0: a free one)"
        )
    return CatalogServer(data_dir=data, passfile=passfile, port=port, binaries=binaries, os_user=os_user)


def _password(passfile: Path) -> str:
    """The superuser's password from the passfile (`host:port:database:user:password`), or a new
    one written there (0600: libpq ignores a passfile others can read)."""
    if passfile.exists():
        password = passfile.read_text().strip().rsplit(":", 1)[-1]
        if password:
            return password
    password = secrets.token_urlsafe(24)  # no ':' or '\\', which the passfile format would need escaped
    fd = os.open(passfile, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(f"{HOST}:*:*:{USER}:{password}\n")
    os.chmod(passfile, 0o600)
    return password


def _initdb(binaries: Path, data: Path, password: str, os_user: str | None) -> None:
    """A new data directory owned by the server's user, its superuser `headrace` with `password`,
    password authentication only. Made under another name and renamed once complete: an initdb
    that was interrupted leaves nothing that looks like a data directory."""
    making = data.with_name(data.name + ".initdb")
    shutil.rmtree(making, ignore_errors=True)
    making.mkdir(mode=0o700)
    pwfile = data.parent / "initdb-password"
    fd = os.open(pwfile, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(password + "\n")
    try:
        if os_user is not None:
            pw = pwd.getpwnam(os_user)
            for path in (making, pwfile):
                os.chown(path, pw.pw_uid, pw.pw_gid)
        cmd = _as_user(os_user) + [
            str(binaries / "initdb"),
            "-D",
            str(making),
            "-U",
            USER,
            f"--pwfile={pwfile}",
            "--auth=scram-sha-256",
            "-E",
            "UTF8",
            "--locale=C",
        ]
        done = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            timeout=INITDB_TIMEOUT_S,
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C"},
        )
    except subprocess.TimeoutExpired:
        raise ClusterError(f"initdb of the catalog's PostgreSQL in {data} took over {INITDB_TIMEOUT_S:.0f} s") from None
    finally:
        pwfile.unlink(missing_ok=True)
    if done.returncode != 0:
        last = (done.stderr or done.stdout).strip().splitlines() or [f"exit code {done.returncode}"]
        raise ClusterError(f"initdb of the catalog's PostgreSQL in {data} failed: {last[-1]}")
    shutil.rmtree(data, ignore_errors=True)  # a directory without PG_VERSION holds no catalog
    making.rename(data)


def environment(env: dict) -> dict:
    """The server needs no setting of ours: only a PATH and a locale."""
    return {"PATH": env.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C"}


def wait_until_ready(
    server: CatalogServer, *, alive: Callable[[], bool], log: Path, timeout_s: float = START_TIMEOUT_S
) -> str:
    """Until the server accepts the superuser; then the catalog database exists (made on the first
    run). The catalog URL; ClusterError naming the log if the server exits or is late."""
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    while time.monotonic() < deadline:
        if not alive():
            raise ClusterError(f"the catalog's PostgreSQL exited while starting; see {log}")
        try:
            with psycopg.connect(server.admin_url(), connect_timeout=2, autocommit=True) as conn:
                if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE,)).fetchone() is None:
                    conn.execute(f'CREATE DATABASE "{DATABASE}"')
            return server.url
        except psycopg.OperationalError as exc:
            last = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            time.sleep(0.2)
    raise ClusterError(f"the catalog's PostgreSQL did not answer within {timeout_s:.0f} s ({last}); see {log}")
