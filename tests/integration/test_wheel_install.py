"""Headrace installed from its wheel, as a user outside the checkout gets it: the wheel built from
the files git sees, installed into a fresh venv, runs `headrace demo --once` (the README's first
command) and serves the dashboard, importing nothing from the checkout.

The venv sees the machine's site-packages (the dependencies are installed there; the checkout is
too, as an editable install, which is why every check below says where the code came from).
Installing asks no package index (--no-deps). Building does, as `pip wheel .` does: its isolated
build environment needs setuptools and wheel (pyproject.toml, build-system); offline, point pip at
them with PIP_NO_INDEX=1 PIP_FIND_LINKS=<dir> (as deploy/local-images does)."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import psutil
import pytest

from services.cluster.local_cluster import free_port
from shared.settings import Settings
from tests.servers import missing

ROOT = Path(__file__).resolve().parents[2]
DEMO_TIMEOUT_S = 400
STOP_TIMEOUT_S = 90
# What the installed package must carry beside its code: checkout directory -> package directory.
PACKAGE_DATA = {
    "web-ui": "services/dispatcher/web_ui",
    "examples": "services/cluster/examples",
    "shared/catalog/migrations": "shared/catalog/migrations",
}


def source_copy(dst: Path) -> Path:
    """The checkout's files as git sees them (tracked or new, not ignored; links kept as links):
    what a fresh clone builds, without writing build/ into the checkout."""
    listed = (
        subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT,
            capture_output=True,
            timeout=60,
            check=True,
        )
        .stdout.decode()
        .split("\0")
    )
    for rel in filter(None, listed):
        src, target = ROOT / rel, dst / rel
        if not (src.is_symlink() or src.is_file()):
            continue  # deleted in the work tree
        target.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            os.symlink(os.readlink(src), target)
        else:
            shutil.copy2(src, target)
    return dst


def run(cmd: list, **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kwargs)
    assert done.returncode == 0, f"{cmd}: exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    """A fresh venv, outside the checkout, holding the wheel built from it."""
    base = tmp_path_factory.mktemp("wheel-install")
    source = source_copy(base / "source")
    wheels = base / "wheels"
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(source)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if built.returncode != 0 and "No matching distribution found for setuptools" in built.stderr:
        missing("setuptools and wheel for pip's build environment (a package index, or PIP_FIND_LINKS)")
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    wheel = next(wheels.glob("headrace-*.whl"))
    venv = base / "venv"
    # No pip of its own (ensurepip takes seconds): the machine's pip, run by the venv's Python,
    # installs into the venv. --force-reinstall: the editable install outside it has the same version.
    run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", venv], timeout=120)
    run(
        [venv / "bin" / "python", "-m", "pip", "install", "--no-deps", "--no-index", "--force-reinstall", "-q", wheel],
        timeout=300,
    )
    return venv


@pytest.fixture
def user_env(venv, tmp_path) -> dict[str, str]:
    """A user's shell: the venv first on PATH, a home of its own, no Headrace settings or PYTHONPATH
    from the test's environment. Drivers run as this user: the venv sits in pytest's 0700 temporary
    directory, out of the driver user's reach (tests/integration/test_driver_sandbox.py covers that).
    The Spark driver class archive is the machine's (same JDK and PySpark, same archive): built anew
    in the fresh home it took a JVM run of its own beside the demo's driver, past the task's
    start-up timeout on a loaded machine."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HEADRACE_") and k != "PYTHONPATH"}
    (tmp_path / "home").mkdir()
    env |= {
        "HOME": str(tmp_path / "home"),
        "PATH": f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}",
        "HEADRACE_DISPATCHER_PORT": str(free_port()),
        "HEADRACE_DRIVER_USER": "",
        "HEADRACE_DRIVER_CLASS_ARCHIVE_DIR": str(Settings().driver_class_archive_dir),
        # The machine's jars from Maven Central, as `headrace jars fetch` put them there.
        "HEADRACE_JAR_CACHE_DIR": str(Settings().jar_cache_dir),
    }
    return env


def installed_paths(venv: Path, env: dict[str, str], cwd: Path) -> dict[str, str]:
    script = (
        "import json, services, shared, shared.catalog.db as db; from services.dispatcher.app import "
        "DEFAULT_WEB_DIR; from services.cluster.demo import EXAMPLE; print(json.dumps({'services': "
        "services.__file__, 'shared': shared.__file__, 'web': str(DEFAULT_WEB_DIR), 'example': str(EXAMPLE), "
        "'migrations': str(db.MIGRATIONS)}))"
    )
    return json.loads(run([venv / "bin" / "python", "-c", script], env=env, cwd=cwd, timeout=120).stdout)


