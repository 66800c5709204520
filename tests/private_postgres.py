"""A throwaway PostgreSQL server of a test's own, which the test may stop and start: the machine's
server on 5432 is shared by every test (and other users), so outages are never played on it.

    with PrivatePostgres() as pg:       # initdb into a temporary directory, start on a free port
        url = pg.url                     # postgresql://postgres@127.0.0.1:<port>/postgres
        pg.stop()                        # fast shutdown: sessions are cut, connects refused
        pg.start()                       # the same data directory, the same port

The server runs as its own child process (as the `postgres` user when the tests run as root,
since PostgreSQL refuses to run as root) and is stopped by its PID; the directory is removed at
the end.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg

from shared.ports import free_port
from tests.servers import missing

START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0


def _binary(name: str) -> str:
    found = shutil.which(name) or next(iter(sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"))), None)
    if found is None:
        missing(f"PostgreSQL's {name} (Debian package postgresql)")
    return str(found)


class PrivatePostgres:
    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        self.proc: subprocess.Popen | None = None
        self._user: str | None = None
        if os.geteuid() == 0:
            try:
                pwd.getpwnam("postgres")
            except KeyError:
                missing("a `postgres` user to run a private PostgreSQL as (it refuses to run as root)")
            self._user = "postgres"
        # Not pytest's tmp_path: its parents are private to root, and the server runs as postgres.
        self.root = Path(tempfile.mkdtemp(prefix="headrace-pg-"))
        self.data = self.root / "data"
        if self._user:
            shutil.chown(self.root, self._user, self._user)
        subprocess.run(
            [_binary("initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync", "-E", "UTF8"],
            check=True,
            capture_output=True,
            user=self._user,
            group=self._user,
            timeout=120,
        )
        self.log = self.root / "postgres.log"

    def start(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            return
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [
                    _binary("postgres"),
                    "-D",
                    str(self.data),
                    "-p",
                    str(self.port),
                    "-c",
                    "listen_addresses=127.0.0.1",
                    "-c",
                    "unix_socket_directories=",
                    "-c",
                    "fsync=off",
                    "-c",
                    "full_page_writes=off",
                    "-c",
                    "max_connections=50",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                user=self._user,
                group=self._user,
                start_new_session=True,
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.answers():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"private PostgreSQL on port {self.port} did not start within "
                    f"{START_TIMEOUT_S:.0f} s; its log:\n{self.log.read_text(errors='replace')[-3000:]}"
                )
            time.sleep(0.1)

    def answers(self) -> bool:
        try:
            with psycopg.connect(self.url, connect_timeout=2) as conn:
                conn.execute("SELECT 1")
            return True
        except psycopg.OperationalError:
            return False

    def stop(self) -> None:
        """A fast shutdown (SIGINT to the postmaster): open sessions are terminated, new
        connections refused, as when an operator stops the server."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def close(self) -> None:
        try:
            self.stop()
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> "PrivatePostgres":
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()
