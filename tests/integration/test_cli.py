"""The CLI answers user mistakes with one line and a non-zero exit, never a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from services.dispatcher.app import create_app
from shared import checkpoint_storage
from shared.catalog import Catalog, repository
from shared.ids import new_job_id
from shared.messages import RequestSavepoint
from shared.ports import free_port
from shared.settings import Settings
from shared.states import CheckpointStatus, OperationStatus
from shared.streams import JM_STREAM
from shared.transport import InMemoryTransport
from tests.clusters import ServedApp
from tests.waiting import wait_for


def headrace(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "services.cli", *args], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(
    "args, expected",
    [
        (("run", "does-not-exist.py"), "does-not-exist.py: no such file"),
        (("run", "README.md"), "a pipeline is a .py file or a .zip"),
        (("run", "examples/clickstream.py", "-p", "0"), "-p/--parallelism must be at least 1"),
        (("list", "-m", "http://127.0.0.1:{port}"), "cannot reach the dispatcher"),
        (("cancel", "abc", "-m", "http://127.0.0.1:{port}"), "cannot reach the dispatcher"),
        (("savepoint", "abc", "-m", "http://127.0.0.1:{port}"), "cannot reach the dispatcher"),
        (("savepoint", "-d", "/sp/x", "-m", "http://127.0.0.1:{port}"), "cannot reach the dispatcher"),
        (("stop", "abc", "-m", "http://127.0.0.1:{port}"), "cannot reach the dispatcher"),
        (("checkpoints", "abc", "-m", "http://127.0.0.1:{port}"), "cannot reach the dispatcher"),
        (("taskmanager", "--slots", "0"), "--slots must be at least 1"),
    ],
)
def test_user_mistakes_get_one_line(args, expected):
    port = str(free_port())
    result = headrace(*[a.replace("{port}", port) for a in args])
    assert result.returncode != 0
    assert expected in result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert len(result.stderr.strip().splitlines()) == 1


def test_invalid_settings_are_reported_not_raised(monkeypatch):
    result = subprocess.run(
        [sys.executable, "-m", "services.cli", "jobmanager"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"HEADRACE_HEARTBEAT_INTERVAL_S": "20", "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 2
    assert "heartbeat_interval_s" in result.stderr and "Traceback" not in result.stderr


# --- savepoints, stop, checkpoints against a live dispatcher -----------------------------------


class Live:
    """A dispatcher serving HTTP on a free port (real catalog, in-memory JobManager stream); the
    test plays the JobManager by finishing the operations it is asked for."""

    def __init__(self, tmp: Path):
        # The test's directory is a storage root: its snapshots may be restored and disposed of.
        self.settings = Settings(
            home=tmp / "home", catalog_url=f"sqlite:///{tmp / 'catalog.db'}", storage_roots=str(tmp)
        )
        self.catalog = Catalog(self.settings.catalog)
        self.catalog.migrate()
        self.transport = InMemoryTransport(sender="dispatcher")
        self.served = ServedApp(create_app(self.settings, self.catalog, self.transport))
        self.url = self.served.url

    def stop(self) -> None:
        self.served.stop()
        self.catalog.dispose()

    def job(self) -> str:
        job_id = new_job_id()
        with self.catalog.session() as s:
            repository.create_job(
                s,
                id=job_id,
                name="clicks",
                artifact_id=None,
                entry="build",
                parallelism=1,
                program_args=[],
                config={},
                restart_strategy={"type": "none"},
                kind="noop",
            )
        return job_id

    def requested(self, kind: type, timeout_s: float = 30):
        def published() -> list:
            return [b for b in self.transport.bodies(JM_STREAM) if isinstance(b, kind)]

        return wait_for(f"a {kind.__name__} published", published, timeout_s, poll_s=0.05)[-1]

    def finish(self, request_id: str, status: OperationStatus, **kw) -> None:
        with self.catalog.session() as s:
            repository.finish_operation(s, repository.get_operation(s, request_id, lock=True), status, **kw)


@pytest.fixture
def live(tmp_path):
    server = Live(tmp_path)
    yield server
    server.stop()


def start(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "services.cli", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def test_savepoint_prints_the_location_last(live, tmp_path):
    job_id = live.job()
    proc = start("savepoint", job_id, f"file://{tmp_path}/sp", "-m", live.url)
    req = live.requested(RequestSavepoint)
    assert (req.job_id, req.target_directory, req.after) == (job_id, f"{tmp_path}/sp", "continue")
    location = f"{tmp_path}/sp/savepoint-{job_id[:6]}-0123456789ab"
    live.finish(req.request_id, OperationStatus.COMPLETED, location=location)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert out.split()[-1] == location and f"Triggering savepoint for job {job_id}" in out


def test_a_failed_savepoint_prints_its_cause_and_exits_1(live):
    job_id = live.job()
    proc = start("savepoint", job_id, "-m", live.url)
    req = live.requested(RequestSavepoint)
    assert req.target_directory == str(live.settings.savepoints.absolute())
    live.finish(req.request_id, OperationStatus.FAILED, failure_cause="checkpoint 4 declined: the query stopped")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert f"savepoint of job {job_id} failed: checkpoint 4 declined: the query stopped" in err
    assert "Traceback" not in out + err


def test_waiting_has_a_timeout_with_a_clear_message(live, tmp_path):
    job_id = live.job()
    target = str(tmp_path / "sp")  # inside the storage roots: elsewhere is refused before anything waits
    result = headrace("stop", job_id, "--savepoint-path", target, "--drain", "--timeout", "1", "-m", live.url)
    req = live.requested(RequestSavepoint)
    assert (req.after, req.drain, req.target_directory) == ("stop", True, target)
    assert result.returncode == 1 and "still in progress after 1 s" in result.stderr
    assert f"/jobs/{job_id}/savepoints/{req.request_id}" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_stop_with_savepoint(live):
    job_id = live.job()
    proc = start("stop", job_id, "-m", live.url)
    req = live.requested(RequestSavepoint)
    assert (req.after, req.drain) == ("stop", False)
    live.finish(req.request_id, OperationStatus.COMPLETED, location=f"file:///data/sp/savepoint-{job_id[:6]}-abc")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert out.split()[-1] == f"/data/sp/savepoint-{job_id[:6]}-abc"


def test_errors_of_the_api_are_one_line(live):
    result = headrace("savepoint", "0" * 32, "-m", live.url)
    assert result.returncode == 1 and f"job '{'0' * 32}' not found" in result.stderr
    job_id = live.job()
    result = headrace("savepoint", job_id, "s3://bucket/sp", "-m", live.url)
    assert result.returncode == 1 and "scheme 's3' is not supported" in result.stderr
    for res in (
        result,
        headrace("savepoint", "-m", live.url),
        headrace("savepoint", job_id, "-d", "/x", "-m", live.url),
        headrace("savepoint", job_id, "--timeout", "0", "-m", live.url),
    ):
        assert res.returncode != 0 and len(res.stderr.strip().splitlines()) == 1, res.stderr
        assert "Traceback" not in res.stderr + res.stdout


def test_dispose_of_a_savepoint(live, tmp_path):
    sp = tmp_path / "savepoint-abcdef-0123456789ab"
    checkpoint_storage.take_empty_snapshot(sp, metadata={"job_id": "0" * 32, "kind": "savepoint"})
    with live.catalog.session() as s:  # only a snapshot the catalog records is disposed of
        row = repository.create_checkpoint(
            s, job_id=live.job(), checkpoint_id=1, kind="savepoint", execution_id=None, vertex_id=None, path=str(sp)
        )
        repository.transition_checkpoint(s, row, CheckpointStatus.COMPLETED)
    result = headrace("savepoint", "-d", str(sp), "-m", live.url)
    assert result.returncode == 0, result.stderr
    assert f"Savepoint '{sp}' disposed." in result.stdout and not sp.exists()
    result = headrace("savepoint", "-d", str(tmp_path / "nothing"), "-m", live.url)
    assert result.returncode == 1 and "not a savepoint this cluster knows" in result.stderr


def test_run_from_a_savepoint(live, tmp_path):
    sp = tmp_path / "savepoint-abcdef-0123456789ab"
    checkpoint_storage.take_empty_snapshot(sp, metadata={"job_id": "0" * 32, "kind": "savepoint"})
    pipeline = tmp_path / "job.py"
    pipeline.write_text("def build(ctx):\n    return None\n")
    result = headrace(
        "run",
        str(pipeline),
        "-s",
        f"file://{sp}",
        "--allow-non-restored-state",
        "--claim-mode",
        "claim",
        "-m",
        live.url,
    )
    assert result.returncode == 0, result.stderr
    job_id = result.stdout.split()[-1]
    with live.catalog.session() as s:
        config = repository.get_job(s, job_id).config
    assert config == {
        "execution.savepoint.path": str(sp),
        "execution.savepoint.ignore-unclaimed-state": True,
        "execution.savepoint-restore-mode": "CLAIM",
    }
    result = headrace("run", str(pipeline), "-s", str(tmp_path / "nothing"), "-m", live.url)
    assert result.returncode == 1 and "no completed checkpoint or savepoint at" in result.stderr
    result = headrace("run", str(pipeline), "--claim-mode", "steal", "-m", live.url)
    assert result.returncode == 2 and "--claim-mode must be CLAIM or NO_CLAIM" in result.stderr


def test_run_with_job_options(live, tmp_path):
    pipeline = tmp_path / "job.py"
    pipeline.write_text("def build(ctx):\n    return None\n")
    result = headrace(
        "run",
        str(pipeline),
        "-D",
        "headrace.latency-mode=true",
        "-D",
        "execution.checkpointing.interval = 2 s",
        "-m",
        live.url,
    )
    assert result.returncode == 0, result.stderr
    with live.catalog.session() as s:
        config = repository.get_job(s, result.stdout.split()[-1]).config
    assert config == {"headrace.latency-mode": "true", "execution.checkpointing.interval": "2 s"}
    result = headrace("run", str(pipeline), "-D", "headrace.latency-mode", "-m", live.url)
    assert result.returncode == 2 and "a job option is KEY=VALUE" in result.stderr
    result = headrace("run", str(pipeline), "-D", "headrace.latency-mode=sometimes", "-m", live.url)
    assert result.returncode == 1 and "headrace.latency-mode" in result.stderr and "true or false" in result.stderr


def test_checkpoints_table(live):
    job_id = live.job()
    result = headrace("checkpoints", job_id, "-m", live.url)
    assert result.returncode == 0 and "No checkpoints yet." in result.stdout
    with live.catalog.session() as s:
        row = repository.create_checkpoint(
            s, job_id=job_id, checkpoint_id=1, kind="checkpoint", execution_id=None, vertex_id=None
        )
        repository.transition_checkpoint(
            s,
            row,
            CheckpointStatus.COMPLETED,
            path=f"/chk/{job_id}/chk-1",
            batch_id=12,
            state_size=3 * 2**20,
            duration_ms=420,
        )
        row = repository.create_checkpoint(
            s, job_id=job_id, checkpoint_id=2, kind="savepoint", execution_id=None, vertex_id=None
        )
        repository.transition_checkpoint(s, row, CheckpointStatus.FAILED, failure_cause="declined: stopped\nmore")
    result = headrace("checkpoints", job_id, "-m", live.url)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "1 completed, 1 failed, 0 in progress, 0 restored"
    assert lines[1].split() == ["ID", "STATUS", "KIND", "BATCH", "SIZE", "DURATION", "PATH"]
    assert lines[2].split() == ["2", "FAILED", "savepoint", "-", "0", "B", "0", "ms", "declined:", "stopped"]
    assert lines[3].split() == ["1", "COMPLETED", "checkpoint", "12", "3.0", "MiB", "420", "ms", f"/chk/{job_id}/chk-1"]
