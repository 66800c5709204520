"""`headrace`: one command in front of every service and verb.

This module only assembles: the commands live in one module per kind (service_commands: one
service in the foreground; cluster_commands: `up`, `redis-auth`, `demo`; job_commands: the client
verbs) and the groups in their own (tokens, schedule, deploy, credentials, kafka); none of them imports
this one.
User mistakes end with a one-line message and exit code 1 or 2, never a traceback.
"""

from __future__ import annotations

import sys

import typer

from services.cli import (
    cluster_commands,
    credentials,
    deploy,
    jars,
    job_commands,
    kafka_commands,
    schedule,
    service_commands,
    tokens,
)

# Click's own help layout (rich_markup_mode=None): rich's tables cut long option names
# (`--allow-non-restored-stat…`) to fit 80 columns; click wraps the help text instead and never
# shortens a name.
app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    help="Headrace: a Flink-style control plane for PySpark pipelines.",
)


def package_version() -> str:
    """The installed package's version (pyproject.toml's, in a checkout installed with pip -e)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("headrace")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown (not installed: pip install -e .)"


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"headrace {package_version()}")
        raise typer.Exit()


@app.callback()
def _options(
    version: bool = typer.Option(
        False, "--version", is_eager=True, callback=_print_version, help="print Headrace's version and exit"
    ),
) -> None:
    """Headrace: a Flink-style control plane for PySpark pipelines."""


for _module in (service_commands, cluster_commands, job_commands):
    app.add_typer(_module.commands)
app.add_typer(tokens.app, name="token")
app.add_typer(schedule.app, name="schedule")
app.add_typer(deploy.app, name="deploy")
app.add_typer(credentials.app, name="credentials")
app.add_typer(jars.app, name="jars")
app.add_typer(kafka_commands.app, name="kafka")


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)
