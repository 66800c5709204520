"""The dashboard during an incident, in headless Chromium against a real cluster of two
TaskManagers running no-op jobs (no Spark: every figure here comes from the control plane):

  * a job's Checkpoints → History table lists its checkpoints, and a deployment's History its
    transitions, in the same page session (both pages' scripts once defined `renderHistory`; the
    one loaded last drew both tables);
  * an attempt that failed with a real 15 KB Py4J trace shows the exception's type and message in
    the Attempts tab, inside a 1280x900 window, with the whole cause on hover;
  * the job list shows each job's restarts, and a deployment's jobs link to their deployment;
  * the Metrics charts put a batch after a 30 s pause 30 s further along a labelled time axis;
  * a killed TaskManager stays listed as LOST, with when and why, until it registers again;
  * a stopped (SIGSTOP) dispatcher is shown as not answering within seconds, counting, and the
    page goes on polling: live again once it is continued.
"""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import pytest
import redis

# The same browser and page helpers as the dashboard's own tests, and the same skips.
from shared import streams
from tests.browser.dashboard_page import JOB_WAIT_S, Page, browser  # noqa: F401
from tests.clusters import Rest, start_cluster
from tests.waiting import wait_for

TRACE = (Path(__file__).parents[1] / "unit" / "failure_traces" / "data_source_not_found.txt").read_text()
TRACE_SUMMARY = "SparkClassNotFoundException: [DATA_SOURCE_NOT_FOUND] Failed to find the data source: nosuchformat."
DEPLOYMENT = "clicks-incident"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, pg_url_module):
    c = start_cluster(
        tmp_path_factory.mktemp("incident-home"),
        catalog_url=pg_url_module,
        taskmanagers=2,
        slots=2,
        warm_drivers=0,
        auth="off",
    )
    yield c
    c.stop()


@pytest.fixture(scope="module")
def api(cluster) -> Rest:
    return Rest(cluster.dispatcher_url)


@pytest.fixture(scope="module")
def page(browser, cluster, tmp_path_factory):
    browser.get(cluster.dispatcher_url + "/")
    return Page(browser, tmp_path_factory.mktemp("incident-screenshots"))


@pytest.fixture(scope="module")
def jar(api, tmp_path_factory) -> str:
    return api.upload_noop_pipeline(tmp_path_factory.mktemp("incident-jar"))


def content(page, css: str) -> str:
    """An element's whole text, also the part a line clamp hides."""
    return page.d.execute_script("const e = document.querySelector(arguments[0]); return e ? e.textContent : ''", css)


def noop_job(api: Rest, jar: str, name: str, **config) -> str:
    return api.run(
        jar,
        kind="noop",
        jobName=name,
        parallelism=1,
        flinkConfiguration={"noop.duration": "-1", **config},
        restartStrategy={"type": "fixed-delay", "attempts": 3, "delay": "200 ms"},
    )


@pytest.fixture(scope="module")
def checkpointing_job(api, jar) -> str:
    jid = noop_job(api, jar, "checkpointing", **{"execution.checkpointing.interval": "500 ms"})
    deadline = time.monotonic() + JOB_WAIT_S
    while (api.get(f"/jobs/{jid}/checkpoints")["counts"]["completed"] < 3) and time.monotonic() < deadline:
        time.sleep(0.5)
    return jid


@pytest.fixture(scope="module")
def failed_once(api, jar) -> str:
    """Its first attempt fails with a real Py4J trace as its cause; the second finishes."""
    jid = noop_job(
        api, jar, "failed once", **{"noop.duration": "300 ms", "noop.fail-attempts": 1, "noop.fail-message": TRACE}
    )
    api.wait_state(jid, "FINISHED", timeout_s=JOB_WAIT_S)
    return jid


@pytest.fixture(scope="module")
def deployment(api, jar) -> dict:
    body = {
        "jarId": jar,
        "kind": "noop",
        "parallelism": 1,
        "flinkConfiguration": {"noop.duration": "-1", "execution.checkpointing.interval": "500 ms"},
        "rollback": {"enabled": True, "readyWithin": "30 s"},
    }
    r = api.http.put(f"/deployments/{DEPLOYMENT}", json=body)
    assert r.status_code == 200, r.text
    return wait_for(
        f"deployment {DEPLOYMENT} STABLE",
        lambda: api.get(f"/deployments/{DEPLOYMENT}"),
        JOB_WAIT_S,
        poll_s=0.5,
        until=lambda d: d["status"].get("lifecycleState") == "STABLE",
    )


