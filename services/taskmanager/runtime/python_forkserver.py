"""Start Spark's one-shot Python processes by forking a process that has PySpark imported already.

Spark starts a brand-new Python process for each streaming query whose source is a Python data
source (`python -m pyspark.sql.streaming.python_streaming_source_runner`, PythonWorkerFactory's
"simple worker", not forked from the daemon): an interpreter start and the imports of PySpark,
PyArrow and our connectors, ~0.55 s on a quiet core and most of a second on a busy one, on the
path of every task's first micro-batch (docs/benchmarks.md, "Submission to first result"). A
warm driver runs a fork server that has all of that imported; Spark's Python executable is a
small launcher that hands such a start to the server, which forks a child that runs the module
with the launcher's stdin/stdout/stderr, environment, working directory and arguments.

Spark's worker daemons go the same way (`python -m pyspark.daemon WORKER_MODULE`, one per worker
module: pyspark.worker and the data source planner's pyspark.sql.worker.*, four per driver as its
warm-up starts them). Each started cold imports PySpark, and each worker it forks imports its
worker module after the fork; forked from the server, both are already in memory. On 2 cores that
was ~7 of a warm driver's ~30 CPU-s of start-up (docs/benchmarks.md, "Cluster start").

Three parts, one file (the launcher runs with `python -S` and may import the standard library
only; everything heavy is imported inside `serve`):

- `write_launcher(dir, python, socket)`: the executable Spark gets as PYSPARK_PYTHON. Anything
  but a module in ROUTED goes straight to the real interpreter (`exec`).
- `client(args)`: the launcher's side. Connects, sends the request and its fds 0-2
  (SCM_RIGHTS), forwards SIGTERM/SIGINT/SIGHUP to the child, and exits with the child's status.
  No server, or a refused request: it execs the real interpreter, exactly what Spark would
  have run. Such a signal before the server named the child: it runs nothing and exits 128+sig.
- `serve(socket, driver_pid)`: the server. Single-threaded; forks a child per request; reports each child's
  exit status to its launcher; kills the child (SIGKILL) when its launcher goes away (Spark
  destroyed it); exits when its parent (the driver) is gone.

Only for a local engine: executors on other hosts start their Python with the same
PYSPARK_PYTHON, and the launcher's path exists only here (runner.build_spark decides).
"""

from __future__ import annotations

import array
import json
import os
import re
import signal
import socket
import struct
import sys

SOCKET_ENV = "HEADRACE_FORKSERVER_SOCKET"
# How long either side waits for the other's request or answer before giving up on it: the server
# is single-threaded (a silent connection would hold up every launcher behind it), and a launcher
# that gets no answer starts the real interpreter instead.
HANDSHAKE_TIMEOUT_S = 5.0
MAX_REQUEST_BYTES = 16 * 1024 * 1024  # arguments, environment and directory of one start
REAL_PYTHON_ENV = "HEADRACE_FORKSERVER_PYTHON"
DAEMON = "pyspark.daemon"
# Processes worth forking: the source runner starts per query, on a task's path to its first
# batch; the daemons start with every driver.
ROUTED = ("pyspark.sql.streaming.python_streaming_source_runner", DAEMON)
# The one argument a routed module may take: the daemon's worker module (PySpark's own only).
_WORKER_MODULE = re.compile(r"pyspark(\.[A-Za-z_][A-Za-z0-9_]*)+\Z")
_LEN = struct.Struct("!I")


# ------------------------------------------------------------------------------ driver side


def start(directory: str, routed: tuple[str, ...] = ROUTED) -> tuple[str, object]:
    """Start a fork server for this driver and write its launcher; returns the launcher's path
    (the driver's PYSPARK_PYTHON) and the server's Popen. Until the server listens, and if it
    dies, the launcher runs the real interpreter: nothing waits for it."""
    import subprocess

    os.makedirs(directory, exist_ok=True)
    # AF_UNIX paths are limited to ~107 bytes: keep the name short, the directory is the driver's.
    path = os.path.join(directory, "fs.sock")
    if len(path.encode()) > 100:
        import tempfile

        # Not TMPDIR: a driver's TMPDIR is its own work directory, as long as `directory`.
        short = "/tmp" if os.path.isdir("/tmp") else None
        path = os.path.join(tempfile.mkdtemp(prefix="hr-fs-", dir=short), "fs.sock")
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "services.taskmanager.runtime.python_forkserver",
            "--serve",
            path,
            str(os.getpid()),
            *routed,
        ],
        stdin=subprocess.DEVNULL,
    )
    return write_launcher(directory, sys.executable, path, routed), server


# ------------------------------------------------------------------------------ launcher


