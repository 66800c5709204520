"""Hosts of their own for tests: Linux network namespaces joined to this machine by veth pairs.

Each `NetnsHost` has one address (10.231.<n>.2) and reaches this machine at 10.231.<n>.1; the
services a test runs on this machine listen on that address (or on every address) for it.
`cut()` takes the link down (a network partition: packets vanish, no resets), `heal()` brings it
back. Needs root (CAP_NET_ADMIN); `netns_unavailable()` says why not where it is not permitted, so
tests can skip with that message. Names carry this process's pid: parallel runs do not collide,
and `cleanup_stale()` removes what a killed run left."""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import threading
from pathlib import Path

SUBNET = "10.231"
LOCK_FILE = "/tmp/headrace-netns.lock"


def _free_octet() -> int:
    """The first 10.231.<n>.0/24 that no interface of this machine has an address in."""
    used = set(re.findall(rf"inet {re.escape(SUBNET)}\.(\d+)\.", _ip("-o", "addr", "show", check=False).stdout))
    for n in range(1, 255):
        if str(n) not in used:
            return n
    raise RuntimeError(f"no free /24 left in {SUBNET}.0.0/16 (stale test links? tests/netns.py cleanup_stale)")


_PREFIX = "hrt"
_used = set()
_used_lock = threading.Lock()


def _ip(*args: str, netns: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    cmd = ["ip", *(("netns", "exec", netns, "ip") if netns else ()), *args]
    return subprocess.run(cmd, capture_output=True, text=True, check=check, timeout=10)


def netns_unavailable() -> str | None:
    """None if namespaces and veth pairs can be made here, else the reason."""
    if shutil.which("ip") is None:
        return "the `ip` command (Debian iproute2) is missing"
    if os.geteuid() != 0:
        return "network namespaces need root (CAP_NET_ADMIN)"
    probe = f"{_PREFIX}probe{os.getpid()}"
    try:
        _ip("netns", "add", probe)
    except subprocess.CalledProcessError as exc:
        return f"`ip netns add` is not permitted here: {exc.stderr.strip()}"
    finally:
        _ip("netns", "del", probe, check=False)
    return None


def cleanup_stale() -> None:
    """Namespaces and links of test runs whose process is gone."""
    listed = _ip("netns", "list", check=False).stdout
    for name in re.findall(rf"^({_PREFIX}(\d+)n\d+)", listed, flags=re.M):
        full, pid = name
        if not Path(f"/proc/{pid}").exists():
            _ip("netns", "del", full, check=False)
    links = _ip("-o", "link", "show", check=False).stdout
    for full, pid in re.findall(rf"\d+: ({_PREFIX}(\d+)h\d+)@", links):
        if not Path(f"/proc/{pid}").exists():
            _ip("link", "del", full, check=False)


class NetnsHost:
    """One namespace with one veth link to this machine."""

    def __init__(self, index: int):
        if not 1 <= index <= 250:
            raise ValueError("index must be 1..250")
        with _used_lock:
            if index in _used:
                raise ValueError(f"netns host {index} exists already in this process")
            _used.add(index)
        self.index = index
        pid = os.getpid()
        self.name = f"{_PREFIX}{pid}n{index}"
        # Interface names: at most 15 characters.
        self.host_if, self.ns_if = f"{_PREFIX}{pid}h{index}"[:15], f"{_PREFIX}{pid}v{index}"[:15]
        self.gateway = self.address = ""  # chosen by create(): a /24 no other run uses
        self._created = False

    def create(self) -> "NetnsHost":
        # Test runs on one machine (CI, a developer's second run) must not share a subnet: two
        # links with one address would route each other's packets. The choice and the address
        # assignment happen under one machine-wide lock.
        with open(LOCK_FILE, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            octet = _free_octet()
            self.gateway, self.address = f"{SUBNET}.{octet}.1", f"{SUBNET}.{octet}.2"
            _ip("netns", "add", self.name)
            self._created = True
            self._link()
        return self

    def _link(self) -> None:
        _ip("link", "add", self.host_if, "type", "veth", "peer", "name", self.ns_if)
        _ip("link", "set", self.ns_if, "netns", self.name)
        _ip("addr", "add", f"{self.gateway}/24", "dev", self.host_if)
        _ip("link", "set", self.host_if, "up")
        _ip("addr", "add", f"{self.address}/24", "dev", self.ns_if, netns=self.name)
        _ip("link", "set", self.ns_if, "up", netns=self.name)
        _ip("link", "set", "lo", "up", netns=self.name)
        _ip("route", "add", "default", "via", self.gateway, netns=self.name)

    def popen(self, cmd: list[str], **kw) -> subprocess.Popen:
        """A process on this host (in its namespace; same filesystem, same user)."""
        return subprocess.Popen(["ip", "netns", "exec", self.name, *cmd], **kw)

    def run(self, cmd: list[str], **kw) -> subprocess.CompletedProcess:
        return subprocess.run(["ip", "netns", "exec", self.name, *cmd], **kw)

    def cut(self) -> None:
        """This machine's end of the link goes down: from now on packets between the two vanish
        (no resets, no 'unreachable' errors: both sides only see silence, as in a real partition)."""
        _ip("link", "set", self.host_if, "down")

    def heal(self) -> None:
        _ip("link", "set", self.host_if, "up")

    def block(self, port: int) -> None:
        """Cut this host off one service of this machine (gateway:port) only, silently both ways,
        leaving its other connections up (iptables inside the namespace)."""
        for rule in self._rules(port):
            self._iptables("-A", *rule)

    def unblock(self, port: int) -> None:
        for rule in self._rules(port):
            self._iptables("-D", *rule)

    def _rules(self, port: int) -> list[tuple[str, ...]]:
        return [
            ("OUTPUT", "-p", "tcp", "-d", self.gateway, "--dport", str(port), "-j", "DROP"),
            ("INPUT", "-p", "tcp", "-s", self.gateway, "--sport", str(port), "-j", "DROP"),
        ]

    def _iptables(self, *args: str) -> None:
        subprocess.run(
            ["ip", "netns", "exec", self.name, "iptables", *args],
            check=True,
            capture_output=True,
            text=True,
            timeout=10,
        )

    def pids(self) -> list[int]:
        out = _ip("netns", "pids", self.name, check=False).stdout.split()
        return [int(p) for p in out if p.isdigit()]

    def remove(self) -> None:
        """Kill whatever still runs inside, then the link and the namespace."""
        if self._created:
            for pid in self.pids():
                try:
                    os.kill(pid, 9)
                except ProcessLookupError:
                    pass
            _ip("link", "del", self.host_if, check=False)
            _ip("netns", "del", self.name, check=False)
            self._created = False
        with _used_lock:
            _used.discard(self.index)
