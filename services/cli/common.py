"""What every `headrace` command shares: the one-line failure, the settings, and the REST client
the client verbs (`run`, `list`, `schedule ...`) talk to the dispatcher with."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, NoReturn

import typer
from pydantic import ValidationError

from shared.settings import Settings, load_settings

if TYPE_CHECKING:
    import httpx

URL_HELP = (
    "dispatcher URL (default: dispatcher_host/dispatcher_port of the settings, HEADRACE_CONFIG; "
    "without them the running `headrace up` cluster of HEADRACE_HOME)"
)


def fail(message: str, code: int = 1) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def settings_or_fail(**overrides: object) -> Settings:
    try:
        return load_settings(**overrides)
    except (ValidationError, ValueError) as exc:
        msg = exc.errors()[0]["msg"] if isinstance(exc, ValidationError) else str(exc)
        fail(f"invalid settings: {msg}", 2)


def client(url: str | None) -> httpx.Client:
    """A client of the REST API at `url`, or at the settings' dispatcher address
    (services/cli/client_address.py); with HEADRACE_TOKEN set it sends that bearer token
    (`headrace token create`, docs/runbooks/auth.md)."""
    # Imported here, not at the top: every service process starts through the CLI, and
    # httpx (ssl, httpcore, h11) would cost each ~0.15 s of CPU at cluster start for nothing.
    import httpx

    from services.cli.client_address import dispatcher_url

    token = os.environ.get("HEADRACE_TOKEN")
    return httpx.Client(
        base_url=dispatcher_url(url, settings_or_fail),
        timeout=30,
        headers={"Authorization": f"Bearer {token}"} if token else None,
    )


def call(client: httpx.Client, method: str, path: str, **kw) -> dict:
    import httpx

    try:
        r = client.request(method, path, **kw)
    except httpx.TimeoutException:
        # Reached but slow (a loaded machine, a long restore check): not "is the cluster up?".
        waited = kw.get("timeout", client.timeout.read)
        fail(
            f"the dispatcher at {client.base_url} did not answer {method} {path} within {waited} s; "
            f"what it was asked may still happen: check with headrace list"
        )
    except httpx.HTTPError:
        fail(f"cannot reach the dispatcher at {client.base_url}: is the cluster up? (headrace up)")
    if r.status_code >= 400:
        try:
            errors = r.json().get("errors") or [r.text]
        except ValueError:
            errors = [r.text]
        fail(f"{method} {path} -> {r.status_code}: {'; '.join(map(str, errors))}")
    return r.json() if r.content else {}
