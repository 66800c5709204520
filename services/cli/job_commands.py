"""`headrace run|list|cancel|savepoint|stop|checkpoints`: the client verbs, over the dispatcher's
REST API (Flink's CLI's names and options where it has them)."""

from __future__ import annotations

import json
import shlex
import time
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer

from services.cli.common import URL_HELP, call, client, fail
from shared.artifact_kind import kind_of
from shared.failure_summary import summarize

if TYPE_CHECKING:
    import httpx

commands = typer.Typer()
# A submission from a savepoint is answered after the dispatcher's restore check, which may plan
# the pipeline for up to 120 s (services/dispatcher/submission/restore_check.py).
RESTORE_CHECK_WAIT_S = 180.0


def job_options(items: list[str]) -> dict[str, str]:
    """-D KEY=VALUE items as a job's configuration; the dispatcher checks the values."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            fail(f"-D {item}: a job option is KEY=VALUE, e.g. -D execution.checkpointing.interval=10s", 2)
        out[key.strip()] = value.strip()
    return out


@commands.command()
def run(
    file: Path = typer.Argument(..., help="pipeline: a .py file or a .zip of a package"),
    parallelism: int = typer.Option(1, "-p", "--parallelism"),
    url: Optional[str] = typer.Option(None, "-m", "--jobmanager", help=URL_HELP),
    entry: str = typer.Option("build", "--entry", help="entry function"),
    name: Optional[str] = typer.Option(None, "--name", help="job name"),
    restart: Optional[str] = typer.Option(None, "--restart-strategy", help='JSON, e.g. {"type":"none"}'),
    args: Optional[str] = typer.Option(None, "--args", help="program arguments, shell-quoted"),
    wait: bool = typer.Option(False, "--wait", help="wait for a terminal state"),
    options: Optional[list[str]] = typer.Option(
        None,
        "-D",
        metavar="KEY=VALUE",
        help="a job option, as Flink's -D (repeatable), e.g. -D headrace.latency-mode=true",
    ),
    from_savepoint: Optional[str] = typer.Option(
        None,
        "-s",
        "--from-savepoint",
        "--fromSavepoint",
        help="start from this savepoint or retained checkpoint (a path or file:// URI)",
    ),
    allow_non_restored: bool = typer.Option(
        False,
        "-n",
        "--allow-non-restored-state",
        "--allowNonRestoredState",
        help="drop snapshot state no operator of the new pipeline claims",
    ),
    claim_mode: Optional[str] = typer.Option(None, "--claim-mode", "--claimMode", help="NO_CLAIM (default) or CLAIM"),
) -> None:
    """Upload a pipeline and run it (optionally from a savepoint: -s PATH)."""
    if not file.is_file():
        fail(f"{file}: no such file")
    if kind_of(file) is None:
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
    if options:
        body["flinkConfiguration"] = job_options(options)
    if restart:
        try:
            body["restartStrategy"] = json.loads(restart)
        except json.JSONDecodeError as exc:
            fail(f"--restart-strategy is not valid JSON: {exc.msg}", 2)
    with client(url) as c:
        with open(file, "rb") as f:
            jar = call(c, "POST", "/jars/upload", files={"jarfile": (file.name, f)})
        jar_id = jar.get("id") or Path(jar["filename"]).name
        # Only then: a timeout of None would mean none at all.
        patience = {"timeout": RESTORE_CHECK_WAIT_S} if from_savepoint else {}
        job = call(c, "POST", f"/jars/{jar_id}/run", json=body, **patience)
        typer.echo(f"Job has been submitted with JobID {job['jobid']}")
        database = pipeline_database(c, job["jobid"])
        if database:
            typer.echo(f"Its SQL output (ctx.catalog_url) goes to {database}")
        if wait:
            state = wait_for_terminal(c, job["jobid"])
            cause = last_failure(c, job["jobid"]) if state == "FAILED" else None
            typer.echo(f"Job {job['jobid']} {state}" + (f": {cause}" if cause else ""))
            if state != "FINISHED":
                raise typer.Exit(1)


def pipeline_database(c: httpx.Client, job_id: str) -> str | None:
    """The job's own SQLite pipelines database when the cluster keeps one per lineage; None
    otherwise, or when the job's details cannot be read (the job was submitted all the same)."""
    import httpx

    try:
        r = c.get(f"/jobs/{job_id}")
        return r.json().get("pipeline-database") if r.status_code == 200 else None
    except (httpx.HTTPError, ValueError, AttributeError):
        return None


