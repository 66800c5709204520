"""Where the real Flink CLI is (scripts/install-flink-cli puts it there) and how the suite runs it."""

from __future__ import annotations

import os
from pathlib import Path

from tests.clusters import SUITE_JIT_AND_GC_OPTIONS

FLINK_VERSION = "2.3.0"
FLINK_HOME = Path(
    os.environ.get("HEADRACE_FLINK_HOME") or Path.home() / ".cache" / "headrace" / f"flink-{FLINK_VERSION}"
)
LAUNCHER = FLINK_HOME / "bin" / "flink"
CLI_TIMEOUT_S = 120


# Each CLI run starts two JVMs over a 280 MB classpath; a client this short-lived is faster without
# the optimising JIT and with one GC thread. Only the JVM's speed changes, not the CLI's behaviour.
# It keeps bytecode verification, which the suite's other JVMs skip: without it the CLI's
# `savepoint -d <path>` fails with "Missing required argument: savepoint path".
CLI_JVM_OPTS = SUITE_JIT_AND_GC_OPTIONS
