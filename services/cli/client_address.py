"""Which dispatcher the client verbs (`headrace run`, `list`, `cancel`, ...) talk to.

`-m/--jobmanager` wins, as with Flink's CLI (`http://host:port` or plain `host:port`). Without it,
the settings say: `dispatcher_host`/`dispatcher_port` from HEADRACE_DISPATCHER_HOST/_PORT or the
file named by HEADRACE_CONFIG (which `headrace up` writes), so `headrace list` finds a cluster on a
non-default port. A wildcard listen address (0.0.0.0, ::) is reached through loopback.
"""

from __future__ import annotations

from typing import Callable

from shared.settings import Settings

WILDCARDS = {"0.0.0.0", "::", "", "[::]"}


def dispatcher_url(explicit: str | None, settings: Callable[[], Settings]) -> str:
    """The dispatcher's base URL. `settings` is called only when `explicit` is None, so a
    broken settings file does not stand in the way of an explicit -m."""
    if explicit:
        url = explicit.strip().rstrip("/")
        return url if "://" in url else f"http://{url}"
    loaded = settings()
    host = loaded.dispatcher_host.strip()
    if host in WILDCARDS:
        host = "127.0.0.1"
    elif ":" in host and not host.startswith("["):
        host = f"[{host}]"  # an IPv6 literal
    return f"http://{host}:{loaded.dispatcher_port}"