def test_both_history_tables_fill_in_one_page_session(page, api, checkpointing_job, deployment):
    page.go(f"#/deployments/{DEPLOYMENT}")
    page.wait("the deployment's history", lambda d: len(page.els("#depd-history tr")) >= 1)
    page.go(f"#/jobs/{checkpointing_job}/checkpoints")
    keys = page.wait(
        "checkpoint rows in Checkpoints → History",
        lambda d: (lambda k: k if len(k) >= 3 else None)(page.attributes("#cp-history tr", "data-key")),
    )
    assert page.visible("#cp-history-table") and not page.visible("#cp-history-empty")
    shown = set(keys)
    listed = {str(c["id"]) for c in api.get(f"/jobs/{checkpointing_job}/checkpoints")["history"]}
    assert shown & listed, (shown, listed)
    assert "COMPLETED" in page.text("#cp-history")
    # Back on the deployment: its history is still its own.
    page.go(f"#/deployments/{DEPLOYMENT}")
    page.wait("the deployment's history again", lambda d: "STABLE" in page.text("#depd-history"))


def test_the_failure_cause_fits_a_1280_pixel_screen(page, failed_once):
    page.d.set_window_size(1280, 900)
    try:
        assert page.d.execute_script("return window.innerWidth") <= 1280
        page.go(f"#/jobs/{failed_once}/attempts")
        cause = "#detail-attempts .cause"
        page.wait("the failed attempt's cause", lambda d: page.els(cause))
        assert content(page, cause).startswith(TRACE_SUMMARY)  # three lines of it on screen, the rest clipped
        assert "Traceback" not in content(page, cause)
        whole = page.el(cause).get_attribute("title")  # the whole cause, on hover
        assert whole.startswith("NoopTaskFailure: Py4JJavaError: Traceback") and whole.strip().endswith("... 23 more")
        geometry = page.d.execute_script(
            """
            const cell = document.querySelector(arguments[0]).getBoundingClientRect();
            const scroll = document.querySelector('#tab-attempts .table-scroll');
            return {right: cell.right, width: cell.width, viewport: document.documentElement.clientWidth,
                    scrollWidth: scroll.scrollWidth, clientWidth: scroll.clientWidth,
                    pageScroll: document.documentElement.scrollWidth};""",
            cause,
        )
        assert geometry["right"] <= geometry["viewport"], geometry
        assert geometry["width"] >= 150, geometry  # a column, not a sliver
        assert geometry["scrollWidth"] <= geometry["clientWidth"] + 1, geometry  # nothing to scroll sideways to
        assert geometry["pageScroll"] <= geometry["viewport"], geometry
    finally:
        page.d.set_window_size(1400, 1000)


def test_the_job_list_shows_restarts_and_links_a_deployments_jobs(page, api, failed_once, deployment):
    page.go("#/jobs")
    row = f"#jobs-body tr[data-key='{failed_once}']"
    page.wait("the restarted job's restarts", lambda d: page.text(f"{row} td.restarts") == "1")
    assert api.job(failed_once)["restarts"] == 1
    job = deployment["status"]["jobId"]
    link = f"#jobs-body tr[data-key='{job}'] td.deployment a"
    page.wait("the deployment's job linked to it", lambda d: page.text(link) == DEPLOYMENT)
    assert page.text(f"{row} td.deployment") == "–"
    page.el(link).click()
    page.wait(
        "the deployment's page", lambda d: page.visible("#page-deployment") and page.text("#depd-name") == DEPLOYMENT
    )
    # The job's own page names its deployment and its last failure, summarised.
    page.go(f"#/jobs/{failed_once}")
    page.wait("the last failure in the job's facts", lambda d: content(page, ".last-failure").startswith(TRACE_SUMMARY))
    page.wait("its restarts in the job's facts", lambda d: "Restarts\n1" in page.text("#detail-facts"))
    # The Exceptions tab: the same line over the whole trace.
    page.go(f"#/jobs/{failed_once}/exceptions")
    page.wait(
        "the exception's summary over its trace",
        lambda d: page.text("#detail-exceptions .exc-summary").startswith(TRACE_SUMMARY),
    )
    assert "... 23 more" in page.text("#detail-exceptions pre.stacktrace")


