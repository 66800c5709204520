"""The real Apache Flink 2.3 CLI (`flink`, a Java client) against Headrace's REST API: list, savepoint,
savepoint disposal, stop-with-savepoint and cancel, on a local multi-process cluster running no-op
tasks (which answer savepoint triggers with an empty snapshot, so no Spark is needed).

The CLI comes from scripts/install-flink-cli, which unpacks it into $HEADRACE_FLINK_HOME or
~/.cache/headrace/flink-2.3.0. Without it these tests skip locally and fail under CI=true.
"""

from __future__ import annotations

import os
import re
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tests.clusters import TERMINAL, Rest, start_cluster
from tests.flink_cli import CLI_JVM_OPTS, CLI_TIMEOUT_S, FLINK_HOME, FLINK_VERSION, LAUNCHER
from tests.servers import missing

SAVEPOINT_PATH = re.compile(r"Savepoint completed\. Path: (\S+)")
UNKNOWN_JOB = "0" * 32


class Cli:
    """One `flink` run in the background; result() waits for it."""

    def __init__(self, argv: list[str], env: dict[str, str]):
        self.argv, self.t0 = argv, time.monotonic()
        self.proc = subprocess.Popen(
            argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
        )
        self.out, self.took = "", 0.0
        self._reader = threading.Thread(target=self._collect, daemon=True)
        self._reader.start()

    def _collect(self) -> None:
        self.out = self.proc.communicate()[0]
        self.took = time.monotonic() - self.t0

    def result(self) -> tuple[int, str]:
        self._reader.join(max(0.0, CLI_TIMEOUT_S - (time.monotonic() - self.t0)))
        if self._reader.is_alive():
            self.proc.kill()
            self._reader.join(10)
            pytest.fail(f"`flink {' '.join(self.argv[1:])}` still running after {CLI_TIMEOUT_S} s:\n{self.out}")
        header = f"[flink {' '.join(self.argv[1:])}: exit {self.proc.returncode} in {self.took:.1f} s]"
        return self.proc.returncode, f"{header}\n{self.out}"


@pytest.fixture(scope="module")
def flink_cli() -> Path:
    if not os.access(LAUNCHER, os.X_OK):
        missing(f"the Flink {FLINK_VERSION} CLI ({LAUNCHER}; install it with scripts/install-flink-cli)")
    return LAUNCHER


@pytest.fixture(scope="module")
def cluster(flink_cli, tmp_path_factory, pg_url_module):
    # Savepoints go to the test's own directories: pytest's temp dir is a storage root here.
    c = start_cluster(
        tmp_path_factory.mktemp("flink-cli-home"),
        catalog_url=pg_url_module,
        taskmanagers=1,
        slots=5,
        storage_roots=str(tmp_path_factory.getbasetemp()),
    )
    yield c
    c.stop()


@pytest.fixture(scope="module")
def flink(flink_cli, cluster, tmp_path_factory):
    """Starts `flink <args> -m <dispatcher>` in the background; returns its Cli."""
    address = cluster.dispatcher_url.split("://", 1)[1].rstrip("/")
    # The installed tree's own configuration and a private log dir, whatever a global Flink
    # installation exported.
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLINK_")}
    env.update(
        FLINK_CONF_DIR=str(FLINK_HOME / "dist" / "pyflink" / "conf"),
        FLINK_LOG_DIR=str(tmp_path_factory.mktemp("flink-cli-log")),
        FLINK_ENV_JAVA_OPTS_CLI=CLI_JVM_OPTS,
        JDK_JAVA_OPTIONS="",
    )
    if env.get("JAVA_HOME") and not Path(env["JAVA_HOME"], "bin", "java").exists():
        del env["JAVA_HOME"]  # stale: the launcher then takes `java` from PATH
    started: list[Cli] = []

    def start(command: str, *args: str) -> Cli:
        started.append(Cli([str(flink_cli), command, "-m", address, *args], env))
        return started[-1]

    yield start
    for cli in started:
        if cli.proc.poll() is None:
            cli.proc.kill()
            cli.proc.wait(10)


def submit(rest: Rest, jar: str, name: str, duration: float = -1) -> str:
    return rest.run(
        jar, kind="noop", jobName=name, restartStrategy={"type": "none"}, config={"noop.duration": duration}
    )


@pytest.fixture(scope="module")
def jobs(rest, tmp_path_factory):
    """One job per command (so the commands are independent); all but `finished` run until cancelled."""
    jar = rest.upload_noop_pipeline(tmp_path_factory.mktemp("jar"))
    ids = {role: submit(rest, jar, f"cli-{role}") for role in ("listed", "savepointed", "stopped", "cancelled")}
    ids["finished"] = submit(rest, jar, "cli-finished", duration=0)
    for role, job in ids.items():
        if role == "finished":
            rest.wait_state(job, "FINISHED", timeout_s=30)
        else:
            rest.wait_running_task(job)
    yield ids
    for job in ids.values():
        if rest.job(job)["state"] not in TERMINAL:
            rest.cancel(job)


