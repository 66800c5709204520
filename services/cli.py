"""`headrace`: one command in front of every service and verb.

Services are started by importing their composition root lazily, so `headrace list` never
loads Spark or Celery. User mistakes end with a one-line message and exit code 1 or 2, never a
traceback.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer
from pydantic import ValidationError

from services import credentials_cli, schedule_cli, token_cli
from shared.settings import Settings, load_settings

if TYPE_CHECKING:
    import httpx

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Headrace: a Flink-style control plane for PySpark pipelines.")

app.add_typer(token_cli.app, name="token")
app.add_typer(schedule_cli.app, name="schedule")
app.add_typer(credentials_cli.app, name="credentials")

URL_HELP = "dispatcher URL (default: dispatcher_host/dispatcher_port of the settings, HEADRACE_CONFIG)"


def fail(message: str, code: int = 1) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def settings_or_fail(**overrides) -> Settings:
    try:
        return load_settings(**overrides)
    except (ValidationError, ValueError) as exc:
        msg = exc.errors()[0]["msg"] if isinstance(exc, ValidationError) else str(exc)
        fail(f"invalid settings: {msg}", 2)


# --- services ----------------------------------------------------------------------------


@app.command()
def dispatcher(port: Optional[int] = typer.Option(None, help="REST/UI port (default 8081)")) -> None:
    """Start the dispatcher: REST API and web UI."""
    from services.dispatcher.__main__ import run

    run(settings_or_fail(dispatcher_port=port))


@app.command()
def jobmanager() -> None:
    """Start a JobManager."""
    from services.jobmanager.__main__ import run

    run(settings_or_fail())


@app.command()
def resourcemanager() -> None:
    """Start the ResourceManager."""
    from services.resourcemanager.__main__ import run

    run(settings_or_fail())


@app.command()
def taskmanager(
    slots: Optional[int] = typer.Option(None, "--slots", "-s", help="number of slots"),
    id: Optional[str] = typer.Option(None, "--id", help="TaskManager id (default: host-random)"),
    simulate: int = typer.Option(0, "--simulate", help="run K simulated TaskManagers (no-op tasks only)"),
) -> None:
    """Start a TaskManager (or K simulated ones)."""
    if slots is not None and slots < 1:
        fail("--slots must be at least 1", 2)
    from services.taskmanager.__main__ import run

    run(settings_or_fail(), slots=slots, taskmanager_id=id, simulate=simulate)


@app.command("spark-master")
def spark_master(
    host: str = typer.Option("0.0.0.0", help="address to listen on (and to advertise)"),
    port: int = typer.Option(7077, help="the master's port (spark://host:PORT)"),
    webui_port: int = typer.Option(8080, "--webui-port", help="its web UI"),
) -> None:
    """Run a Spark standalone master from pyspark's own jars (replaces this process)."""
    from services import spark_standalone as ss

    addr = ss.MasterAddress(host, port, webui_port)
    log_dir = settings_or_fail().home / "spark" / "master"
    _exec(ss.master_command(addr), ss.environment(os.environ, host=host, log_dir=log_dir))


@app.command("spark-worker")
def spark_worker(
    master: str = typer.Argument(..., help="spark://host:port of the master"),
    host: str = typer.Option("0.0.0.0", help="address to listen on"),
    cores: int = typer.Option(1, min=1, help="cores this worker offers to executors"),
    memory: str = typer.Option("1g", help="memory this worker offers to executors"),
    webui_port: int = typer.Option(8081, "--webui-port", help="its web UI"),
) -> None:
    """Run a Spark standalone worker from pyspark's own jars (replaces this process). It must see
    the checkpoint directory at the same path as the TaskManagers (docs/runbooks/shared-storage.md)."""
    from services import spark_standalone as ss

    m = re.fullmatch(r"spark://([^:/]+):(\d+)", master)
    if not m:
        fail(f"the master must be a URL such as spark://spark-master:7077, got {master!r}", 2)
    addr = ss.MasterAddress(m.group(1), int(m.group(2)), 0)
    work = settings_or_fail().home / "spark" / "worker"
    work.mkdir(parents=True, exist_ok=True)
    _exec(ss.worker_command(addr, host=host, cores=cores, memory=memory, webui_port=webui_port, work_dir=work),
          ss.environment(os.environ, host=host, log_dir=work, work_dir=work))