def write_launcher(directory: str, python: str, socket_path: str, routed: tuple[str, ...] = ROUTED) -> str:
    """The PYSPARK_PYTHON of a warm driver. A shell script, so that a start that is not routed
    costs one `exec` (~1 ms), not a second interpreter."""
    path = os.path.join(directory, "python-launcher")
    routed_pattern = "|".join(routed)
    script = (
        "#!/bin/sh\n"
        "# Written by services/taskmanager/runtime/python_forkserver.py: Spark's Python executable.\n"
        f'if [ "$1" = "-m" ]; then case "$2" in {routed_pattern})\n'
        f"  {REAL_PYTHON_ENV}={_sh(python)} {SOCKET_ENV}={_sh(socket_path)} "
        f'exec {_sh(python)} -S -E {_sh(os.path.abspath(__file__))} "$@";;\n'
        "esac; fi\n"
        f'exec {_sh(python)} "$@"\n'
    )
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(script)
    os.chmod(tmp, 0o755)
    os.replace(tmp, path)
    return path


def _sh(value: str) -> str:
    return "'" + value.replace("'", "'\\''") + "'"


class _StoppedBeforeStart(OSError):
    """A stop signal came before the server named the child: give up the handshake."""


def client(args: list[str]) -> None:
    python = os.environ.pop(REAL_PYTHON_ENV, sys.executable)
    path = os.environ.pop(SOCKET_ENV, "")
    # Spark may stop the query (SIGTERM) while the server is still forking. A signal before the
    # child's pid is known ends the handshake (closing the connection makes the server kill what
    # it forked) and this launcher exits as if killed by it; after, it is passed to the child.
    child: list[int] = []
    held: list[int] = []

    def forward(signum, _frame):
        if not child:
            held.append(signum)
            raise _StoppedBeforeStart(f"signal {signum} before the child started")
        try:
            os.kill(child[0], signum)
        except ProcessLookupError:
            pass

    try:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, forward)
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.settimeout(HANDSHAKE_TIMEOUT_S)
        conn.connect(path)
        request = json.dumps({"args": args, "env": dict(os.environ), "cwd": os.getcwd()}).encode()
        conn.sendmsg(
            [_LEN.pack(len(request)) + request], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [0, 1, 2]))]
        )
        reply = _read_line(conn)
        if not reply.startswith(b"pid "):
            raise OSError(f"fork server refused: {reply[:200]!r}")
        child.append(int(reply.split()[1]))
    except (OSError, ValueError):
        if held:
            sys.exit(128 + held[0])  # told to stop before anything ran: nothing to start
        # No server, a refusal or no answer in time (closing the connection makes the server
        # kill a child it may have forked meanwhile): what Spark would have run. Never returns;
        # exec resets the handlers to the defaults.
        os.execv(python, [python, *args])
    conn.settimeout(None)  # the child's exit status comes when the query ends
    status = _read_line(conn)
    sys.exit(int(status.split()[1]) if status.startswith(b"exit ") else 1)


def _read_line(conn: socket.socket) -> bytes:
    data = b""
    while not data.endswith(b"\n"):
        try:
            chunk = conn.recv(64)
        except InterruptedError:
            continue
        if not chunk:
            break
        data += chunk
    return data.strip()


# ------------------------------------------------------------------------------ server


def preload() -> None:
    """What a routed process would import first: PySpark's source runner, the daemon and the
    worker modules its workers import after each fork, Arrow, our connectors (the data sources
    they unpickle live there)."""
    import pyarrow  # noqa: F401
    import pyspark.daemon
    import pyspark.sql.streaming.python_streaming_source_runner
    import pyspark.sql.worker.create_data_source
    import pyspark.sql.worker.lookup_data_sources
    import pyspark.sql.worker.plan_data_source_read
    import pyspark.worker  # noqa: F401

    import services.taskmanager.runtime.connectors  # noqa: F401
    from services.taskmanager.runtime.connectors import datagen, files, redis_streams  # noqa: F401


def serve(path: str, parent: int, routed: tuple[str, ...] = ROUTED) -> None:
    """`parent`: the driver's pid, given by the driver (it may be gone before this process has
    even imported its package)."""
    import selectors

    preload()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    if os.path.exists(path):
        os.unlink(path)
    listener.bind(path + ".tmp")
    os.chmod(path + ".tmp", 0o600)  # a connection can choose what the child imports: owner only
    os.replace(path + ".tmp", path)  # launchers see a socket that listens, or none
    listener.listen(64)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ, "accept")
    sel.register(wake_r, selectors.EVENT_READ, "wake")
    children: dict[int, socket.socket] = {}  # child pid -> its launcher's connection
    while os.getppid() == parent:
        for key, _ in sel.select(timeout=1.0):
            if key.data == "accept":
                conn, _ = listener.accept()
                pid = _spawn(conn, listener, children, routed)
                if pid is not None:
                    children[pid] = conn
                    sel.register(conn, selectors.EVENT_READ, pid)
            elif key.data == "wake":
                os.read(wake_r, 4096)
            else:  # a launcher's connection: readable only when it went away
                sel.unregister(key.fileobj)
                _kill(key.data)
        _reap(children, sel)
    for pid in list(children):
        _kill(pid)