@pytest.fixture(scope="module")
def savepoints(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("savepoints")


@pytest.fixture(scope="module")
def runs(flink, jobs, savepoints) -> dict[str, Cli]:
    """Every command that needs no other's outcome, started side by side: each costs seconds of JVM
    start-up, and in sequence they would not fit the file's time budget."""
    return {
        "list": flink("list"),
        "list -a": flink("list", "-a"),
        "savepoint": flink("savepoint", jobs["savepointed"], str(savepoints / "plain")),
        "stop": flink("stop", "--savepointPath", f"file://{savepoints}/stop", jobs["stopped"]),
        "cancel": flink("cancel", jobs["cancelled"]),
        "unknown": flink("cancel", UNKNOWN_JOB),
    }


def savepoint_dir(out: str) -> Path:
    """The directory of the `file:/…` location the CLI printed."""
    found = SAVEPOINT_PATH.search(out)
    assert found, f"no savepoint path in the CLI's output:\n{out}"
    location = found.group(1)
    assert location.startswith("file:/"), location
    return Path("/" + location[len("file:") :].lstrip("/"))


def test_list_shows_running_jobs_and_with_a_also_finished_ones(runs, jobs):
    code, out = runs["list"].result()
    assert code == 0, out
    assert re.search(rf"^.* : {jobs['listed']} : cli-listed \(RUNNING\)$", out, re.M), out
    assert jobs["finished"] not in out, out

    code, out = runs["list -a"].result()
    assert code == 0, out
    assert re.search(rf"^.* : {jobs['listed']} : cli-listed \(RUNNING\)$", out, re.M), out
    assert re.search(rf"^.* : {jobs['finished']} : cli-finished \(FINISHED\)$", out, re.M), out


def test_savepoint_then_dispose(runs, jobs, rest, flink, savepoints):
    job = jobs["savepointed"]
    code, out = runs["savepoint"].result()
    assert code == 0, out
    savepoint = savepoint_dir(out)
    assert savepoint.parent == savepoints / "plain" and savepoint.name.startswith(f"savepoint-{job[:6]}-"), out
    assert (savepoint / "_metadata").is_file(), sorted(savepoints.rglob("*"))
    stats = rest.get(f"/jobs/{job}/checkpoints")
    assert stats["latest"]["savepoint"]["external_path"] == f"file:{savepoint}", stats["latest"]
    assert any(c["is_savepoint"] and c["external_path"] == f"file:{savepoint}" for c in stats["history"]), stats
    assert rest.job(job)["state"] == "RUNNING"  # a plain savepoint leaves the job running

    # Disposed of by the location exactly as the CLI printed it (file:/…).
    code, out = flink("savepoint", "-d", f"file:{savepoint}").result()
    assert code == 0, out
    assert f"Savepoint 'file:{savepoint}' disposed." in out, out
    assert not savepoint.exists()


def test_stop_with_savepoint_finishes_the_job(runs, jobs, rest, savepoints):
    job = jobs["stopped"]
    code, out = runs["stop"].result()
    assert code == 0, out
    savepoint = savepoint_dir(out)
    assert savepoint.parent == savepoints / "stop", out
    assert (savepoint / "_metadata").is_file(), sorted(savepoints.rglob("*"))
    assert rest.wait_state(job, TERMINAL, timeout_s=30)["state"] == "FINISHED"
    history = rest.get(f"/jobs/{job}/checkpoints")["history"]
    assert any(
        c["checkpoint_type"] == "SYNC_SAVEPOINT" and c["external_path"] == f"file:{savepoint}" for c in history
    ), history


def test_cancel_cancels_the_job(runs, jobs, rest):
    code, out = runs["cancel"].result()
    assert code == 0, out
    assert f"Cancelled job {jobs['cancelled']}." in out, out
    assert rest.wait_state(jobs["cancelled"], TERMINAL, timeout_s=30)["state"] == "CANCELED"


def test_unknown_job_fails_at_once_with_headraces_message(runs, cluster):
    code, out = runs["unknown"].result()
    assert code != 0, out
    assert f"RestClientException: [job '{UNKNOWN_JOB}' not found" in out, out
    # Flink's client retries what looks like a connection problem or an overloaded server; a clear
    # 404 must not look like one. The dispatcher's access log shows how often the CLI asked.
    asked = [ln for ln in cluster.child("dispatcher").log.read_text().splitlines() if f"/jobs/{UNKNOWN_JOB}" in ln]
    assert len(asked) == 1 and " 404 " in asked[0], asked
