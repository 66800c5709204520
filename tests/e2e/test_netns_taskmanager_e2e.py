"""A TaskManager on a host of its own: a Linux network namespace joined to this machine by a veth
pair (tests/netns.py), so it has its own address and reaches Redis and PostgreSQL only by the
addresses it is configured with. It registers, runs the clickstream example with exact counts
in PostgreSQL, and the dispatcher reads its logs at the address it advertises.

Needs root (network namespaces); skipped with the reason elsewhere."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest
import yaml

from tests.clusters import Rest, start_cluster, wait_for
from tests.e2e.test_clickstream_e2e import ARGS, TOTAL, expected_counts, sink_counts
from tests.netns import NetnsHost, cleanup_stale, netns_unavailable
from tests.netproxy import TcpProxy

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
WHY_NOT = netns_unavailable()
if WHY_NOT:
    pytest.skip(f"network namespaces unavailable: {WHY_NOT}", allow_module_level=True)


def with_host(url: str, host: str, port: int | None = None) -> str:
    parts = urlsplit(url)
    userinfo = parts.netloc.rpartition("@")[0]
    netloc = f"{host}:{port or parts.port}"
    return urlunsplit((parts.scheme, f"{userinfo}@{netloc}" if userinfo else netloc, parts.path, parts.query,
                       parts.fragment))


@pytest.fixture(scope="module")
def remote(tmp_path_factory, pg_url_module):
    cleanup_stale()
    host = NetnsHost(1).create()
    pg = TcpProxy(("127.0.0.1", urlsplit(pg_url_module).port or 5432), listen_host=host.gateway)
    pg.start()
    cluster = None
    proc = None
    try:
        home = tmp_path_factory.mktemp("netns")
        cluster = start_cluster(home / "cluster", catalog_url=pg_url_module, taskmanagers=0,
                                redis_bind=("127.0.0.1", host.gateway), restart_strategy={"type": "none"})
        config = yaml.safe_load((cluster.run_dir / "taskmanager.yaml").read_text())
        config.update(redis_url=with_host(config["redis_url"], host.gateway),
                      pipeline_redis_url=with_host(config["pipeline_redis_url"], host.gateway),
                      advertised_host=host.address, metrics_host="0.0.0.0", taskmanager_metrics_port=0,
                      home=str(home / "remote-host"),
                      # the shared filesystem: the same paths as the cluster's
                      checkpoint_dir=str(cluster.settings.checkpoints), artifact_dir=str(cluster.settings.artifacts))
        path = home / "remote-taskmanager.yaml"
        path.write_text(yaml.safe_dump(config))
        env = {k: v for k, v in os.environ.items() if not k.startswith("HEADRACE_")} | {
            "HEADRACE_CONFIG": str(path)}
        log = open(home / "remote-taskmanager.log", "ab")
        proc = host.popen([sys.executable, "-m", "services.cli", "taskmanager", "--id", "tm-ns", "--slots", "2"],
                          env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        rest = Rest(cluster.dispatcher_url)
        wait_for("tm-ns registered", lambda: any(t["id"] == "tm-ns" for t in rest.get("/taskmanagers")["taskmanagers"]),
                 timeout_s=60)
        yield cluster, host, with_host(pg_url_module, host.gateway, pg.port), rest
    finally:
        if proc is not None:
            try:
                os.killpg(proc.pid, 15)
                proc.wait(20)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                os.killpg(proc.pid, 9)
        if cluster is not None:
            cluster.stop()
        pg.stop()
        host.remove()


def test_a_taskmanager_on_another_host_runs_a_task_with_exact_output(remote, pg_url_module):
    cluster, host, remote_pg, rest = remote
    jar = rest.upload(ROOT / "examples" / "clickstream.py")
    job = rest.run(jar, parallelism=1, jobName="clickstream-netns",
                   programArgsList=[a if a != "e2e_clicks" else "netns_clicks" for a in ARGS],
                   flinkConfiguration={"catalog_url": remote_pg})
    final = rest.wait_state(job, ("FINISHED", "FAILED", "CANCELED"), timeout_s=300)
    assert final["state"] == "FINISHED", rest.get(f"/jobs/{job}/exceptions")
    assert rest.attempts(job)[0]["taskmanager-id"] == "tm-ns"
    got = sink_counts(pg_url_module, "netns_clicks")
    assert got == expected_counts() and sum(got.values()) == TOTAL

    # The dispatcher reads the remote host's logs at the address it advertises.
    logs = rest.get("/taskmanagers/tm-ns/logs")["logs"]
    names = [entry["name"] for entry in logs]
    assert any(n.startswith("driver-") for n in names), names
    endpoint = rest.http.get("/taskmanagers/tm-ns/log")
    assert endpoint.status_code == 200 and "tm-ns" in endpoint.text
