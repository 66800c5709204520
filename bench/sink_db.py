"""A database for the benchmark pipelines' SQL sinks. Pipelines get no catalog of the cluster
(issue 21): their `ctx.catalog_url` is `pipeline_catalog_url`. Here that is an SQLite file in a
directory of the drivers' OS user, so a driver can write it whether or not it is sandboxed."""

from __future__ import annotations

import os
from pathlib import Path

from shared import untrusted_code

DRIVER_USER = os.environ.get("HEADRACE_DRIVER_USER", "headrace-driver")


def sink_db_url(home: Path) -> str:
    directory = home / "sink-db"
    directory.mkdir(parents=True, exist_ok=True)
    user = untrusted_code.switchable_user(DRIVER_USER) or untrusted_code.switchable_user(None)
    if user is not None:
        user.own(directory)
    return f"sqlite:///{directory / 'sink.db'}"