def wait_for_terminal(c: httpx.Client, job_id: str, timeout_s: float = 3600) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        state = call(c, "GET", f"/jobs/{job_id}")["state"]
        if state in ("FINISHED", "FAILED", "CANCELED"):
            return state
        time.sleep(0.5)
    fail(f"job {job_id} not finished after {timeout_s:.0f} s")


def last_failure(c: httpx.Client, job_id: str) -> str | None:
    """The newest exception of the job's history as one line (its whole trace: the exceptions
    endpoint, or the dashboard's Exceptions tab)."""
    entries = (call(c, "GET", f"/jobs/{job_id}/exceptions").get("exceptionHistory") or {}).get("entries") or []
    if not entries:
        return None
    return summarize(f"{entries[0].get('exceptionName')}: {entries[0].get('stacktrace') or ''}")


@commands.command("list")
def list_jobs(url: Optional[str] = typer.Option(None, "-m", "--jobmanager", help=URL_HELP)) -> None:
    """List jobs."""
    with client(url) as c:
        jobs = call(c, "GET", "/jobs/overview")["jobs"]
    if not jobs:
        typer.echo("No jobs.")
        return
    for j in jobs:
        start = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(j["start-time"] / 1000))
        typer.echo(f"{start} : {j['jid']} : {j['name']} ({j['state']})")


@commands.command()
def cancel(job_id: str, url: Optional[str] = typer.Option(None, "-m", "--jobmanager", help=URL_HELP)) -> None:
    """Cancel a job."""
    with client(url) as c:
        call(c, "PATCH", f"/jobs/{job_id}", params={"mode": "cancel"})
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
    told = None
    while True:
        result = call(c, "GET", path)
        waiting = result.get("waiting") or {}
        if waiting.get("reason") and waiting["reason"] != told:
            told = waiting["reason"]
            until = time.strftime("%H:%M:%S", time.localtime(waiting.get("deadline", 0) / 1000))
            typer.echo(f"Waiting for the job's task to run: {told}; the {what} fails if it does not by {until}.")
        if (result.get("status") or {}).get("id") == "COMPLETED":
            operation = result.get("operation") or {}
            cause = operation.get("failure-cause") or operation.get("failureCause")
            if cause:
                trace = (cause.get("stack-trace") or "").strip()
                detail = trace if trace else f"{cause.get('class')}"
                fail(f"{what} failed: {detail}")
            return operation
        if time.monotonic() >= deadline:
            fail(
                f"{what} is still in progress after {timeout_s:.0f} s; it goes on without this command: "
                f"GET {path} tells when it ends (or wait longer with --timeout)"
            )
        time.sleep(POLL_INTERVAL_S)


def _local(location: str) -> str:
    """Flink reports snapshot locations as `file:/path`; print the plain path, which `mv`, `ls`
    and `headrace run -s` all take."""
    if location.startswith("file:"):
        return "/" + location[len("file:") :].lstrip("/")
    return location


