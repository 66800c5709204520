"""`headrace credentials taskmanager ID [--out FILE] [--revoke]`: give one more TaskManager its
own credentials, or take them away (services/cluster/taskmanager_credentials.py).

Run with the control plane's settings (HEADRACE_CONFIG=<run>/config.yaml under `headrace up`):
they hold the admin Redis URL and lead to the cluster secret. The file written holds the
TaskManager's Redis URL (user taskmanager.<id>) and its two derived keys, never the secret.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from pydantic import ValidationError

from services.cli.common import fail

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Credentials of TaskManagers (Redis user and signing keys); see docs/runbooks/auth.md.",
)


@app.command("taskmanager")
def taskmanager(
    taskmanager_id: str = typer.Argument(..., metavar="ID", help="the id it is started with (--id)"),
    out: Optional[Path] = typer.Option(None, "--out", help="config file to write (mode 0600); default ./ID.yaml"),
    revoke: bool = typer.Option(False, "--revoke", help="delete its Redis user and close its connections"),
) -> None:
    """Create TaskManager ID's Redis user and write its config file, or --revoke it."""
    import redis
    import yaml

    from services.cluster import redis_auth
    from services.cluster import taskmanager_credentials as creds
    from shared.cluster_keys import ClusterSecretError
    from shared.message_auth import load_secret
    from shared.settings import load_settings

    try:
        redis_auth.check_taskmanager_id(taskmanager_id)
        settings = load_settings()
    except ValidationError as exc:
        fail(f"invalid settings: {exc.errors()[0]['msg']}", 2)
    except ValueError as exc:
        fail(str(exc), 2)
    admin = redis.Redis.from_url(settings.redis_url, socket_timeout=10, socket_connect_timeout=5)
    where = redis_auth.masked(settings.redis_url)
    try:
        if revoke:
            deleted, not_saved = creds.revoke(admin, taskmanager_id)
            typer.echo(
                f"revoked {redis_auth.taskmanager_user(taskmanager_id)} at {where}; its connections are closed"
                if deleted
                else f"{redis_auth.taskmanager_user(taskmanager_id)} had no user at {where}"
            )
            _say_saved(not_saved)
            return
        try:
            secret = load_secret(settings, create=False)
        except ClusterSecretError as exc:
            fail(str(exc), 2)
        if secret is None:
            fail(
                f"no cluster secret: set HEADRACE_CLUSTER_SECRET, or run this with the control plane's settings "
                f"(HEADRACE_CONFIG=<run>/config.yaml) where {settings.home}/secrets/cluster-secret is readable",
                2,
            )
        not_saved = creds.grant(admin, secret, taskmanager_id)
    except redis.exceptions.NoPermissionError:
        fail(
            f"the Redis user of HEADRACE_REDIS_URL ({where}) may not manage ACL users: use the admin (default) "
            f"user's URL, e.g. HEADRACE_CONFIG=<run>/config.yaml of headrace up"
        )
    except redis.exceptions.AuthenticationError as exc:
        fail(f"Redis at {where} refused the login ({exc}): use the admin (default) user's URL")
    except redis.exceptions.RedisError as exc:
        fail(f"Redis at {where}: {exc}")
    finally:
        admin.close()
    url = redis_auth.url_for(
        settings.redis_url,
        redis_auth.taskmanager_user(taskmanager_id),
        creds.passwords(secret, [taskmanager_id])[taskmanager_id],
    )
    config = creds.taskmanager_config(settings.model_dump(mode="json"), taskmanager_id, url, secret)
    path = out or Path(f"{taskmanager_id}.yaml")
    try:
        redis_auth.write_private(path, yaml.safe_dump(config))
    except OSError as exc:
        fail(f"cannot write {path}: {exc}")
    typer.echo(f"created Redis user {redis_auth.taskmanager_user(taskmanager_id)} at {where}")
    _say_saved(not_saved)
    typer.echo(
        f"wrote {path} (mode 0600; its Redis password and keys, not the cluster secret); start it with:\n"
        f"  HEADRACE_CONFIG={path} headrace taskmanager --id {taskmanager_id}"
    )


def _say_saved(not_saved: str | None) -> None:
    if not_saved:
        typer.echo(
            f"warning: {not_saved}: the change lasts until this Redis restarts (give it a writable --aclfile, "
            f"or in the compose stack use headrace redis-auth deploy)",
            err=True,
        )
