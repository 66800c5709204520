"""The runbooks taskmanager-loss, jobmanager-restart, savepoint-upgrade, deployments and
autoscaler, followed to the letter.

Their ```sh blocks run in order, one bash per runbook under `set -eu`, after the shell setup that
docs/runbooks/README.md marks `<!-- runbook-test: setup -->`, against one `headrace up --ha`
cluster (its supervisor included) that the test starts on a free port with its own
HEADRACE_HOME: the `headrace` commands in the blocks find it the way a user's shell does, with
no -m. Every other shell block of those runbooks must say why it is not run (a
`<!-- not run by the runbook test: why -->` line before it), so none can drift unseen.

The deployments and autoscaler runbooks read a deployment: before them the test makes one as an
operator would have (`PUT /deployments/clicks`, a no-op job with the autoscaler on, STABLE with
evaluations, then a generation whose attempts fail, rolled back), so that their blocks find a
history, a failed generation's job and the autoscaler's decisions. The setup's helpers are
checked on their own too: `sql` on SQLite and PostgreSQL catalogs.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from services.cluster.local_cluster import free_port
from tests.clusters import Rest
from tests.servers import PG_ADMIN_URL
from tests.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
RUNBOOKS = ROOT / "docs" / "runbooks"
TESTED = (
    "taskmanager-loss.md",
    "jobmanager-restart.md",
    "savepoint-upgrade.md",
    "deployments.md",
    "autoscaler.md",
)  # in this order
SETUP_MARK = "<!-- runbook-test: setup"
SKIP_MARK = "<!-- not run by the runbook test:"
SHELLS = ("sh", "bash", "shell")
CLUSTER_START_S = 300
RUNBOOK_TIMEOUT_S = 900
FENCE = re.compile(r"^(\s*)```(\S*)\s*$")
PLACEHOLDER = re.compile(r"(?<!<)<[a-z][\w .-]*>")  # <job id>, <pgid>: what a reader must fill in


@dataclass(frozen=True)
class Block:
    lang: str
    code: str
    line: int  # of the opening fence, 1-based
    note: str  # the last non-blank line before the fence


def code_blocks(path: Path) -> list[Block]:
    lines = path.read_text().splitlines()
    blocks, i = [], 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        indent, lang = opening.group(1), opening.group(2)
        note = next((lines[j].strip() for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == "```"), None)
        assert end is not None, f"{path.name}:{i + 1}: code block never closed"
        body = "\n".join(line[len(indent) :] if line.startswith(indent) else line for line in lines[i + 1 : end])
        blocks.append(Block(lang, textwrap.dedent(body), i + 1, note))
        i = end + 1
    return blocks


def setup_script() -> str:
    marked = [b.code for b in code_blocks(RUNBOOKS / "README.md") if b.note.startswith(SETUP_MARK)]
    assert len(marked) >= 3, "README.md's headrace up setup, hr_op and jm_leader blocks must be marked"
    return "\n".join(marked)


def runbook_script(name: str) -> str:
    parts = ["set -eu", setup_script()]
    for block in code_blocks(RUNBOOKS / name):
        if block.lang == "sh":
            parts.append(f"echo '### {name}:{block.line}' >&2\n{block.code}")
    return "\n".join(parts) + "\n"


def test_every_shell_block_is_run_or_says_why_not():
    for name in TESTED:
        blocks = code_blocks(RUNBOOKS / name)
        assert sum(b.lang == "sh" for b in blocks) >= 2, f"{name}: no runnable (sh) blocks"
        unexplained = [
            b.line for b in blocks if b.lang in SHELLS and b.lang != "sh" and not b.note.startswith(SKIP_MARK)
        ]
        assert not unexplained, f"{name}: shell blocks at lines {unexplained} are neither sh nor marked as not run"
        syntax = subprocess.run(["bash", "-n", "-c", runbook_script(name)], capture_output=True, text=True, timeout=30)
        assert syntax.returncode == 0, f"{name}: bash cannot parse its sh blocks: {syntax.stderr}"
        for block in blocks:
            if block.lang == "sh":
                commands = re.sub(r"(^|\s)#.*$", "", block.code, flags=re.M)  # a comment may show a shape
                assert not PLACEHOLDER.search(commands), f"{name}:{block.line}: a placeholder in a block that is run"


class HeadraceUp:
    """`headrace up --ha` as a user starts it, in its own session; stopped with Ctrl-C's signal."""

    def __init__(self, home: Path, log: Path):
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("HEADRACE_")}
        # Drivers as the test's own user: pytest's directories are closed to a driver user. No warm
        # drivers: on two loaded cores their warm-up delays the rehearsal jobs' own drivers by
        # minutes, and no step of these runbooks depends on them.
        self.env |= {
            "HEADRACE_HOME": str(home),
            "HEADRACE_DRIVER_USER": os.environ.get("HEADRACE_DRIVER_USER", ""),
            "HEADRACE_WARM_DRIVERS": "0",
        }
        self.log = log
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "services.cli", "up", "--ha", "--port", str(free_port())],
                cwd=ROOT,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + CLUSTER_START_S
        while "Press Ctrl-C to stop." not in log.read_text(errors="replace"):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise AssertionError(
                    f"headrace up --ha not ready within {CLUSTER_START_S} s:\n{log.read_text(errors='replace')[-3000:]}"
                )
            time.sleep(0.5)

    @property
    def dispatcher(self) -> str:
        [run] = sorted((Path(self.env["HEADRACE_HOME"]) / "runs").iterdir())[-1:]
        return json.loads((run / "cluster.json").read_text())["dispatcher"]

    def run(self, script: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["bash", "-c", script], cwd=ROOT, env=self.env, capture_output=True, text=True, timeout=RUNBOOK_TIMEOUT_S
        )

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(90)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)


