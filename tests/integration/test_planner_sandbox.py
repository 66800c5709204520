"""The dispatcher's restore check runs a pipeline's code (its import and build()) in the planner
subprocess: as a user of the drivers' pool of its own, with an allow-listed environment and no
catalog of the cluster (issue 21: user code must not command the cluster; issue 43: nor reach
another pipeline). The pipeline here reports what it
can see by failing its build with it; the dispatcher surfaces that failure as a 400."""

from __future__ import annotations

import json
import os
import textwrap

import pytest

from tests.integration.planner_support import DRIVER_USER, pool_uids, refused_plan, spare_planner
from tests.servers import IN_CI

PROBE = textwrap.dedent("""
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
""")


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
    text = refused_plan(artifact, run_as, catalog_url=None)
    assert "SEEN" in text, text
    return json.loads(text.split("SEEN", 1)[1].split("END", 1)[0])


def test_the_planner_sees_no_setting_secret_or_catalog_of_the_dispatcher(tmp_path, monkeypatch):
    seen = _probe(tmp_path, monkeypatch, run_as="")
    assert seen["env"] == ["HEADRACE_PLANNER_REDIS_URL"], seen
    assert seen["catalog_url"].endswith("/placeholder.db"), seen  # never the control catalog


@pytest.mark.skipif(os.geteuid() != 0 and not IN_CI, reason="switching to the drivers' users needs root")
def test_the_planner_runs_as_a_drivers_user_and_cannot_read_the_services_files(tmp_path, monkeypatch):
    uids = pool_uids()
    seen = _probe(tmp_path, monkeypatch, run_as=DRIVER_USER)
    assert seen["uid"] in uids
    assert seen["readable"] == [], seen
    assert seen["env"] == ["HEADRACE_PLANNER_REDIS_URL"], seen


ARTIFACT_PROBE = textwrap.dedent("""
    import json, os

    def attempt(fn):
        try:
            fn()
            return "done"
        except OSError as exc:
            return type(exc).__name__

    def build(ctx):
        mine = os.path.dirname(os.path.abspath(__file__))
        box = os.path.dirname(mine)
        seen = {"uid": os.getuid(), "artifact dir": mine, "tried": {
            "write in artifact/": attempt(lambda: open(os.path.join(mine, "planted.py"), "w").close()),
            "link in artifact/": attempt(lambda: os.symlink("/root", os.path.join(mine, "next.py"))),
            "rewrite own artifact": attempt(lambda: open(__file__, "r+b").close()),
            "replace own artifact": attempt(lambda: os.rename(__file__, __file__ + ".moved")),
            "chmod artifact/": attempt(lambda: os.chmod(mine, 0o777)),
            "link beside artifact/": attempt(lambda: os.symlink("/root", os.path.join(box, "artifact2"))),
        }}
        raise RuntimeError("SEEN" + json.dumps(seen) + "END")
""")


@pytest.mark.skipif(os.geteuid() != 0 and not IN_CI, reason="switching to the drivers' users needs root")
def test_the_warm_planners_pipeline_cannot_write_or_plant_a_link_in_its_artifact_directory(tmp_path):
    # Issue 43, finding 1: the spare planner's next artifact was copied, as root, into a directory
    # the planner's user owned; a link planted there led root's copy anywhere.
    uids = pool_uids()
    artifact = tmp_path / "artifact_probe.py"
    artifact.write_text(ARTIFACT_PROBE)
    warm = spare_planner()
    try:
        warm.replenish()
        assert warm.spare_pid is not None
        result = warm.plan(artifact_path=str(artifact), entry="build", args=[], config={}, parallelism=1, timeout_s=180)
    finally:
        warm.close()
    assert result is not None and result.get("stage") == "build", result
    text = str(result.get("error"))
    assert "SEEN" in text, text
    seen = json.loads(text.split("SEEN", 1)[1].split("END", 1)[0])
    assert seen["uid"] in uids, seen
    assert seen["tried"] == {
        "write in artifact/": "PermissionError",
        "link in artifact/": "PermissionError",
        "rewrite own artifact": "PermissionError",
        "replace own artifact": "PermissionError",
        "chmod artifact/": "PermissionError",
        "link beside artifact/": "PermissionError",
    }, seen
    assert seen["artifact dir"].endswith("/artifact"), seen