def _exec(cmd: list[str], env: dict) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvpe(cmd[0], cmd, env)


@app.command()
def up(
    taskmanagers: int = typer.Option(2, "--taskmanagers", "-n", help="how many TaskManagers"),
    slots: Optional[int] = typer.Option(None, "--slots", help="slots per TaskManager"),
    port: Optional[int] = typer.Option(None, help="dispatcher port (default 8081)"),
    ha: bool = typer.Option(False, "--ha", help="ZooKeeper mode: two JobManagers elect a leader (starts a local "
                                                "ZooKeeper unless zookeeper_quorum is set)"),
    spark_workers: int = typer.Option(0, "--spark-workers", min=0, max=16,
                                      help="also start a Spark standalone master and this many workers; the "
                                           "tasks' executors run on them"),
    spark_worker_cores: int = typer.Option(1, "--spark-worker-cores", min=1, help="cores each Spark worker offers"),
    spark_worker_memory: str = typer.Option("1g", "--spark-worker-memory", help="memory each Spark worker offers"),
) -> None:
    """Start a whole local cluster as supervised child processes; Ctrl-C stops it."""
    from services.local_cluster import ClusterError, LocalCluster
    from services.redis_auth import masked

    settings = settings_or_fail(dispatcher_port=port)
    ha = ha or settings.high_availability == "zookeeper"
    cluster = LocalCluster(settings, taskmanagers=taskmanagers, slots=slots, jobmanagers=2 if ha else 1, ha=ha,
                           spark_workers=spark_workers, spark_worker_cores=spark_worker_cores,
                           spark_worker_memory=spark_worker_memory)
    stop = _stop_event()
    try:
        cluster.start()
    except ClusterError as exc:
        cluster.stop()
        fail(str(exc))
    # Supervised from here on: a child that exits is restarted with a backoff, and said so here.
    cluster.supervise(notify=typer.echo)
    typer.echo(f"Headrace is up. Dashboard: {cluster.dispatcher_url}/  (logs: {cluster.run_dir}/logs)")
    from services.dispatcher.auth_mode import describe_mode

    typer.echo(describe_mode(settings))
    typer.echo(f"Redis: {masked(cluster.redis_url)}" + (
        f"  (AOF and passwords in {settings.home / 'redis'}; redis-cli: REDISCLI_AUTH from credentials.json)"
        if "redis_url" not in settings.model_fields_set and settings.redis_auth else ""))
    if cluster.zookeeper_quorum:
        typer.echo(f"High availability: 2 JobManagers, ZooKeeper at {cluster.zookeeper_quorum}")
    if cluster.spark_master is not None:
        typer.echo(f"Spark standalone: master {cluster.spark_master.url} with {spark_workers} worker(s); "
                   f"its web UI at {cluster.spark_master.webui}")
    typer.echo("Press Ctrl-C to stop.")
    try:
        stop.wait()
    finally:
        typer.echo("stopping the cluster ...")
        cluster.stop()


@app.command("redis-auth")
def redis_auth_files(
    directory: Path = typer.Argument(Path("deploy"), help="where docker-compose.yml is"),
    rotate: bool = typer.Option(False, "--rotate", help="new passwords and cluster secret (restart the whole stack)"),
) -> None:
    """Write the compose stack's credentials: DIR/.env (Redis passwords, the cluster secret and
    each TaskManager's derived keys; 0600) and DIR/secrets/redis-users.acl (ACL users with
    password hashes). Existing passwords and the secret are kept."""
    from services.compose_credentials import compose_files

    if not directory.is_dir():
        fail(f"{directory}: no such directory", 2)
    try:
        env_file, acl = compose_files(directory, rotate=rotate)
    except (OSError, ValueError) as exc:
        fail(str(exc))
    typer.echo(f"wrote {env_file} (passwords, mode 0600) and {acl} (hashes only)")


def _stop_event() -> threading.Event:
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    return stop


# --- client verbs ------------------------------------------------------------------------