DEPLOYMENT = "clicks"  # the name the deployments and autoscaler runbooks use unless DEP says otherwise
DEPLOYMENT_WAIT_S = 180


def deployment_with_a_rollback(url: str, directory: Path) -> None:
    """A no-op deployment with the autoscaler on: STABLE with at least one evaluation, then a
    generation whose attempts fail, rolled back to the first."""
    rest = Rest(url)
    spec = {
        "jarId": rest.upload_noop_pipeline(directory),
        "kind": "noop",
        "parallelism": 1,
        "flinkConfiguration": {"noop.duration": "-1", "execution.checkpointing.interval": "1 s"},
        "restartStrategy": {"type": "fixed-delay", "attempts": 2, "delay": "200 ms"},
        "rollback": {"enabled": True, "readyWithin": "60 s"},
        "autoscaler": {"enabled": True, "minParallelism": 1, "maxParallelism": 2},
    }

    def put(body: dict) -> None:
        r = rest.http.put(f"/deployments/{DEPLOYMENT}", json=body)
        assert r.status_code == 200, r.text

    def wait(what: str, ok) -> None:
        wait_for(
            f"{DEPLOYMENT} {what}",
            lambda: rest.get(f"/deployments/{DEPLOYMENT}"),
            DEPLOYMENT_WAIT_S,
            poll_s=1,
            until=ok,
        )

    put(spec)
    wait("STABLE", lambda d: d["status"].get("lifecycleState") == "STABLE")
    wait("evaluated", lambda d: rest.get(f"/deployments/{DEPLOYMENT}/autoscaler")["evaluations"])
    failing = {
        **spec,
        "flinkConfiguration": {
            **spec["flinkConfiguration"],
            "noop.duration": "1 s",
            "noop.fail-attempts": 99,
            "noop.fail-message": "ValueError: event without a key",
        },
    }
    put(failing)
    wait("ROLLED_BACK", lambda d: d["status"].get("lifecycleState") == "ROLLED_BACK")


PRELUDES = {"deployments.md": deployment_with_a_rollback}
# What the helpers of README.md's setup must have found, so that a block that finds nothing (a
# pattern that no longer matches this cluster's processes, a jq path that is gone) fails here.
EXPECTED_OUTPUT = {
    "taskmanager-loss.md": [r"jvm \d+, group \d+: its runner leads the group"],  # hr_jvms: the restarted driver
    "jobmanager-restart.md": [r"\d+ +\d+ \S*python\S* -m services\.cli jobmanager"],  # hr_ps
    "deployments.md": [
        r"CANCELED restarts \d+ NoopTaskFailure: ValueError: event without a key",  # its failed job
        r'"summary": "NoopTaskFailure: ValueError: event without a key"',
    ],
    "autoscaler.md": [r" \w[\w-]* 1->\d+ "],  # an evaluation
}