def add_progress_history(cluster, taskmanager_id: str, execution_id: str, times_ms: list[int]) -> None:
    """Points as the TaskManager that runs the attempt writes them (under its own keys,
    shared/streams.py): one stream entry per batch, its id the batch time."""
    client = redis.Redis.from_url(cluster.redis_url)
    key = streams.progress_history_key(taskmanager_id, execution_id)
    for i, t in enumerate(times_ms):
        client.xadd(
            key,
            {
                "timestamp": t,
                "batch_id": i,
                "input_rows_per_second": 10 + i,
                "processed_rows_per_second": 12 + i,
                "batch_duration_ms": 200,
                "num_input_rows": 10,
            },
            id=f"{t}-0",
        )
    client.expire(key, 600)
    client.close()


def chart_coordinates(page) -> dict:
    return page.d.execute_script("""
        const svg = document.querySelector('#metrics-charts svg.chart');
        if (!svg) return null;
        const lines = [...svg.querySelectorAll('polyline')].map(l => l.getAttribute('points').trim().split(/\\s+/)
            .map(p => Number(p.split(',')[0])));
        return {lines, ticks: [...svg.querySelectorAll('text.chart-tick')].map(t => t.textContent),
                label: svg.parentElement.querySelector('.chart-axis-label')?.textContent || ''};""")


def test_the_charts_plot_against_a_labelled_time_axis(page, api, cluster, checkpointing_job):
    attempt = api.attempts(checkpointing_job)[-1]
    execution, taskmanager = attempt["execution-id"], attempt["taskmanager-id"]
    now = int(time.time() * 1000) - 1000
    first = [now - 40_000 + i * 1000 for i in range(6)]  # 6 batches a second apart
    second = [now - 5_000 + i * 1000 for i in range(6)]  # then 30 s of nothing, then 6 more
    add_progress_history(cluster, taskmanager, execution, first + second)
    page.d.refresh()  # a fresh page loads the history when the job's page opens
    page.go(f"#/jobs/{checkpointing_job}/metrics")
    seen = page.wait(
        "two runs of points on the first chart",
        lambda d: (lambda c: c if c and len(c["lines"]) == 2 and all(len(run) == 6 for run in c["lines"]) else None)(
            chart_coordinates(page)
        ),
    )
    xs = seen["lines"][0] + seen["lines"][1]
    step = (xs[5] - xs[0]) / 5
    assert xs[6] - xs[5] == pytest.approx(30 * step, rel=0.05), xs  # the pause is thirty seconds wide
    assert xs[11] - xs[6] == pytest.approx(5 * step, rel=0.05), xs
    expected = [time.strftime("%H:%M:%S", time.localtime(t / 1000)) for t in (first[0], second[-1])]
    assert [seen["ticks"][0], seen["ticks"][-1]] == expected and len(seen["ticks"]) == 3, seen
    assert seen["label"].startswith("time"), seen


HOLD_REQUESTS = """
    // Hold back, until a moment, the dashboard's requests whose path starts with a prefix.
    const holds = arguments[0];
    const real = window.__realFetch || (window.__realFetch = window.fetch);
    window.fetch = async (path, init) => {
      const p = String(path);
      for (const [prefix, exact, until] of holds) {
        if ((exact ? p === prefix : p.startsWith(prefix)) && Date.now() < until) {
          await new Promise((r) => setTimeout(r, until - Date.now()));
        }
      }
      return real(path, init);
    };"""


