"""`headrace token create|list|revoke`: the REST API's bearer tokens, kept in the cluster's
catalog (found from HEADRACE_CONFIG / HEADRACE_* like every other command).

The catalog (SQLAlchemy, Alembic) is imported only when a token command runs, so other commands
do not pay for it.
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Optional

import typer
from pydantic import ValidationError

from services.cli.common import fail
from shared.settings import load_settings

ROLES = ("viewer", "operator", "admin")  # shared.catalog.tokens.ROLES, without importing the catalog

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Bearer tokens for the REST API (roles: viewer, operator, admin); see docs/runbooks/auth.md.",
)


@contextlib.contextmanager
def _session() -> Iterator:
    from sqlalchemy import exc as sa_exc

    from shared.catalog import Catalog, tokens

    try:
        settings = load_settings()
    except (ValidationError, ValueError) as exc:
        msg = exc.errors()[0]["msg"] if isinstance(exc, ValidationError) else str(exc)
        fail(f"invalid settings: {msg}", 2)
    catalog = Catalog(settings.catalog)
    where = catalog.url.split("@")[-1]  # never the credentials
    try:
        # The tokens table may be newer than the catalog; migrating is what every service does.
        catalog.migrate()
        with catalog.session() as s:
            yield s
    except tokens.TokenError as exc:
        fail(str(exc), 2)
    except sa_exc.SQLAlchemyError as exc:
        first = str(getattr(exc, "orig", None) or exc).strip().splitlines()
        fail(
            f"the catalog ({where}) cannot be used: {first[0] if first else type(exc).__name__} "
            f"(is HEADRACE_CONFIG pointing at the cluster's settings?)"
        )
    finally:
        catalog.dispose()


def _when(dt) -> str:
    return dt.strftime("%Y-%m-%d %H:%M:%S UTC") if dt else "-"


@app.command()
def create(
    role: str = typer.Option(
        ...,
        "--role",
        "-r",
        help="viewer (reads), operator (run, cancel, stop, savepoints), admin (uploads, deletions, disposal, settings)",
    ),
    name: Optional[str] = typer.Option(None, "--name", "-n", help="who or what uses it (default: ROLE-ID)"),
) -> None:
    """Create a token and print it (the last word of the output; it is not stored, only its hash)."""
    from shared.catalog import tokens

    role = role.strip().lower()
    if role not in ROLES:
        fail(f"--role must be one of {', '.join(ROLES)}, got {role!r}", 2)
    with _session() as s:
        info, token = tokens.create(s, role, name)
    typer.echo(
        f"created token {info.id} ({info.name}, role {info.role}); it is shown only this once, "
        f"send it as 'Authorization: Bearer <token>':"
    )
    typer.echo(token)


@app.command("list")
def list_tokens() -> None:
    """List the tokens (ids, names, roles, state; never the secrets)."""
    from shared.catalog import tokens

    with _session() as s:
        rows = tokens.list_all(s)
    if not rows:
        typer.echo("no tokens (create one with: headrace token create --role viewer|operator|admin)")
        return
    typer.echo(f"{'ID':<10} {'ROLE':<9} {'CREATED':<24} {'STATE':<32} NAME")
    for t in rows:
        state = f"revoked {_when(t.revoked_at)}" if t.revoked_at else "active"
        typer.echo(f"{t.id:<10} {t.role:<9} {_when(t.created_at):<24} {state:<32} {t.name}")


@app.command()
def revoke(token_id: str = typer.Argument(..., metavar="ID", help="the id shown by `headrace token list`")) -> None:
    """Revoke a token: requests with it are refused from now on."""
    from shared.catalog import tokens

    with _session() as s:
        was_revoked = any(t.id == token_id and t.revoked_at for t in tokens.list_all(s))
        info = tokens.revoke(s, token_id)
    typer.echo(
        f"token {info.id} ({info.name}, role {info.role}) " + ("was already revoked" if was_revoked else "revoked")
    )