@pytest.mark.timeout(2400)  # measured: 10 min and more at a load of 25-30 on 2 cores
def test_the_runbooks_work_as_written_on_headrace_up_ha(tmp_path):
    cluster = HeadraceUp(tmp_path / "home", tmp_path / "headrace-up.log")
    try:
        for name in TESTED:
            if name in PRELUDES:
                PRELUDES[name](cluster.dispatcher, tmp_path)
            started = time.monotonic()
            done = cluster.run(runbook_script(name))
            took = time.monotonic() - started
            last = [line for line in done.stderr.splitlines() if line.startswith("### ")][-1:]
            assert done.returncode == 0, (
                f"{name} failed (exit {done.returncode}) in the block at {last} after {took:.0f} s\n"
                f"--- stdout (end)\n{done.stdout[-4000:]}\n--- stderr (end)\n{done.stderr[-4000:]}\n"
                f"--- headrace up\n{(tmp_path / 'headrace-up.log').read_text(errors='replace')[-2000:]}"
            )
            for pattern in EXPECTED_OUTPUT.get(name, ()):
                assert re.search(pattern, done.stdout), (
                    f"{name}: no {pattern!r} in its output:\n{done.stdout[-4000:]}\n--- stderr (end)\n"
                    f"{done.stderr[-2000:]}\n--- headrace up\n"
                    f"{(tmp_path / 'headrace-up.log').read_text(errors='replace')[-4000:]}\n--- Spark JVMs\n"
                    + subprocess.run(
                        "ps -ww -eo pid,pgid,etimes,args | grep -o '^ *[0-9]* *[0-9]* *[0-9]* .*java' "
                        "| head; ps -ww -eo args | grep -o 'java.io.tmpdir=[^ ]*' | head",
                        shell=True,
                        capture_output=True,
                        text=True,
                    ).stdout
                )
            print(f"{name}: {took:.0f} s")
    finally:
        cluster.stop()


def setup_functions(*names: str) -> str:
    """The named functions of README.md's `headrace up` setup block, as bash reads them."""
    [block] = [
        b.code
        for b in code_blocks(RUNBOOKS / "README.md")
        if b.note.startswith(SETUP_MARK) and "RUN=$(ls -td" in b.code
    ]
    lines = block.splitlines()
    script = []
    for name in names:
        start = next((i for i, line in enumerate(lines) if re.match(rf"{name}\(\)\s+\{{", line)), None)
        assert start is not None, f"README.md's setup defines no {name}()"
        end = (
            start
            if lines[start].rstrip().endswith("}")
            else next(i for i in range(start, len(lines)) if lines[i].rstrip() == "}")
        )
        script += lines[start : end + 1]
    return "\n".join(script)


@pytest.mark.parametrize("catalog", ["sqlite", "postgresql"])
def test_the_setups_sql_reads_the_clusters_catalog_whatever_its_kind(tmp_path, catalog):
    """`sql` takes the catalog's URL from $RUN/config.yaml (cluster.json masks the password) and
    asks sqlite3 or psql: a cluster on PostgreSQL (HEADRACE_CATALOG_URL) is queried as one on
    SQLite is."""
    run = tmp_path / "run"
    run.mkdir()
    if catalog == "sqlite":
        db = tmp_path / "catalog.db"
        subprocess.run(
            ["sqlite3", str(db), "CREATE TABLE jobs (status TEXT); INSERT INTO jobs VALUES ('RUNNING')"], check=True
        )
        url = f"sqlite:///{db}"
    else:
        if subprocess.run(["psql", PG_ADMIN_URL, "-c", "SELECT 1"], capture_output=True).returncode != 0:
            pytest.skip(f"no PostgreSQL at {PG_ADMIN_URL}")
        url = PG_ADMIN_URL.replace("postgresql://", "postgresql+psycopg://", 1)
    (run / "config.yaml").write_text(f"catalog_url: {url}\nredis_url: redis://x\n")
    query = "SELECT 'RUNNING' AS status;" if catalog == "postgresql" else "SELECT status FROM jobs;"
    done = subprocess.run(
        ["bash", "-c", f"set -eu\nRUN={run}\n{setup_functions('sql')}\nsql <<'SQL'\n{query}\nSQL"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "status" in done.stdout and "RUNNING" in done.stdout, done.stdout
