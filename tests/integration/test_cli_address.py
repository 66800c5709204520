"""The client verbs find the dispatcher of the running `headrace up` cluster of HEADRACE_HOME
without -m (its run directory names the dispatcher's pid and address); -m, HEADRACE_CONFIG and
HEADRACE_DISPATCHER_PORT still win. A real dispatcher process on a port that is not 8081."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import yaml

from services.cli.client_address import running_cluster_address
from shared.ports import free_port
from tests.servers import RedisServer, missing
from tests.waiting import wait_for


def headrace(*args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "services.cli", *args], capture_output=True, text=True, timeout=60, env=env
    )


def clean_env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HEADRACE_")}
    return env | extra


def write_run(home: Path, name: str, config: dict, dispatcher_pid: int) -> Path:
    """A run directory as services/cluster/local_cluster.py writes it (only what the CLI reads)."""
    run_dir = home / "runs" / name
    (run_dir / "logs").mkdir(parents=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    (run_dir / "cluster.json").write_text(
        json.dumps(
            {"dispatcher": f"http://127.0.0.1:{config['dispatcher_port']}", "processes": {"dispatcher": dispatcher_pid}}
        )
    )
    return run_dir


@pytest.fixture(scope="module")
def running(tmp_path_factory):
    """A dispatcher started as `headrace up` starts it, from <home>/runs/<run>/config.yaml (one for
    the module: the tests add runs beside it and never stop it)."""
    if not shutil.which("redis-server"):
        missing("redis-server")
    tmp_path = tmp_path_factory.mktemp("cli-address")
    redis_server = RedisServer(tmp_path)
    home = tmp_path / "home"
    port = free_port()
    config = {
        "home": str(home),
        "dispatcher_port": port,
        "redis_url": redis_server.url,
        "catalog_url": f"sqlite:///{tmp_path / 'catalog.db'}",
    }
    run_dir = home / "runs" / "20260101-000000"
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    with open(tmp_path / "dispatcher.log", "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "services.cli", "dispatcher"],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=clean_env(HEADRACE_CONFIG=str(run_dir / "config.yaml")),
        )
    try:

        def answers() -> bool:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/overview", timeout=2).status_code == 200:
                    return True
            except httpx.HTTPError:
                pass
            assert proc.poll() is None, (tmp_path / "dispatcher.log").read_text()[-2000:]
            return False

        wait_for("the dispatcher answering /overview", answers, 60, poll_s=0.2)
        (run_dir / "cluster.json").write_text(
            json.dumps({"dispatcher": f"http://127.0.0.1:{port}", "processes": {"dispatcher": proc.pid}})
        )
        yield home, port, config, proc
    finally:
        proc.terminate()
        proc.wait(20)
        redis_server.stop()


def test_run_and_list_use_the_running_cluster_of_the_home(running, tmp_path):
    home, port, _config, _proc = running
    env = clean_env(HEADRACE_HOME=str(home))
    assert port != 8081
    listed = headrace("list", env=env)
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.strip() == "No jobs."
    pipeline = tmp_path / "pipeline.py"
    pipeline.write_text("def build(ctx):\n    raise RuntimeError('never started: no JobManager here')\n")
    submitted = headrace("run", str(pipeline), "--name", "found-without-m", env=env)
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.split("JobID ")[1].split()[0]
    listed = headrace("list", env=env)
    assert f": {job_id} : found-without-m (" in listed.stdout
    jobs = httpx.get(f"http://127.0.0.1:{port}/jobs/overview", timeout=10).json()["jobs"]
    assert [j["jid"] for j in jobs] == [job_id]


def test_explicit_addresses_win_over_the_running_cluster(running):
    home, port, config, _proc = running
    elsewhere = free_port()
    for extra, args in (({}, ("-m", f"127.0.0.1:{elsewhere}")), ({"HEADRACE_DISPATCHER_PORT": str(elsewhere)}, ())):
        result = headrace("list", *args, env=clean_env(HEADRACE_HOME=str(home), **extra))
        assert result.returncode == 1
        assert f"cannot reach the dispatcher at http://127.0.0.1:{elsewhere}" in result.stderr
    other_config = home / "elsewhere.yaml"
    other_config.write_text(yaml.safe_dump(config | {"dispatcher_port": elsewhere}))
    result = headrace("list", env=clean_env(HEADRACE_HOME=str(home), HEADRACE_CONFIG=str(other_config)))
    assert f"cannot reach the dispatcher at http://127.0.0.1:{elsewhere}" in result.stderr


def test_newer_runs_whose_dispatcher_is_gone_are_passed_over(running, tmp_path):
    home, port, config, proc = running
    exited = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, timeout=30
    )
    write_run(home, "20991231-000000", config | {"dispatcher_port": free_port()}, int(exited.stdout))
    # A live process that is not a dispatcher (a reused pid) does not count either.
    write_run(home, "20991231-000001", config | {"dispatcher_port": free_port()}, os.getpid())
    assert running_cluster_address(home) == ("127.0.0.1", port)
    listed = headrace("list", env=clean_env(HEADRACE_HOME=str(home)))
    assert listed.returncode == 0 and listed.stdout.strip().startswith(("No jobs.", "20")), listed.stderr
    stopped = tmp_path / "stopped-home"
    write_run(stopped, "20260101-000000", config, int(exited.stdout))
    assert running_cluster_address(stopped) is None