@commands.command()
def savepoint(
    job_id: Optional[str] = typer.Argument(None, help="the job to take a savepoint of"),
    directory: Optional[str] = typer.Argument(None, help="target directory (default: state.savepoints.dir)"),
    dispose: Optional[str] = typer.Option(None, "-d", "--dispose", help="delete this savepoint instead"),
    timeout: float = typer.Option(DEFAULT_TIMEOUT_S, "--timeout", help="seconds to wait for the result"),
    url: Optional[str] = typer.Option(None, "-m", "--jobmanager", help=URL_HELP),
) -> None:
    """Take a savepoint of a running job (prints its path last), or dispose of one (-d PATH)."""
    _check_timeout(timeout)
    with client(url) as c:
        if dispose is not None:
            if job_id is not None:
                fail("give either a job id (take a savepoint) or -d PATH (dispose of one), not both", 2)
            typer.echo(f"Disposing savepoint '{dispose}'.")
            rid = call(c, "POST", "/savepoint-disposal", json={"savepoint-path": dispose})["request-id"]
            wait_for_operation(c, f"/savepoint-disposal/{rid}", f"disposing of {dispose}", timeout)
            typer.echo(f"Savepoint '{dispose}' disposed.")
            return
        if job_id is None:
            fail("missing the job id: headrace savepoint JOB [DIR], or headrace savepoint -d PATH", 2)
        body = {"target-directory": directory, "cancel-job": False, "formatType": "CANONICAL"}
        typer.echo(f"Triggering savepoint for job {job_id}.")
        rid = call(c, "POST", f"/jobs/{job_id}/savepoints", json=body)["request-id"]
        typer.echo("Waiting for response...")
        op = wait_for_operation(c, f"/jobs/{job_id}/savepoints/{rid}", f"savepoint of job {job_id}", timeout)
    typer.echo(f"Savepoint completed. Path: {_local(op.get('location') or '')}")


@commands.command()
def stop(
    job_id: str = typer.Argument(..., help="the job to stop"),
    savepoint_path: Optional[str] = typer.Option(
        None, "-p", "--savepoint-path", "--savepointPath", help="target directory (default: state.savepoints.dir)"
    ),
    drain: bool = typer.Option(False, "-d", "--drain", help="fire every open event-time window before stopping"),
    timeout: float = typer.Option(DEFAULT_TIMEOUT_S, "--timeout", help="seconds to wait for the result"),
    url: Optional[str] = typer.Option(None, "-m", "--jobmanager", help=URL_HELP),
) -> None:
    """Stop a job with a savepoint (it ends FINISHED); prints the savepoint's path last."""
    _check_timeout(timeout)
    with client(url) as c:
        where = savepoint_path or "the default savepoint directory (state.savepoints.dir)"
        typer.echo(
            f"Stopping job {job_id} with a savepoint in {where}{', draining it first' if drain else ''}; "
            "it ends FINISHED once the savepoint is complete."
        )
        body = {"targetDirectory": savepoint_path, "drain": drain, "formatType": "CANONICAL"}
        rid = call(c, "POST", f"/jobs/{job_id}/stop", json=body)["request-id"]
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
        path = _local(cp.get("external_path") or "") or summarize(cp.get("failure_message"), limit=80) or "-"
        rows.append(
            (
                str(cp.get("id")),
                status,
                kind,
                "-" if batch is None else str(batch),
                _size(cp.get("state_size")),
                f"{int(cp.get('end_to_end_duration') or 0)} ms",
                path,
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(header) - 1)]
    return ["  ".join(r[i].ljust(widths[i]) for i in range(len(widths))) + "  " + r[-1] for r in rows]


@commands.command()
def checkpoints(job_id: str, url: Optional[str] = typer.Option(None, "-m", "--jobmanager", help=URL_HELP)) -> None:
    """A job's recent checkpoints and savepoints, newest first."""
    with client(url) as c:
        stats = call(c, "GET", f"/jobs/{job_id}/checkpoints")
    counts = stats.get("counts") or {}
    typer.echo(
        f"{counts.get('completed', 0)} completed, {counts.get('failed', 0)} failed, "
        f"{counts.get('in_progress', 0)} in progress, {counts.get('restored', 0)} restored"
    )
    if not stats.get("history"):
        typer.echo("No checkpoints yet.")
        return
    for line in checkpoint_table(stats):
        typer.echo(line.rstrip())
