"""`headrace jars fetch|check|classpath|dir`: the jars Headrace takes from Maven Central
(shared/jars.py, shared/jar_sets.toml). scripts/bootstrap runs `fetch`; nothing else ever
reaches Maven: a cluster whose jars are missing says so at `headrace up`."""

from __future__ import annotations

import subprocess
from typing import Optional

import typer

from services.cli.common import fail, settings_or_fail

app = typer.Typer(no_args_is_help=True, help="The jars from Maven Central (Kafka, Delta Lake, the Kafka broker).")


def _cache():
    from shared.jars import JarCache

    return JarCache(settings_or_fail().jar_cache_dir)


@app.command()
def fetch(names: Optional[list[str]] = typer.Argument(None, help="sets to fetch (default: every set)")) -> None:
    """Copy the sets' jars from Maven Central into the cache, unless they are there."""
    from shared.jars import MissingJars

    cache = _cache()
    for name in names or list(cache.sets):
        try:
            if not cache.is_complete(name):
                typer.echo(f"jars: {name} ready in {cache.fetch(name, echo=typer.echo)}")
        except MissingJars as exc:
            fail(f"jars: {exc}")
    from shared import local_fs_jar

    try:
        typer.echo(f"jars: Headrace's local file system ready in {local_fs_jar.ensure(cache.root)}")
    except (local_fs_jar.LocalFsJarError, OSError, subprocess.SubprocessError) as exc:
        # Sessions keep Hadoop's own local file system (a process per file written): slower, not wrong.
        typer.echo(f"jars: warning: Headrace's local file system was not built ({exc})", err=True)


@app.command()
def check() -> None:
    """Exit 1, with one line per set, unless every set is in the cache and fits this PySpark."""
    problems = _cache().missing()
    for line in problems:
        typer.echo(f"jars: {line}", err=True)
    if problems:
        raise typer.Exit(1)


@app.command()
def classpath(name: str = typer.Argument(..., help="a set, e.g. kafka-broker")) -> None:
    """The set's jars, ':'-separated."""
    from shared.jars import MissingJars

    try:
        typer.echo(":".join(str(j) for j in _cache().jars(name)))
    except MissingJars as exc:
        fail(f"jars: {exc}")


@app.command("dir")
def directory(name: str = typer.Argument(..., help="a set, e.g. kafka-broker")) -> None:
    """The set's directory in the cache."""
    from shared.jars import MissingJars

    cache = _cache()
    try:
        cache.jars(name)
    except MissingJars as exc:
        fail(f"jars: {exc}")
    typer.echo(str(cache.directory(name)))
