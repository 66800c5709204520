"""`headrace deploy apply|list|show|suspend|resume|rollback|delete`: declared deployments over the
dispatcher's REST API (/deployments), with HEADRACE_TOKEN like every client command.

The deployment file (YAML: `name` and the spec) is read by services/cli/deploy_file.py; a
`pipeline:` file named there is uploaded at each apply. services/cli/app.py registers the group."""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer

from services.cli.common import URL_HELP, call, client, fail
from services.cli.deploy_file import NAME_RULE, NAME_RULE_TEXT, DeploymentFileError, load_deployment_file
from services.cli.job_commands import RESTORE_CHECK_WAIT_S
from shared.failure_summary import summarize

if TYPE_CHECKING:
    import httpx

LIFECYCLE_STATES = ("DEPLOYING", "STABLE", "UPGRADING", "ROLLING_BACK", "ROLLED_BACK", "SUSPENDED", "FAILED")
# Waiting for anything else, these end the wait at once: the change did not take.
GAVE_UP_STATES = ("FAILED", "ROLLED_BACK")
NEW = "(new)"  # lifecycleState is null until the JobManager first sees a deployment
POLL_INTERVAL_S = 1.0

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Declared deployments: a pipeline kept running at the spec of a YAML file, upgraded "
    "(and rolled back) by the JobManager when the spec changes.",
)

URL = typer.Option(None, "-m", "--jobmanager", help=URL_HELP)
WAIT = typer.Option(
    None, "--wait", metavar="STATE", help=f"then wait until the deployment is in STATE ({', '.join(LIFECYCLE_STATES)})"
)
TIMEOUT = typer.Option(300.0, "--timeout", help="seconds --wait waits at most")


# --- waiting for a state ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Before:
    """The status just before a request: transitions and errors after it are the request's doing."""

    event: dict | None  # the newest history entry (None: none yet, or a new deployment)
    error: str | None


def before_of(detail: dict | None) -> Before:
    status = (detail or {}).get("status") or {}
    history = status.get("history") or []
    return Before(history[-1] if history else None, status.get("error"))


def wait_verdict(status: dict, target: str, generation: int, before: Before) -> bool | None:
    """True: `target` reached; False: the deployment gave up on the request; None: not yet.
    A state from before the request must not end the wait (a rollback starts from FAILED; an
    upgrade shows the old generation STABLE until the JobManager acts), hence `before`."""
    history = status.get("history") or []
    state, error = status.get("lifecycleState"), status.get("error")
    moved = (history[-1] if history else None) != before.event
    if target == "STABLE":  # exact: STABLE at the generation asked for (or a newer one)
        if state == "STABLE" and (status.get("stableGeneration") or 0) >= generation:
            return True
    elif state == target and (moved or target == "SUSPENDED"):  # SUSPENDED is only ever the asked-for state
        return True
    if not moved:
        return None
    if state in GAVE_UP_STATES and state != target:
        return False
    # A stop with a savepoint that failed leaves the old job running, STABLE, with a new error.
    return False if state == "STABLE" and error and error != before.error else None


def _newest_reason(status: dict) -> str | None:
    history = status.get("history") or []
    return history[-1].get("reason") if history else None


def _checked_wait(wait: str | None, timeout: float) -> str | None:
    if wait is None:
        return None
    if wait.upper() not in LIFECYCLE_STATES:
        fail(f"--wait must be one of {', '.join(LIFECYCLE_STATES)}, got {wait!r}", 2)
    if timeout <= 0:
        fail("--timeout must be a positive number of seconds", 2)
    return wait.upper()


def _wait_for(c: httpx.Client, name: str, target: str, generation: int, timeout_s: float, before: Before) -> None:
    deadline = time.monotonic() + timeout_s
    told = None
    while True:
        status = call(c, "GET", f"/deployments/{name}")["status"]
        state, reason = status.get("lifecycleState") or NEW, _newest_reason(status)
        if (state, reason) != told:  # a long upgrade shows its steps, not a silent minute
            told = (state, reason)
            typer.echo(f"  {name}: {state}" + (f" ({reason})" if reason else ""))
        verdict = wait_verdict(status, target, generation, before)
        if verdict:
            return
        if verdict is False:
            fail(
                f"deployment {name} is {state}, not {target}: {status.get('error') or reason or 'no reason given'} "
                f"(headrace deploy show {name})"
            )
        if time.monotonic() >= deadline:
            # STABLE, but at an older generation than the one applied: say so, not "is STABLE".
            older = f" at generation {status.get('stableGeneration')}, not {generation}" if state == target else ""
            fail(
                f"deployment {name} did not become {target} within {timeout_s:g} s: it is {state}{older}"
                + (f", newest history: {reason}" if reason else "")
                + f" (headrace deploy show {name})"
            )
        time.sleep(POLL_INTERVAL_S)


