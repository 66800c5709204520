"""shared/ports.py: servers' ports come from below the ephemeral range, and a bound one is skipped."""

from __future__ import annotations

import socket

from shared import ports


def test_a_free_port_is_below_the_ephemeral_range_and_bindable():
    for _ in range(20):
        port = ports.free_port()
        assert ports.LOWEST <= port < ports.ephemeral_start()
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_a_port_something_listens_on_is_skipped(monkeypatch):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", ports.free_port()))
        taken.listen()
        busy = taken.getsockname()[1]
        picks = iter([busy, busy, busy + 1 if busy + 1 < ports.ephemeral_start() else busy - 1])
        monkeypatch.setattr(ports.random, "randint", lambda lo, hi: next(picks))
        assert ports.free_port() != busy


def test_without_room_below_the_range_the_kernel_chooses(monkeypatch):
    monkeypatch.setattr(ports, "ephemeral_start", lambda: ports.LOWEST)
    port = ports.free_port()
    assert port > 0
