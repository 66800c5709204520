"""Whether the REST API needs tokens (the setting `auth`, HEADRACE_AUTH), and the line that says
so at start-up. Apart from guards/auth.py, which checks the tokens, so that `headrace up` can print the
line without importing the web framework (docs/runbooks/auth.md)."""

from __future__ import annotations

import ipaddress
from typing import Any


def is_loopback(host: str) -> bool:
    host = host.strip().strip("[]").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def auth_required(settings: Any) -> bool:
    mode = getattr(settings, "auth", None)
    if mode is not None:
        return mode == "required"
    return not is_loopback(getattr(settings, "dispatcher_host", "127.0.0.1"))


def describe_mode(settings: Any) -> str:
    """One line for the start-up log: whether tokens are needed and why."""
    host = getattr(settings, "dispatcher_host", "127.0.0.1")
    explicit = getattr(settings, "auth", None) is not None
    if auth_required(settings):
        why = "auth=required" if explicit else f"dispatcher_host {host} is not a loopback address"
        return (
            f"authentication required ({why}): every API call needs 'Authorization: Bearer <token>' "
            f"(headrace token create --role viewer|operator|admin)"
        )
    why = "auth=off" if explicit else f"dispatcher_host {host} is loopback only"
    return (
        f"authentication OFF ({why}): anyone who can reach the port may run, cancel and upload; "
        f"set HEADRACE_AUTH=required to require tokens"
    )