# --- commands -------------------------------------------------------------------------------------


def _checked_name(name: str) -> None:
    if not NAME_RULE.match(name):
        fail(f"deployment name {name!r} is not valid: {NAME_RULE_TEXT}", 2)


def _when(ms: int | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ms / 1000)) if ms else "-"


def _put(c: httpx.Client, name: str, body: dict, expected_generation: int | None = None) -> dict:
    # A changed spec is answered after the dispatcher checked the job's state fits the new pipeline.
    params = {"expectedGeneration": expected_generation} if expected_generation is not None else None
    answer = call(c, "PUT", f"/deployments/{name}", json=body, params=params, timeout=RESTORE_CHECK_WAIT_S)
    typer.echo(
        f"Deployment {name}: generation {answer['generation']} applied "
        f"({'changed' if answer.get('changed') else 'unchanged'})"
    )
    return answer


def _before_apply(c: httpx.Client, name: str) -> Before:
    exists = any(d["name"] == name for d in call(c, "GET", "/deployments")["deployments"])
    return before_of(call(c, "GET", f"/deployments/{name}") if exists else None)


@app.command()
def apply(
    file: Path = typer.Argument(..., help="deployment file (YAML): name, and jarId or pipeline, and the spec"),
    wait: Optional[str] = WAIT,
    timeout: float = TIMEOUT,
    url: Optional[str] = URL,
) -> None:
    """Create or update a deployment from a YAML file; a `pipeline:` file is uploaded first."""
    target = _checked_wait(wait, timeout)
    try:
        deployment = load_deployment_file(file)
    except DeploymentFileError as exc:
        fail(str(exc), 2)
    body = deployment.body
    with client(url) as c:
        if deployment.pipeline is not None:
            body = {"jarId": _jar_of(c, deployment.pipeline), **body}
        before = _before_apply(c, deployment.name) if target else None
        answer = _put(c, deployment.name, body)
        if target and before is not None:
            _wait_for(c, deployment.name, target, answer["generation"], timeout, before)


def _jar_of(c: "httpx.Client", pipeline: Path) -> str:
    """The jar holding exactly this file, uploaded if none does: applying an unchanged file again
    must leave the spec (and so the generation) as it is."""
    digest = hashlib.sha256(pipeline.read_bytes()).hexdigest()
    for jar in call(c, "GET", "/jars").get("files") or []:
        if jar.get("sha256") == digest and jar.get("name") == pipeline.name:
            return str(jar["id"])
    with open(pipeline, "rb") as f:
        uploaded = call(c, "POST", "/jars/upload", files={"jarfile": (pipeline.name, f)})
    jar_id = str(uploaded.get("id") or Path(uploaded["filename"]).name)
    typer.echo(f"Uploaded {pipeline} as jar {jar_id}")
    return jar_id


@app.command("list")
def list_deployments(url: Optional[str] = URL) -> None:
    """List the deployments: state, generation/stable generation, job, error."""
    with client(url) as c:
        rows = call(c, "GET", "/deployments")["deployments"]
    if not rows:
        typer.echo("No deployments (create one with: headrace deploy apply FILE.yaml).")
        return
    table = [("NAME", "STATE", "GEN/STABLE", "JOB", "ERROR")]
    for d in rows:
        stable = d.get("stableGeneration")
        job = f"{d['jobId']} ({d.get('jobState') or '?'})" if d.get("jobId") else "-"
        table.append(
            (
                d["name"],
                d.get("lifecycleState") or NEW,
                f"{d['generation']}/{stable or '-'}",
                job,
                summarize(d.get("error"), limit=60) or "-",
            )
        )
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]) - 1)]
    for r in table:
        typer.echo("  ".join(r[i].ljust(w) for i, w in enumerate(widths)) + "  " + r[-1])


def _savepoint_text(path: str | None, savepoints: list[dict]) -> str:
    taken = next((sp for sp in reversed(savepoints) if sp.get("path") == path), None)
    when = f" ({_when(taken.get('at'))}, {taken.get('trigger')})" if taken else ""
    return f"{path}{when}" if path else "none"