def _spawn(conn: socket.socket, listener: socket.socket, children: dict, routed: tuple[str, ...]) -> int | None:
    fds: list[int] = []
    try:
        conn.settimeout(HANDSHAKE_TIMEOUT_S)
        head, fds, _flags, _addr = _recv_fds(conn, _LEN.size, 3)
        (size,) = _LEN.unpack(head)
        if size > MAX_REQUEST_BYTES:
            raise ValueError(f"request of {size} bytes (at most {MAX_REQUEST_BYTES})")
        body = b""
        while len(body) < size:
            chunk = conn.recv(size - len(body))
            if not chunk:
                raise OSError("launcher went away")
            body += chunk
        request = json.loads(body)
        args = request["args"]
        if not routed_start(args, routed) or len(fds) != 3:
            raise ValueError(f"not a routed start: {args!r}")
        if not isinstance(request["env"], dict) or not isinstance(request["cwd"], str):
            raise ValueError("env must be an object and cwd a string")
    except (OSError, ValueError, KeyError, TypeError, struct.error) as exc:
        for fd in fds:
            os.close(fd)  # the caller's pipes: a copy kept here would keep its reader waiting for EOF
        try:
            conn.sendall(f"refused {exc}\n".encode())
        except OSError:
            pass
        conn.close()
        return None
    pid = os.fork()
    if pid == 0:
        listener.close()
        for other in children.values():
            other.close()
        conn.close()
        _child(args[1], args[2:], fds, request["env"], request["cwd"])
    for fd in fds:
        os.close(fd)
    try:
        conn.sendall(f"pid {pid}\n".encode())
    except OSError:  # the launcher gave up waiting and runs the real interpreter: one runner only
        _kill(pid)
        conn.close()
        print(f"python fork server: {args[1]} as pid {pid} killed, its launcher went away", file=sys.stderr, flush=True)
        return None
    conn.settimeout(None)
    print(f"python fork server: started {args[1]} as pid {pid}", file=sys.stderr, flush=True)
    return pid


def routed_start(args: list, routed: tuple[str, ...]) -> bool:
    """`-m MODULE` of a routed module, or `-m pyspark.daemon WORKER_MODULE` if the daemon is routed."""
    if len(args) < 2 or args[0] != "-m" or args[1] not in routed:
        return False
    if len(args) == 2:
        return True
    return (
        len(args) == 3 and args[1] == DAEMON and isinstance(args[2], str) and _WORKER_MODULE.match(args[2]) is not None
    )


def _recv_fds(conn: socket.socket, size: int, max_fds: int):
    fds = array.array("i")
    msg, ancdata, flags, addr = conn.recvmsg(size, socket.CMSG_LEN(max_fds * fds.itemsize))
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[: len(data) - (len(data) % fds.itemsize)])
    return msg, list(fds), flags, addr


def _child(module: str, arguments: list[str], fds: list[int], env: dict, cwd: str) -> None:
    import runpy
    import traceback
    import warnings

    code = 1
    try:
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        sys.stdout.flush()
        sys.stderr.flush()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(env)
        for entry in reversed([p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]):
            if entry not in sys.path:
                sys.path.insert(0, entry)
        sys.argv = [module, *arguments]
        # The module was preloaded on purpose; runpy would warn about it in the driver's log at
        # every daemon start.
        warnings.filterwarnings(
            "ignore", message=".* found in sys.modules after import of package", category=RuntimeWarning, module="runpy"
        )
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exc:
        # As the interpreter does: a status, or a message for stderr and status 1.
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except BaseException:  # noqa: BLE001 - report like an interpreter would, then exit
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _reap(children: dict, sel) -> None:
    while True:  # also children no launcher waits for any more (killed in _spawn)
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = children.pop(pid, None)
        if conn is None:
            continue
        code = os.waitstatus_to_exitcode(status)
        try:
            sel.unregister(conn)
            conn.sendall(f"exit {code if code >= 0 else 128 - code}\n".encode())
        except (OSError, KeyError, ValueError):
            pass
        conn.close()


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


if __name__ == "__main__":
    if len(sys.argv) >= 4 and sys.argv[1] == "--serve":  # --serve SOCKET DRIVER_PID [MODULE ...]
        serve(sys.argv[2], int(sys.argv[3]), tuple(sys.argv[4:]) or ROUTED)
    else:
        client(sys.argv[1:])
