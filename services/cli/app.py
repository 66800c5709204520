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

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Headrace: a Flink-style control plane for PySpark pipelines.")

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
