"""`headrace schedule create|list|show|pause|resume|delete`: scheduled submissions over the
dispatcher's REST API (/jobs/schedules), with HEADRACE_TOKEN like every client command.

services/cli/app.py registers it; the REST client is services/cli/common.py's."""

from __future__ import annotations

import time
from typing import List, Optional

import typer

from services.cli.common import call, client, fail

OVERLAPS = ("skip", "queue", "cancel_previous")

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Scheduled submissions: run a jar on a cron expression (UTC) or every N seconds; "
    "see docs/runbooks/schedules.md.",
)

URL = typer.Option(None, "-m", "--jobmanager", help="dispatcher URL (default: from the settings, HEADRACE_CONFIG)")


def _rest(url: Optional[str], method: str, path: str, **kw) -> dict:
    with client(url) as c:
        return call(c, method, path, **kw)


def _when(ms: int | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ms / 1000)) if ms else "-"


@app.command()
def create(
    jar: str = typer.Option(..., "--jar", help="the uploaded jar's id (headrace run or POST /jars/upload)"),
    cron: Optional[str] = typer.Option(None, "--cron", help="5-field cron expression in UTC, e.g. '*/5 * * * *'"),
    every: Optional[int] = typer.Option(None, "--every", help="instead of --cron: every N seconds"),
    name: Optional[str] = typer.Option(None, "--name", help="schedule and job name (default: the jar's)"),
    entry: Optional[str] = typer.Option(None, "--entry", help="entry function (default build)"),
    parallelism: Optional[int] = typer.Option(None, "-p", "--parallelism"),
    overlap: str = typer.Option("skip", "--overlap", help="previous run still going: skip, queue or cancel_previous"),
    misfire_grace: Optional[int] = typer.Option(
        None, "--misfire-grace", help="seconds a missed tick may still run after (default 60)"
    ),
    kind: Optional[str] = typer.Option(None, "--kind", help="pyspark (default) or noop"),
    paused: bool = typer.Option(False, "--paused", help="create it paused"),
    args: Optional[List[str]] = typer.Argument(None, help="program arguments, after --"),
    url: Optional[str] = URL,
) -> None:
    """Create a schedule; prints its id."""
    if (cron is None) == (every is None):
        fail("give exactly one of --cron EXPR and --every SECONDS", 2)
    if every is not None and every < 1:
        fail("--every must be at least 1 second", 2)
    if overlap not in OVERLAPS:
        fail(f"--overlap must be one of {', '.join(OVERLAPS)}, got {overlap!r}", 2)
    if parallelism is not None and parallelism < 1:
        fail("-p/--parallelism must be at least 1", 2)
    body: dict = {"jarId": jar, "overlap": overlap, "enabled": not paused}
    for key, value in (
        ("cron", cron),
        ("everySeconds", every),
        ("name", name),
        ("entryClass", entry),
        ("parallelism", parallelism),
        ("misfireGraceSeconds", misfire_grace),
        ("kind", kind),
    ):
        if value is not None:
            body[key] = value
    if args:
        body["programArgsList"] = list(args)
    created = _rest(url, "POST", "/jobs/schedules", json=body)
    shown = _rest(url, "GET", f"/jobs/schedules/{created['id']}")
    typer.echo(f"Schedule {created['id']} created ({_timing(shown)}); next run {_when(shown.get('nextFire'))}")


def _timing(s: dict) -> str:
    return f"cron {s['cron']} UTC" if s.get("cron") else f"every {s.get('everySeconds')} s"


@app.command("list")
def list_schedules(url: Optional[str] = URL) -> None:
    """List the schedules: state, timing, next and last run."""
    rows = _rest(url, "GET", "/jobs/schedules")["schedules"]
    if not rows:
        typer.echo("No schedules (create one with: headrace schedule create --jar ID --cron '*/5 * * * *').")
        return
    typer.echo(
        f"{'ID':<32}  {'STATE':<7}  {'WHEN':<24}  {'OVERLAP':<15}  {'NEXT RUN':<23}  {'RUNS':>5}  {'LAST':<16}  NAME"
    )
    for s in rows:
        typer.echo(
            f"{s['id']:<32}  {'active' if s['enabled'] else 'paused':<7}  {_timing(s):<24}  "
            f"{s['overlap']:<15}  {_when(s.get('nextFire')):<23}  {s['runs']:>5}  "
            f"{s.get('lastOutcome') or '-':<16}  {s['name']}"
        )


@app.command()
def show(schedule_id: str = typer.Argument(..., metavar="ID"), url: Optional[str] = URL) -> None:
    """One schedule and its newest ticks (what each became)."""
    s = _rest(url, "GET", f"/jobs/schedules/{schedule_id}")
    typer.echo(
        f"{s['name']} ({s['id']}): {'active' if s['enabled'] else 'paused'}, {_timing(s)}, overlap "
        f"{s['overlap']}, misfire grace {s['misfireGraceSeconds']} s; next run {_when(s.get('nextFire'))}"
    )
    if not s["history"]:
        typer.echo("No ticks yet.")
        return
    for run in s["history"]:
        typer.echo(f"{_when(run['tick'])}  {run['outcome']:<20}  {run.get('jobId') or '-'}")


def _set_enabled(schedule_id: str, enabled: bool, url: Optional[str]) -> dict:
    return _rest(url, "PATCH", f"/jobs/schedules/{schedule_id}", json={"enabled": enabled})


@app.command()
def pause(schedule_id: str = typer.Argument(..., metavar="ID"), url: Optional[str] = URL) -> None:
    """Pause a schedule (a running job of it goes on)."""
    _set_enabled(schedule_id, False, url)
    typer.echo(f"Schedule {schedule_id} paused.")


@app.command()
def resume(schedule_id: str = typer.Argument(..., metavar="ID"), url: Optional[str] = URL) -> None:
    """Resume a schedule from its next tick (ticks that fell while paused do not run)."""
    s = _set_enabled(schedule_id, True, url)
    typer.echo(f"Schedule {schedule_id} resumed; next run {_when(s.get('nextFire'))}.")


@app.command()
def delete(schedule_id: str = typer.Argument(..., metavar="ID"), url: Optional[str] = URL) -> None:
    """Delete a schedule (its past runs and their jobs stay)."""
    _rest(url, "DELETE", f"/jobs/schedules/{schedule_id}")
    typer.echo(f"Schedule {schedule_id} deleted.")
