"""`headrace up --kafka` that cannot run its broker says why in one line and starts nothing: the
jars were never fetched (the whole cache empty, or only the broker's set missing), or the broker's
port is taken. The CLI runs as a user runs it, as a subprocess with a short timeout."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

from shared.jars import DEFAULT_CACHE_DIR, KAFKA_BROKER, SPARK_SETS, JarCache, MissingJars
from shared.ports import free_port
from tests.servers import missing

REPO = Path(__file__).resolve().parents[2]
UP_TIMEOUT_S = 60  # each case fails before any process starts


def up_kafka(home: Path, jar_cache: Path, kafka_port: int) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HEADRACE_")}
    env |= {
        "HEADRACE_HOME": str(home),
        "HEADRACE_JAR_CACHE_DIR": str(jar_cache),
        "PYTHONPATH": str(REPO),
        "HEADRACE_KAFKA_PORT": str(kafka_port),
        "HEADRACE_DISPATCHER_PORT": str(free_port()),
    }
    return subprocess.run(
        [sys.executable, "-m", "services.cli", "up", "--kafka", "-n", "1"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=UP_TIMEOUT_S,
    )


def assert_one_line_and_nothing_started(done: subprocess.CompletedProcess, home: Path) -> str:
    assert done.returncode != 0, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    assert not (home / "runs").exists() and not (home / "kafka").exists(), "something started"
    return lines[0]


def test_an_empty_jar_cache_is_one_line_naming_scripts_bootstrap(tmp_path):
    empty = tmp_path / "jars"
    empty.mkdir()
    line = assert_one_line_and_nothing_started(up_kafka(tmp_path / "home", empty, free_port()), tmp_path / "home")
    assert "scripts/bootstrap" in line


def test_missing_broker_jars_alone_are_one_line_naming_the_set_and_scripts_bootstrap(tmp_path):
    real = JarCache(DEFAULT_CACHE_DIR)
    try:
        real.spark_jars()
    except MissingJars as exc:
        missing(f"Spark's jars ({exc})")
    cache = tmp_path / "jars"
    cache.mkdir()
    for name in SPARK_SETS:  # everything but the broker's set
        (cache / real.directory(name).name).symlink_to(real.directory(name))
    line = assert_one_line_and_nothing_started(up_kafka(tmp_path / "home", cache, free_port()), tmp_path / "home")
    assert KAFKA_BROKER in line and "scripts/bootstrap" in line


def test_a_taken_port_is_one_line_naming_it_and_the_setting(tmp_path):
    try:
        JarCache(DEFAULT_CACHE_DIR).jars(KAFKA_BROKER)
        JarCache(DEFAULT_CACHE_DIR).spark_jars()
    except MissingJars as exc:
        missing(f"the jars ({exc})")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = up_kafka(tmp_path / "home", DEFAULT_CACHE_DIR, port)
    line = assert_one_line_and_nothing_started(done, tmp_path / "home")
    assert f"port {port} (kafka_port) is taken" in line and "HEADRACE_KAFKA_PORT" in line
