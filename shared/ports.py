"""A free TCP port for a server this process is about to start (a local cluster's Redis,
ZooKeeper, Spark master, dispatcher; a test's throwaway servers).

The port is chosen below the kernel's ephemeral range. A port the kernel hands out for `bind(0)`
comes from that range, and so does the local port of every outgoing connection: between choosing
such a port and the server binding it, any client on the machine (a JDBC pool, a Spark executor)
could take it for a connection and the server would fail with "address already in use". Below
the range only servers that bind explicitly compete, and the random pick makes two of them
choosing the same port unlikely; a port found bound is skipped.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

LOWEST = 10000
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
DEFAULT_EPHEMERAL_START = 32768  # Linux's default, where the file cannot be read
ATTEMPTS = 200


def ephemeral_start() -> int:
    try:
        return int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return DEFAULT_EPHEMERAL_START


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing is bound to on `host` now, outside the ephemeral range where possible."""
    top = ephemeral_start() - 1
    if top > LOWEST:
        for _ in range(ATTEMPTS):
            port = random.randint(LOWEST, top)
            if _bindable(host, port):
                return port
    with socket.socket() as s:  # a machine whose ephemeral range leaves no room below it
        s.bind((host, 0))
        return s.getsockname()[1]


def _bindable(host: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True