@app.command()
def show(
    name: str = typer.Argument(...),
    as_json: bool = typer.Option(False, "--json", help="print the GET body"),
    url: Optional[str] = URL,
) -> None:
    """One deployment: its state, job, last savepoint and history (newest last)."""
    _checked_name(name)
    with client(url) as c:
        d = call(c, "GET", f"/deployments/{name}")
    if as_json:
        typer.echo(json.dumps(d, indent=2))
        return
    s, spec = d.get("status") or {}, d.get("spec") or {}
    typer.echo(
        f"Deployment {d['name']}: {s.get('lifecycleState') or NEW}, generation {d['generation']}, "
        f"stable generation {s.get('stableGeneration') or '-'}"
    )
    typer.echo(
        f"Spec: jar {spec.get('jarId')}, parallelism {spec.get('parallelism', '-')}, "
        f"upgrade mode {spec.get('upgradeMode', '-')}, state {spec.get('state', '-')}"
    )
    job = f"{s['jobId']} {s.get('jobState') or '?'} (generation {s.get('jobGeneration')})" if s.get("jobId") else "none"
    typer.echo(f"Job: {job}")
    auto = s.get("autoscaler")
    if auto:
        last = auto.get("lastEvaluation") or {}
        typer.echo(
            f"Autoscaler: parallelism {s.get('parallelism')}"
            + (f", holding off: {auto['heldOff']}" if auto.get("heldOff") else "")
            + (f"; last evaluation: {last.get('outcome')}, {last.get('reason')}" if last else "")
        )
    typer.echo(f"Last savepoint: {_savepoint_text(s.get('lastSavepoint'), d.get('savepoints') or [])}")
    if s.get("error"):
        typer.echo(f"Error: {s['error']}")
    history = s.get("history") or []
    typer.echo("History:" if history else "History: none yet")
    for h in history:
        typer.echo(
            f"  {_when(h.get('at'))}  gen {h.get('generation')}  {h.get('from') or '-'} → {h.get('to')}  "
            f"{h.get('reason') or ''}".rstrip()
        )


def _set_state(name: str, state: str, wait: str | None, timeout: float, url: str | None) -> None:
    target = _checked_wait(wait, timeout)
    _checked_name(name)
    with client(url) as c:
        # The whole spec goes back: PUT replaces it, and every other field must stay as it was.
        detail = call(c, "GET", f"/deployments/{name}")
        # expectedGeneration: an apply that lands between the GET and the PUT is not undone.
        answer = _put(c, name, {**detail["spec"], "state": state}, expected_generation=detail["generation"])
        if target:
            _wait_for(c, name, target, answer["generation"], timeout, before_of(detail))


@app.command()
def suspend(
    name: str = typer.Argument(...), wait: Optional[str] = WAIT, timeout: float = TIMEOUT, url: Optional[str] = URL
) -> None:
    """Suspend a deployment: its job stops with a savepoint; the spec stays."""
    _set_state(name, "suspended", wait, timeout, url)


@app.command()
def resume(
    name: str = typer.Argument(...), wait: Optional[str] = WAIT, timeout: float = TIMEOUT, url: Optional[str] = URL
) -> None:
    """Resume a suspended deployment, from the savepoint its suspension took."""
    _set_state(name, "running", wait, timeout, url)


@app.command()
def rollback(
    name: str = typer.Argument(...), wait: Optional[str] = WAIT, timeout: float = TIMEOUT, url: Optional[str] = URL
) -> None:
    """Roll a deployment back to its last stable generation (409 when there is none); it ends
    ROLLED_BACK (--wait ROLLED_BACK), and stays so until the next apply."""
    target = _checked_wait(wait, timeout)
    _checked_name(name)
    with client(url) as c:
        before = before_of(call(c, "GET", f"/deployments/{name}")) if target else None
        answer = call(c, "POST", f"/deployments/{name}/rollback")
        typer.echo(f"Deployment {name}: rolling back to generation {answer['generation']}")
        if target and before is not None:
            _wait_for(c, name, target, answer["generation"], timeout, before)


@app.command()
def delete(
    name: str = typer.Argument(...),
    no_savepoint: bool = typer.Option(False, "--no-savepoint", help="cancel the job without a savepoint"),
    url: Optional[str] = URL,
) -> None:
    """Delete a deployment; its job stops with a final savepoint unless --no-savepoint."""
    _checked_name(name)
    params = {"savepoint": "false"} if no_savepoint else None
    with client(url) as c:
        call(c, "DELETE", f"/deployments/{name}", params=params)
    typer.echo(f"Deployment {name}: deleting ({'no savepoint' if no_savepoint else 'with a final savepoint'}).")
