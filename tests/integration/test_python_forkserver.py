"""The driver's Python fork server (services/taskmanager/runtime/python_forkserver.py), as Spark
meets it: a launcher executable started with `-m MODULE`, pipes for its stdio, an exit status
to read, and sometimes a signal or a kill. `json.tool` stands in for Spark's source runner: it
reads stdin, writes stdout, fails with a status on bad input and blocks while stdin is open."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from services.taskmanager.runtime import python_forkserver as fs
from tests.waiting import wait_for

REPO = Path(__file__).resolve().parents[2]
ROUTED = ("json.tool", "probe_mod")


@pytest.fixture
def server(tmp_path):
    sock = str(tmp_path / "fs.sock")
    log = open(tmp_path / "server.log", "w+")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "services.taskmanager.runtime.python_forkserver",
            "--serve",
            sock,
            str(os.getpid()),
            *ROUTED,
        ],
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        stderr=log,
        start_new_session=True,
    )

    def listening() -> bool:
        if os.path.exists(sock):
            return True
        assert proc.poll() is None, "fork server exited"
        return False

    wait_for("the fork server listening", listening, 30, poll_s=0.05)
    launcher = fs.write_launcher(str(tmp_path), sys.executable, sock, ROUTED)
    yield launcher, tmp_path / "server.log", proc
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)


def forked_pids(log: Path) -> list[int]:
    return [int(m) for m in re.findall(r"as pid (\d+)", log.read_text())]


def run(launcher: str, *args: str, stdin: bytes, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [launcher, *args], input=stdin, capture_output=True, cwd=cwd, timeout=30, env=dict(os.environ, **(env or {}))
    )


def test_a_routed_start_is_forked_with_the_callers_stdio_cwd_and_status(server, tmp_path):
    launcher, log, _ = server
    ok = run(launcher, "-m", "json.tool", stdin=b'{"a": [1, 2]}', cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.decode().split() == ["{", '"a":', "[", "1,", "2", "]", "}"]
    bad = run(launcher, "-m", "json.tool", stdin=b"{not json", cwd=tmp_path)
    assert bad.returncode == 1 and b"Expecting property name" in bad.stderr
    assert len(forked_pids(log)) == 2  # both went through the server, not a fresh interpreter


def test_the_child_sees_the_callers_environment_and_working_directory(server, tmp_path):
    launcher, log, _ = server
    work = tmp_path / "elsewhere"
    work.mkdir()
    (work / "probe_mod.py").write_text(
        "import json, os, sys\njson.dump({'cwd': os.getcwd(), 'x': os.environ.get('PROBE_X')}, sys.stdout)\n"
    )
    # probe_mod exists only on the caller's PYTHONPATH, which the server never had.
    out = run(launcher, "-m", "probe_mod", stdin=b"", cwd=work, env={"PROBE_X": "42", "PYTHONPATH": str(work)})
    assert out.returncode == 0, out.stderr
    assert out.stdout == f'{{"cwd": "{work}", "x": "42"}}'.encode()
    assert len(forked_pids(log)) == 1


def test_other_modules_and_plain_scripts_run_on_the_real_interpreter(server, tmp_path):
    launcher, log, _ = server
    out = run(launcher, "-c", "import sys; print(sys.executable)", stdin=b"", cwd=tmp_path)
    assert out.returncode == 0 and out.stdout.decode().strip() == sys.executable
    out = run(launcher, "-m", "json.tool", "--sort-keys", stdin=b'{"b": 1, "a": 2}', cwd=tmp_path)
    assert out.returncode == 0 and out.stdout.decode().index('"a"') < out.stdout.decode().index('"b"')
    assert forked_pids(log) == []  # extra arguments: not a routed start


def test_without_a_server_the_launcher_runs_the_real_interpreter(tmp_path):
    launcher = fs.write_launcher(str(tmp_path), sys.executable, str(tmp_path / "nobody.sock"), ROUTED)
    out = run(launcher, "-m", "json.tool", stdin=b"[1]", cwd=tmp_path)
    assert out.returncode == 0 and out.stdout.split() == [b"[", b"1", b"]"]


def _started_child(launcher: str, log: Path, cwd: Path) -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen(
        [launcher, "-m", "json.tool"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=cwd
    )
    wait_for("a forked child", lambda: forked_pids(log), 20, poll_s=0.05)
    return proc, forked_pids(log)[-1]


def _gone(pid: int, within_s: float) -> bool:
    """Exited (a zombie counts: an orphan's reaper here may be slow or absent)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.05)
    return False


def test_sigterm_to_the_launcher_reaches_the_child(server, tmp_path):
    launcher, log, _ = server
    proc, child = _started_child(launcher, log, tmp_path)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(10) == 128 + signal.SIGTERM
    assert _gone(child, 5)


def test_sigterm_before_the_server_answers_stops_the_launcher_at_once_and_runs_nothing(tmp_path):
    """The window the test above only sometimes hits: the server has the request but has not
    named a child yet. The launcher must not die of the signal (no one would pass it on) nor run
    the module anyway; it gives up the handshake and exits 128 + SIGTERM."""
    import socket

    sock = tmp_path / "mute.sock"
    mute = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    mute.bind(str(sock))
    mute.listen(1)
    mute.settimeout(20)
    launcher = fs.write_launcher(str(tmp_path), sys.executable, str(sock), ROUTED)
    proc = subprocess.Popen(
        [launcher, "-m", "json.tool"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=tmp_path,
    )
    conn, _ = mute.accept()
    conn.settimeout(20)
    assert conn.recv(4)  # its request is arriving: the launcher waits for the answer now
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    proc.stdin.close()
    assert proc.wait(10) == 128 + signal.SIGTERM, proc.stderr.read()
    assert time.monotonic() - t0 < fs.HANDSHAKE_TIMEOUT_S  # at once, not after the handshake timeout
    assert proc.stdout.read() == b""  # json.tool never ran on the real interpreter
    conn.close()
    mute.close()


def test_a_killed_launcher_takes_its_child_with_it(server, tmp_path):
    launcher, log, _ = server
    proc, child = _started_child(launcher, log, tmp_path)
    proc.kill()  # what Spark's destroyForcibly does
    proc.wait(10)
    assert _gone(child, 5), "the child of a killed launcher still runs"


def test_the_server_leaves_when_its_driver_is_gone(tmp_path):
    sock = tmp_path / "fs.sock"
    # The driver: a process that starts the server and exits at once.
    driver = subprocess.run(
        [
            sys.executable,
            "-c",
            "import os, subprocess, sys; p = subprocess.Popen([sys.executable, '-m', "
            "'services.taskmanager.runtime.python_forkserver', '--serve', sys.argv[1], str(os.getpid()), 'json.tool'], "
            "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); print(p.pid)",
            str(sock),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=30,
    )
    server_pid = int(driver.stdout.strip())
    assert _gone(server_pid, 15), "the fork server outlived its driver"


def test_a_silent_connection_holds_up_the_next_launcher_only_until_the_handshake_timeout(server, tmp_path):
    launcher, log, proc = server
    import socket

    silent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    silent.connect(str(tmp_path / "fs.sock"))  # connects, never sends its request
    t0 = time.monotonic()
    out = run(launcher, "-m", "json.tool", stdin=b"[1]", cwd=tmp_path)
    assert out.returncode == 0 and out.stdout.split() == [b"[", b"1", b"]"], out.stderr
    assert time.monotonic() - t0 < fs.HANDSHAKE_TIMEOUT_S + 10
    # Either outcome of the race between the two 5 s timeouts runs the module exactly once: forked,
    # or (the launcher gave up first) on the real interpreter, its forked copy killed.
    assert proc.poll() is None  # the server survived both
    forked = len(forked_pids(log))
    # The silent connection is still open: the server has given up on it and serves the next.
    again = run(launcher, "-m", "json.tool", stdin=b"[2]", cwd=tmp_path)
    assert again.returncode == 0 and len(forked_pids(log)) == forked + 1
    silent.close()


@pytest.mark.parametrize(
    "payload",
    [
        b"[1, 2]",  # JSON, but not a request
        b'{"args": ["-m", "json.tool"], "env": [], "cwd": 3}',  # a request of the wrong types
        b"\xff\xfe not json",
    ],
)
def test_garbage_requests_are_refused_and_the_server_goes_on(server, tmp_path, payload):
    launcher, log, proc = server
    import socket
    import struct

    for head, body in ((struct.pack("!I", len(payload)), payload), (struct.pack("!I", 2**31), b"")):
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.settimeout(10)
        conn.connect(str(tmp_path / "fs.sock"))
        conn.sendall(head + body)  # no stdio fds either
        assert conn.recv(200).startswith(b"refused ")
        conn.close()
    assert proc.poll() is None and forked_pids(log) == []
    ok = run(launcher, "-m", "json.tool", stdin=b"[3]", cwd=tmp_path)
    assert ok.returncode == 0 and len(forked_pids(log)) == 1
