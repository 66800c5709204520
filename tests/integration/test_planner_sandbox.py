"""The dispatcher's restore check runs a pipeline's code (its import and build()) in the planner
subprocess: as a user of the drivers' pool of its own, with an allow-listed environment and no
catalog of the cluster (issue 21: user code must not command the cluster; issue 43: nor reach
another pipeline). The pipeline here reports what it
can see by failing its build with it; the dispatcher surfaces that failure as a 400."""

from __future__ import annotations

import json
import os
import pwd
import sys
import textwrap

import pytest

from services.dispatcher.submission import restore_check
from tests.servers import IN_CI

DRIVER_USER = "headrace-driver"

PROBE = textwrap.dedent('''
    import json, os

    def build(ctx):
        seen = {"uid": os.getuid(), "env": sorted(k for k in os.environ if k.startswith("HEADRACE")),
                "catalog_url": ctx.catalog_url, "readable": []}
        for path in json.loads(os.environ.get("PROBE_PATHS", "[]")) + %s:
            try:
                with open(path, "rb") as f:
                    f.read(1)
                seen["readable"].append(path)
            except OSError:
                pass
        raise RuntimeError("SEEN" + json.dumps(seen) + "END")
''')


def _probe(tmp_path, monkeypatch, run_as):
    secrets = tmp_path / "secrets"
    secrets.mkdir(mode=0o700)
    secret = secrets / "cluster-secret"
    secret.write_text("ab" * 32)
    secret.chmod(0o600)
    config = tmp_path / "config.yaml"
    config.write_text("redis_url: redis://default:hunter2@127.0.0.1:6379/0\n")
    config.chmod(0o600)
    artifact = tmp_path / "probe.py"
    artifact.write_text(PROBE % json.dumps([str(secret), str(config)]))
    # What a dispatcher's environment holds: its config file and the cluster secret.
    monkeypatch.setenv("HEADRACE_CONFIG", str(config))
    monkeypatch.setenv("HEADRACE_CLUSTER_SECRET", "ab" * 32)
    monkeypatch.setenv("HEADRACE_CATALOG_URL", "postgresql://postgres@127.0.0.1:5432/headrace")
    meta = {"pipeline": {"artifact_sha256": "1" * 64}, "spark": {"batch_id": 3, "state_partitions": 2}}
    with pytest.raises(restore_check.RestoreIncompatible) as err:
        restore_check.check_restore(python=sys.executable, artifact_path=str(artifact), artifact_sha256="2" * 64,
                                    entry="build", args=[], config={}, parallelism=1, snapshot_meta=meta,
                                    catalog_url=None, redis_url="redis://pipeline:pw@127.0.0.1:6379/0",
                                    run_as=run_as, timeout_s=180)
    text = err.value.message
    assert "SEEN" in text, text
    return json.loads(text.split("SEEN", 1)[1].split("END", 1)[0])


def test_the_planner_sees_no_setting_secret_or_catalog_of_the_dispatcher(tmp_path, monkeypatch):
    seen = _probe(tmp_path, monkeypatch, run_as="")
    assert seen["env"] == ["HEADRACE_PLANNER_REDIS_URL"], seen
    assert seen["catalog_url"].endswith("/placeholder.db"), seen  # never the control catalog


@pytest.mark.skipif(os.geteuid() != 0 and not IN_CI, reason="switching to the drivers' users needs root")
def test_the_planner_runs_as_a_drivers_user_and_cannot_read_the_services_files(tmp_path, monkeypatch):
    try:
        uids = {pwd.getpwnam(f"{DRIVER_USER}-{i}").pw_uid for i in range(32)}
    except KeyError:
        pytest.fail(f"the OS users {DRIVER_USER}-0..31 are missing: scripts/bootstrap creates them")
    seen = _probe(tmp_path, monkeypatch, run_as=DRIVER_USER)
    assert seen["uid"] in uids
    assert seen["readable"] == [], seen
    assert seen["env"] == ["HEADRACE_PLANNER_REDIS_URL"], seen