def test_the_venv_imports_the_wheels_copy_with_its_package_data(venv, user_env, tmp_path):
    paths = installed_paths(venv, user_env, tmp_path)
    site = Path(paths["services"]).parents[1]
    assert site.is_relative_to(venv) and site.name == "site-packages", paths
    for name, path in paths.items():
        assert Path(path).is_relative_to(site), (name, path)
    for checkout_dir, package_dir in PACKAGE_DATA.items():
        expected = {
            p.relative_to(ROOT / checkout_dir)
            for p in (ROOT / checkout_dir).rglob("*")
            if p.is_file() and "__pycache__" not in p.parts
        }
        installed = {
            p.relative_to(site / package_dir)
            for p in (site / package_dir).rglob("*")
            if p.is_file() and "__pycache__" not in p.parts
        }
        assert expected and expected <= installed, (checkout_dir, sorted(expected - installed))


def lines_of(proc: subprocess.Popen) -> queue.Queue:
    """The process's output line by line (None at its end), read by a thread: waits can time out."""
    lines: queue.Queue = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line.rstrip("\n"))
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    return lines


def dashboard_assets(url: str) -> dict[str, tuple[int, str]]:
    """GET / and every script and stylesheet its page names: path -> (status, content type)."""
    with httpx.Client(base_url=url, timeout=30) as http:
        page = http.get("/")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html"), page.text[:500]
        refs = re.findall(r'<(?:script src|link rel="stylesheet" href)="(/web/[^"]+)"', page.text)
        assert any(ref.endswith(".js") for ref in refs), page.text[:500]
        answers = {ref: http.get(ref) for ref in refs}
        return {ref: (r.status_code, r.headers.get("content-type", "")) for ref, r in answers.items()}


def python_of_cluster(proc: subprocess.Popen) -> set[str]:
    """The interpreters the demo's services run on (the first word of every Python child's command)."""
    children = psutil.Process(proc.pid).children(recursive=True)
    commands = []
    for child in children:
        try:
            commands.append(child.cmdline())
        except psutil.Error:
            continue  # ended meanwhile
    return {cmd[0] for cmd in commands if cmd[1:3] == ["-m", "services.cli"]}


def stop(proc: subprocess.Popen) -> None:
    """A demo still running (the test failed) stops its cluster on SIGTERM; killed with its
    services (each in a session of its own) if it has not within STOP_TIMEOUT_S."""
    if proc.poll() is not None:
        return
    tree = psutil.Process(proc.pid).children(recursive=True)
    proc.terminate()
    try:
        proc.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        for process in (psutil.Process(proc.pid), *tree):
            with contextlib.suppress(psutil.Error):
                process.kill()
        proc.wait(timeout=30)


def test_headrace_demo_once_and_the_dashboard_from_the_wheel(venv, user_env, tmp_path):
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [str(venv / "bin" / "headrace"), "demo", "--once"],
        env=user_env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    out: list[str] = []
    assets: dict[str, tuple[int, str]] = {}
    pythons: set[str] = set()
    try:
        lines = lines_of(proc)
        while (line := lines.get(timeout=max(1.0, t0 + DEMO_TIMEOUT_S - time.monotonic()))) is not None:
            out.append(line)
            # Printed once the cluster is up, before the job runs: the dashboard is served now.
            found = re.match(r"dashboard: (http://\S+?)/\s+logs:", line)
            if found:
                assets = dashboard_assets(found.group(1))
                pythons = python_of_cluster(proc)
        assert proc.wait(timeout=60) == 0, "\n".join(out[-60:])
    except queue.Empty:
        pytest.fail(f"headrace demo --once did not end within {DEMO_TIMEOUT_S} s:\n" + "\n".join(out[-60:]))
    finally:
        stop(proc)
    text = "\n".join(out)
    assert assets and all(status == 200 for status, _ in assets.values()), assets
    assert any(kind.startswith(("application/javascript", "text/javascript")) for _, kind in assets.values()), assets
    # Every service ran on the venv's interpreter, which imports the wheel's copy (the test above).
    assert pythons and all(Path(python).parent == venv / "bin" for python in pythons), pythons
    found = re.search(r"^(\d+) rows, (\d+) events$", text, re.M)
    assert found, text[-3000:]
    rows = [line for line in out if re.match(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d  ", line)]
    assert int(found.group(1)) == len(rows) > 0
    assert sum(int(line.split()[-1]) for line in rows) == int(found.group(2)) == 3000
