"""Prometheus metrics on the real stack: the dispatcher's /metrics and each process's own
endpoint (ports from cluster.json), scraped while no-op jobs run and fail over."""

from __future__ import annotations

import json

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from shared.metrics import CACHE_S
from tests.clusters import start_cluster
from tests.waiting import wait_for


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, pg_url_module):
    c = start_cluster(tmp_path_factory.mktemp("metrics-home"), catalog_url=pg_url_module, taskmanagers=1, slots=2)
    yield c
    c.stop()


def scrape(url: str) -> dict[tuple[str, tuple], float]:
    r = httpx.get(url, timeout=10)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(r.text)
        for s in family.samples
    }


def value(samples: dict, name: str, **labels) -> float:
    key = (name, tuple(sorted(labels.items())))
    assert key in samples, f"{name}{labels} not scraped; have {sorted(n for n, _ in samples)}"
    return samples[key]


def scrape_until(url: str, check, timeout_s: float = 30) -> dict:
    """Scrape until check(samples) holds (an assertion in it failing means "not yet"); the
    endpoints cache for CACHE_S, so poll past that."""

    def holds(samples) -> bool:
        try:
            return bool(check(samples))
        except AssertionError:
            return False

    return wait_for(
        f"{url} to show the expected values", lambda: scrape(url), timeout_s, poll_s=CACHE_S / 2, until=holds
    )


def endpoints(cluster) -> dict:
    return json.loads((cluster.run_dir / "cluster.json").read_text())["metrics"]


def test_every_service_lists_an_endpoint_with_prefixed_metrics(cluster):
    urls = endpoints(cluster)
    assert set(urls) == {"dispatcher", "jobmanager", "resourcemanager", "taskmanager-1"}
    for url in urls.values():
        names = {n for n, _ in scrape_until(url, lambda s: any(n.startswith("headrace_") for n, _ in s))}
        assert all(n.startswith(("headrace_", "python_", "process_")) for n in names), names
    rm = scrape_until(urls["resourcemanager"], lambda s: value(s, "headrace_slots_total") == 2)
    assert value(rm, "headrace_slots_free") == 2
    assert value(rm, "headrace_heartbeat_lag_max_seconds") >= 0
    jm = scrape(urls["jobmanager"])
    assert value(jm, "headrace_jobmanager_is_leader") == 1
    d = scrape(urls["dispatcher"])
    assert value(d, "headrace_dead_letters") == 0
    assert value(d, "headrace_stream_group_pending", stream="hr:stream:jm", group="jobmanager") >= 0
    assert value(d, "headrace_jobmanager_leading") == 1


def test_counts_change_when_a_job_runs_and_fails_over(cluster, rest, jar):
    urls = endpoints(cluster)
    before = scrape(urls["dispatcher"])
    finished = value(before, "headrace_jobs", state="FINISHED")
    restarts = value(before, "headrace_attempt_restarts_total")
    failovers = value(before, "headrace_job_failovers_total")

    job = rest.run(jar, kind="noop", parallelism=1, restartStrategy={"type": "none"}, config={"noop.duration": -1})
    rest.wait_running_task(job)
    scrape_until(urls["dispatcher"], lambda s: value(s, "headrace_jobs", state="RUNNING") >= 1)
    tm = scrape_until(
        urls["taskmanager-1"], lambda s: value(s, "headrace_taskmanager_slots_free", taskmanager="tm-1") == 1
    )
    assert value(tm, "headrace_taskmanager_slots", taskmanager="tm-1") == 2
    held = {labels: v for (n, labels), v in tm.items() if n == "headrace_taskmanager_tasks"}
    assert sum(held.values()) == 1, held
    rest.cancel(job)
    rest.wait_state(job, "CANCELED", timeout_s=15)
    scrape_until(urls["taskmanager-1"], lambda s: value(s, "headrace_taskmanager_slots_free", taskmanager="tm-1") == 2)

    job = rest.run(
        jar,
        kind="noop",
        parallelism=1,
        restartStrategy={"type": "fixed-delay", "attempts": 3, "delay": "200 ms"},
        config={"noop.duration": 0.2, "noop.fail-attempts": 2},
    )
    assert rest.wait_state(job, ("FINISHED", "FAILED"))["state"] == "FINISHED"
    after = scrape_until(urls["dispatcher"], lambda s: value(s, "headrace_jobs", state="FINISHED") == finished + 1)
    assert value(after, "headrace_attempt_restarts_total") == restarts + 2
    assert value(after, "headrace_job_failovers_total") == failovers + 2
    assert value(after, "headrace_attempts", state="FAILED") >= 2