def _client(url: str | None) -> httpx.Client:
    """A client of the REST API at `url`, or at the settings' dispatcher address
    (services/client_address.py); with HEADRACE_TOKEN set it sends that bearer token
    (`headrace token create`, docs/runbooks/auth.md)."""
    # Imported here, not at the top: every service process starts through this module, and
    # httpx (ssl, httpcore, h11) would cost each ~0.15 s of CPU at cluster start for nothing.
    import httpx

    from services.client_address import dispatcher_url

    token = os.environ.get("HEADRACE_TOKEN")
    return httpx.Client(base_url=dispatcher_url(url, settings_or_fail), timeout=30,
                        headers={"Authorization": f"Bearer {token}"} if token else None)


def _call(client: httpx.Client, method: str, path: str, **kw) -> dict:
    import httpx

    try:
        r = client.request(method, path, **kw)
    except httpx.HTTPError:
        fail(f"cannot reach the dispatcher at {client.base_url}: is the cluster up? (headrace up)")
    if r.status_code >= 400:
        try:
            errors = r.json().get("errors") or [r.text]
        except ValueError:
            errors = [r.text]
        fail(f"{method} {path} -> {r.status_code}: {'; '.join(map(str, errors))}")
    return r.json() if r.content else {}


@app.command()
def run(
    file: Path = typer.Argument(..., help="pipeline: a .py file or a .zip of a package"),
    parallelism: int = typer.Option(1, "-p", "--parallelism"),
    url: Optional[str] = typer.Option(None, "-m", "--jobmanager", help=URL_HELP),
    entry: str = typer.Option("build", "--entry", help="entry function"),
    name: Optional[str] = typer.Option(None, "--name", help="job name"),
    restart: Optional[str] = typer.Option(None, "--restart-strategy", help='JSON, e.g. {"type":"none"}'),
    args: Optional[str] = typer.Option(None, "--args", help="program arguments, shell-quoted"),
    wait: bool = typer.Option(False, "--wait", help="wait for a terminal state"),
    from_savepoint: Optional[str] = typer.Option(
        None, "-s", "--from-savepoint", "--fromSavepoint",
        help="start from this savepoint or retained checkpoint (a path or file:// URI)"),
    allow_non_restored: bool = typer.Option(
        False, "-n", "--allow-non-restored-state", "--allowNonRestoredState",
        help="drop snapshot state no operator of the new pipeline claims"),
    claim_mode: Optional[str] = typer.Option(None, "--claim-mode", "--claimMode",
                                             help="NO_CLAIM (default) or CLAIM"),
) -> None:
    """Upload a pipeline and run it (optionally from a savepoint: -s PATH)."""
    if not file.is_file():
        fail(f"{file}: no such file")
    if file.suffix not in (".py", ".zip"):
        fail(f"{file}: a pipeline is a .py file or a .zip of a package")
    if parallelism < 1:
        fail("-p/--parallelism must be at least 1", 2)
    body: dict = {"parallelism": parallelism, "entryClass": entry}
    if claim_mode is not None and claim_mode.strip().upper() not in ("CLAIM", "NO_CLAIM"):
        fail(f"--claim-mode must be CLAIM or NO_CLAIM, got {claim_mode!r}", 2)
    if from_savepoint:
        body["savepointPath"] = from_savepoint
    if allow_non_restored:
        body["allowNonRestoredState"] = True
    if claim_mode:
        body["claimMode"] = claim_mode.strip().upper()
    if name:
        body["jobName"] = name
    if args:
        body["programArgsList"] = shlex.split(args)
    if restart:
        try:
            body["restartStrategy"] = json.loads(restart)
        except json.JSONDecodeError as exc:
            fail(f"--restart-strategy is not valid JSON: {exc.msg}", 2)
    with _client(url) as c:
        with open(file, "rb") as f:
            jar = _call(c, "POST", "/jars/upload", files={"jarfile": (file.name, f)})
        jar_id = jar.get("id") or Path(jar["filename"]).name
        job = _call(c, "POST", f"/jars/{jar_id}/run", json=body)
        typer.echo(f"Job has been submitted with JobID {job['jobid']}")
        if wait:
            state = wait_for_terminal(c, job["jobid"])
            typer.echo(f"Job {job['jobid']} {state}")
            if state != "FINISHED":
                raise typer.Exit(1)