def test_a_job_opened_while_another_loads_its_history_draws_its_own(page, api, cluster, checkpointing_job, failed_once):
    """Another job's history answering after this job's page opened must not count as this job's:
    the charts stayed empty until the page was reopened (CI, stop 51)."""
    attempt = api.attempts(checkpointing_job)[-1]
    now = int(time.time() * 1000)
    add_progress_history(
        cluster, attempt["taskmanager-id"], attempt["execution-id"], [now - 200, now - 100]
    )  # after any point written before
    page.go("#/overview")
    page.d.refresh()  # no job open, no figures kept from an earlier visit
    page.wait("the overview", lambda d: page.visible("#page-overview"))
    start = int(time.time() * 1000)
    # The first job's history answers at +1.5 s, after the second job's page opened but before
    # that page's own first answers (+3 s).
    page.d.execute_script(
        HOLD_REQUESTS,
        [
            [f"/jobs/{failed_once}/progress/history", False, start + 1500],
            [f"/jobs/{checkpointing_job}", True, start + 3000],
        ],
    )
    page.go(f"#/jobs/{failed_once}/metrics")
    time.sleep(0.5)
    page.go(f"#/jobs/{checkpointing_job}/metrics")
    seen = page.wait(
        "the second job's history on its first chart",
        lambda d: (lambda c: c if c and sum(len(run) for run in c["lines"]) >= 2 else None)(chart_coordinates(page)),
    )
    assert seen["lines"], seen


def test_a_lost_taskmanager_stays_listed_with_when_and_why_until_it_registers(page, api, cluster):
    page.go("#/taskmanagers")
    page.wait("both TaskManagers", lambda d: len(page.els("#tm-body tr")) == 2)
    killed_at = time.time()
    cluster.kill("taskmanager-2")
    row = "#tm-body tr[data-key='tm-2']"
    page.wait(
        "tm-2 LOST with a reason",
        lambda d: "LOST" in page.text(f"{row} td.tm-state") and page.els(f"{row} .lost-reason"),
        timeout_s=60,
    )
    assert re.search(r"LOST (just now|\d+s ago)", page.text(f"{row} td.tm-state")), page.text(row)
    lost = next(t for t in api.get("/taskmanagers?include=lost")["taskmanagers"] if t["id"] == "tm-2")
    assert lost["state"] == "LOST" and lost["lost-reason"] and lost["last-lost-at"] >= killed_at * 1000 - 2000
    assert page.text(f"{row} .lost-reason") == lost["lost-reason"]
    assert "tm-2" not in {t["id"] for t in api.get("/taskmanagers")["taskmanagers"]}  # Flink's list: registered
    time.sleep(2.5)
    assert page.els(row), "a lost TaskManager left the list"
    cluster.respawn("taskmanager-2")
    page.wait("tm-2 registered again", lambda d: page.text(f"{row} td.tm-state") == "registered", timeout_s=JOB_WAIT_S)


def test_a_hung_dispatcher_is_shown_as_not_answering_and_polling_goes_on(page, cluster):
    page.go("#/overview")
    page.wait("live", lambda d: page.text("#conn").startswith("live"))
    dispatcher = cluster.child("dispatcher").proc.pid
    os.killpg(dispatcher, signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        first = page.wait(
            "no answer from the dispatcher",
            lambda d: (lambda t: t if t.startswith("no answer from the dispatcher for") else None)(page.text("#conn")),
            timeout_s=8,
        )
        assert time.monotonic() - stopped < 6, "seen too late"
        assert "conn down" in page.el("#conn").get_attribute("class")
        assert "live" not in page.el("#leader").get_attribute("class").split()  # who leads is not known either
        page.wait("the silence counted", lambda d: page.text("#conn") != first, timeout_s=5)
        # Past the request's time limit (10 s) the poll is given up and the next one starts.
        page.wait(
            "a poll given up", lambda d: int(re.search(r"(\d+) s$", page.text("#conn")).group(1)) >= 12, timeout_s=20
        )
    finally:
        os.killpg(dispatcher, signal.SIGCONT)
    page.wait("live again", lambda d: page.text("#conn").startswith("live"), timeout_s=20)


def test_no_script_errors_or_refusals(page):
    refused = [
        e
        for e in page.console()
        if "Content Security Policy" in e.get("message", "") or "Refused to" in e.get("message", "")
    ]
    assert not refused, refused
    errors = [e for e in page.console() if e.get("level") == "SEVERE" and e.get("source") == "javascript"]
    assert not errors, errors
