"""The README's first command, `headrace demo --once`, as a user on a fresh machine runs it: it
starts a local cluster, runs the clickstream example end to end and prints its counts."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from services.cluster.local_cluster import free_port


def test_headrace_demo_once_counts_every_event(tmp_path):
    # The JVMs as users run them, not the suite's (tests/clusters.py SUITE_JVM_OPTIONS): the one
    # drill whose drivers keep the optimising JIT, the default collector and bytecode verification.
    env = {k: v for k, v in os.environ.items() if not k.startswith("HEADRACE_") and k != "JDK_JAVA_OPTIONS"}
    env |= {"HEADRACE_HOME": str(tmp_path / "home"), "HEADRACE_DISPATCHER_PORT": str(free_port())}
    done = subprocess.run(
        [sys.executable, "-m", "services.cli", "demo", "--once"],
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    found = re.search(r"^(\d+) rows, (\d+) events$", done.stdout, re.M)
    assert found, done.stdout[-3000:]
    rows = [line for line in done.stdout.splitlines() if re.match(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d  ", line)]
    assert int(found.group(1)) == len(rows) > 0
    assert sum(int(line.split()[-1]) for line in rows) == int(found.group(2)) == 3000