def wait_for_terminal(c: httpx.Client, job_id: str, timeout_s: float = 3600) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        state = _call(c, "GET", f"/jobs/{job_id}")["state"]
        if state in ("FINISHED", "FAILED", "CANCELED"):
            return state
        time.sleep(0.5)
    fail(f"job {job_id} not finished after {timeout_s:.0f} s")


@app.command("list")
def list_jobs(url: Optional[str] = typer.Option(None, "-m", "--jobmanager", help=URL_HELP)) -> None:
    """List jobs."""
    with _client(url) as c:
        jobs = _call(c, "GET", "/jobs/overview")["jobs"]
    if not jobs:
        typer.echo("No jobs.")
        return
    for j in jobs:
        start = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(j["start-time"] / 1000))
        typer.echo(f"{start} : {j['jid']} : {j['name']} ({j['state']})")


@app.command()
def cancel(job_id: str, url: Optional[str] = typer.Option(None, "-m", "--jobmanager", help=URL_HELP)) -> None:
    """Cancel a job."""
    with _client(url) as c:
        _call(c, "PATCH", f"/jobs/{job_id}", params={"mode": "cancel"})
    typer.echo(f"Cancelled job {job_id}.")


# --- savepoints and checkpoints -------------------------------------------------------------

DEFAULT_TIMEOUT_S = 600.0
POLL_INTERVAL_S = 0.5


def _check_timeout(timeout: float) -> None:
    if timeout <= 0:
        fail("--timeout must be a positive number of seconds", 2)


def wait_for_operation(c: httpx.Client, path: str, what: str, timeout_s: float) -> dict:
    """Poll one of Flink's asynchronous-operation status resources until it is COMPLETED; return
    its `operation`. A failed operation prints its cause and exits 1."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = _call(c, "GET", path)
        if (result.get("status") or {}).get("id") == "COMPLETED":
            operation = result.get("operation") or {}
            cause = operation.get("failure-cause") or operation.get("failureCause")
            if cause:
                trace = (cause.get("stack-trace") or "").strip()
                detail = trace if trace else f"{cause.get('class')}"
                fail(f"{what} failed: {detail}")
            return operation
        if time.monotonic() >= deadline:
            fail(f"{what} is still in progress after {timeout_s:.0f} s; it goes on without this command: "
                 f"GET {path} tells when it ends (or wait longer with --timeout)")
        time.sleep(POLL_INTERVAL_S)


def _local(location: str) -> str:
    """Flink reports snapshot locations as `file:/path`; print the plain path, which `mv`, `ls`
    and `headrace run -s` all take."""
    if location.startswith("file:"):
        return "/" + location[len("file:"):].lstrip("/")
    return location


@app.command()
def savepoint(
    job_id: Optional[str] = typer.Argument(None, help="the job to take a savepoint of"),
    directory: Optional[str] = typer.Argument(None, help="target directory (default: state.savepoints.dir)"),
    dispose: Optional[str] = typer.Option(None, "-d", "--dispose", help="delete this savepoint instead"),
    timeout: float = typer.Option(DEFAULT_TIMEOUT_S, "--timeout", help="seconds to wait for the result"),
    url: Optional[str] = typer.Option(None, "-m", "--jobmanager", help=URL_HELP),
) -> None:
    """Take a savepoint of a running job (prints its path last), or dispose of one (-d PATH)."""
    _check_timeout(timeout)
    with _client(url) as c:
        if dispose is not None:
            if job_id is not None:
                fail("give either a job id (take a savepoint) or -d PATH (dispose of one), not both", 2)
            typer.echo(f"Disposing savepoint '{dispose}'.")
            rid = _call(c, "POST", "/savepoint-disposal", json={"savepoint-path": dispose})["request-id"]
            wait_for_operation(c, f"/savepoint-disposal/{rid}", f"disposing of {dispose}", timeout)
            typer.echo(f"Savepoint '{dispose}' disposed.")
            return
        if job_id is None:
            fail("missing the job id: headrace savepoint JOB [DIR], or headrace savepoint -d PATH", 2)
        body = {"target-directory": directory, "cancel-job": False, "formatType": "CANONICAL"}
        typer.echo(f"Triggering savepoint for job {job_id}.")
        rid = _call(c, "POST", f"/jobs/{job_id}/savepoints", json=body)["request-id"]
        typer.echo("Waiting for response...")
        op = wait_for_operation(c, f"/jobs/{job_id}/savepoints/{rid}", f"savepoint of job {job_id}", timeout)
    typer.echo(f"Savepoint completed. Path: {_local(op.get('location') or '')}")


@app.command()
def stop(
    job_id: str = typer.Argument(..., help="the job to stop"),
    savepoint_path: Optional[str] = typer.Option(
        None, "-p", "--savepoint-path", "--savepointPath", help="target directory (default: state.savepoints.dir)"),
    drain: bool = typer.Option(False, "-d", "--drain", help="fire every open event-time window before stopping"),
    timeout: float = typer.Option(DEFAULT_TIMEOUT_S, "--timeout", help="seconds to wait for the result"),
    url: Optional[str] = typer.Option(None, "-m", "--jobmanager", help=URL_HELP),
) -> None:
    """Stop a job with a savepoint (it ends FINISHED); prints the savepoint's path last."""
    _check_timeout(timeout)
    with _client(url) as c:
        typer.echo(f"Suspending job {job_id}.")
        body = {"targetDirectory": savepoint_path, "drain": drain, "formatType": "CANONICAL"}
        rid = _call(c, "POST", f"/jobs/{job_id}/stop", json=body)["request-id"]
        typer.echo("Waiting for response...")
        op = wait_for_operation(c, f"/jobs/{job_id}/savepoints/{rid}", f"stop of job {job_id}", timeout)
    typer.echo(f"Savepoint completed. Path: {_local(op.get('location') or '')}")


