"""Which dispatcher the client verbs (`headrace run`, `list`, `cancel`, ...) talk to.

`-m/--jobmanager` wins, as with Flink's CLI (`http://host:port` or plain `host:port`). Without it,
the settings say: `dispatcher_host`/`dispatcher_port` from HEADRACE_DISPATCHER_HOST/_PORT or the
file named by HEADRACE_CONFIG (which `headrace up` writes). When neither sets the address, the
newest `headrace up` cluster still running under the settings' home (HEADRACE_HOME) is used: its
run directory holds the dispatcher's pid (cluster.json) and address (config.yaml), so
`headrace list` in another shell finds a cluster started with `--port`. Otherwise the default
port. A wildcard listen address (0.0.0.0, ::) is reached through loopback.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable

import yaml

from shared.settings import Settings

WILDCARDS = {"0.0.0.0", "::", "", "[::]"}
ADDRESS_FIELDS = {"dispatcher_host", "dispatcher_port"}


def dispatcher_url(explicit: str | None, settings: Callable[[], Settings]) -> str:
    """The dispatcher's base URL. `settings` is called only when `explicit` is None, so a
    broken settings file does not stand in the way of an explicit -m."""
    if explicit:
        url = explicit.strip().rstrip("/")
        return url if "://" in url else f"http://{url}"
    loaded = settings()
    if not ADDRESS_FIELDS & loaded.model_fields_set:
        running = running_cluster_address(loaded.home)
        if running is not None:
            return base_url(*running)
    return base_url(loaded.dispatcher_host, loaded.dispatcher_port)


def base_url(host: str, port: int) -> str:
    host = host.strip()
    if host in WILDCARDS:
        host = "127.0.0.1"
    elif ":" in host and not host.startswith("["):
        host = f"[{host}]"  # an IPv6 literal
    return f"http://{host}:{port}"


def running_cluster_address(home: Path) -> tuple[str, int] | None:
    """(host, port) of the dispatcher of the newest `headrace up` run under `home` whose dispatcher
    process is alive (services/cluster/local_cluster.py writes both files), or None."""
    config = running_cluster_config(home)
    if config is None:
        return None
    try:
        return str(config.get("dispatcher_host", "127.0.0.1")), int(config.get("dispatcher_port", 8081))
    except (ValueError, TypeError):
        return None


def running_cluster_config(home: Path) -> dict | None:
    """The settings (config.yaml) of the newest `headrace up` run under `home` whose dispatcher
    process is alive, or None: e.g. its Kafka broker's address for `headrace kafka`."""
    for run_dir in sorted((home / "runs").glob("*/"), reverse=True):
        try:
            pid = json.loads((run_dir / "cluster.json").read_text())["processes"]["dispatcher"]
            if not _is_dispatcher(int(pid)):
                continue
            config = yaml.safe_load((run_dir / "config.yaml").read_text())
            if isinstance(config, dict):
                return config
        except (OSError, ValueError, KeyError, TypeError, AttributeError, yaml.YAMLError):
            continue  # a run being written or removed, or another user's: not this shell's cluster
    return None


def _is_dispatcher(pid: int) -> bool:
    """Alive and, where /proc tells, a dispatcher: a run directory outlives its processes, and
    after a reboot its pid may belong to anything."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return False  # another user's process: not this cluster's dispatcher
    cmdline = Path(f"/proc/{pid}/cmdline")
    if not cmdline.parent.is_dir():
        return True
    try:
        return b"dispatcher" in cmdline.read_bytes()
    except OSError:
        return False