def _size(n: int | None) -> str:
    value, unit = float(n or 0), "B"
    for bigger in ("KiB", "MiB", "GiB"):
        if value < 1024:
            break
        value, unit = value / 1024, bigger
    return f"{value:.0f} B" if unit == "B" else f"{value:.1f} {unit}"


def checkpoint_table(stats: dict) -> list[str]:
    """The history of GET /jobs/{id}/checkpoints as aligned text rows, newest first."""
    header = ("ID", "STATUS", "KIND", "BATCH", "SIZE", "DURATION", "PATH")
    rows = [header]
    for cp in stats.get("history") or []:
        status = "DISCARDED" if cp.get("discarded") else cp.get("status", "?")
        kind = "savepoint" if cp.get("is_savepoint") else "checkpoint"
        batch = cp.get("batch_id")
        path = _local(cp.get("external_path") or "") or (cp.get("failure_message") or "-").splitlines()[0][:80]
        rows.append((str(cp.get("id")), status, kind, "-" if batch is None else str(batch),
                     _size(cp.get("state_size")), f"{int(cp.get('end_to_end_duration') or 0)} ms", path))
    widths = [max(len(r[i]) for r in rows) for i in range(len(header) - 1)]
    return ["  ".join(r[i].ljust(widths[i]) for i in range(len(widths))) + "  " + r[-1] for r in rows]


@app.command()
def checkpoints(job_id: str, url: Optional[str] = typer.Option(None, "-m", "--jobmanager", help=URL_HELP)) -> None:
    """A job's recent checkpoints and savepoints, newest first."""
    with _client(url) as c:
        stats = _call(c, "GET", f"/jobs/{job_id}/checkpoints")
    counts = stats.get("counts") or {}
    typer.echo(f"{counts.get('completed', 0)} completed, {counts.get('failed', 0)} failed, "
               f"{counts.get('in_progress', 0)} in progress, {counts.get('restored', 0)} restored")
    if not stats.get("history"):
        typer.echo("No checkpoints yet.")
        return
    for line in checkpoint_table(stats):
        typer.echo(line.rstrip())


@app.command()
def demo(
    once: bool = typer.Option(False, "--once", help="stop the cluster after printing the result"),
    port: Optional[int] = typer.Option(None, help="dispatcher port (default 8081)"),
    spark_workers: int = typer.Option(0, "--spark-workers", min=0, max=16,
                                      help="run the example's executors on a local Spark standalone cluster "
                                           "with this many workers"),
) -> None:
    """Start a local cluster, run the clickstream example, print its per-window counts."""
    from services.demo import run_demo

    run_demo(settings_or_fail(dispatcher_port=port), once=once, echo=typer.echo, fail=fail,
             stop=_stop_event(), spark_workers=spark_workers)


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
