"""The dashboard in a real headless Chromium (Debian's chromium and chromium-driver, driven by
Selenium) against a real cluster with authentication on: sign in through the page, submit a
streaming pipeline with a job name that is an XSS probe, see it RUNNING, open its graph and
exceptions, cancel it, see CANCELED; a failing pipeline whose exception text is markup shows
it as text; nothing the page does is refused by its Content-Security-Policy.

Everything happens through the page; the REST API is used only to check what the page claims.
"""

from __future__ import annotations

import re
import time

import pytest

from tests.browser.dashboard_page import JOB_WAIT_S, Page, api, browser, tokens  # noqa: F401 - fixtures
from tests.browser.pipelines import EXCEPTION_PROBE, FAILING, STREAMING
from tests.clusters import start_cluster

XSS_NAME = '<img src=x onerror="window.__xss=1"><script>window.__xss=2</script>'


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, pg_url_module):
    c = start_cluster(
        tmp_path_factory.mktemp("browser-home"),
        catalog_url=pg_url_module,
        taskmanagers=1,
        slots=2,
        warm_drivers=1,
        auth="required",
    )
    yield c
    c.stop()


@pytest.fixture(scope="module")
def page(browser, cluster, tmp_path_factory):
    browser.get(cluster.dispatcher_url + "/")
    return Page(browser, tmp_path_factory.mktemp("screenshots"))


def test_sign_in_dialog_opens_on_401_and_shows_the_role(page, tokens):
    # Auth is on: the first poll answers 401 and the page asks for a token in its own dialog.
    page.wait("the sign-in dialog", lambda d: page.visible("#signin"))
    assert "requires a token" in page.text("#signin-reason")
    # "Not now": the polls keep answering 401 but do not reopen the dialog; the sidebar button does.
    page.el("#signin-cancel").click()
    polls = "return performance.getEntriesByType('resource').filter(e => e.name.endsWith('/overview')).length"
    seen = page.d.execute_script(polls)
    page.wait("two more polls", lambda d: page.d.execute_script(polls) >= seen + 2)
    assert not page.visible("#signin")
    assert page.text("#conn") == "sign in to see the cluster"
    page.el("#auth-signin").click()
    page.el("#signin-token").send_keys("hr_not-a-real-token")
    page.el("#signin-submit").click()
    page.wait("the refusal of a bad token", lambda d: "unknown or revoked" in page.text("#signin-message"))
    assert page.visible("#signin")
    assert page.sign_in(tokens["admin"]) == "signed in · admin"
    page.wait("live data after sign-in", lambda d: "live" in page.text("#conn"))
    assert page.text("#tm-count") == "1"
    assert page.d.execute_script("return sessionStorage.getItem('headrace.token')") == tokens["admin"]
    assert page.d.execute_script("return localStorage.getItem('headrace.token')") is None


@pytest.fixture(scope="module")
def streaming_job(page, tmp_path_factory):
    return page.submit(tmp_path_factory.mktemp("pipelines"), "streaming_probe.py", STREAMING, name=XSS_NAME)


def test_streaming_job_runs_and_its_name_stays_text(page, api, streaming_job, cluster):
    jid = streaming_job
    assert api.job(jid)["name"] == XSS_NAME
    page.go("#/jobs")
    row = f"#jobs-body tr[data-key='{jid}']"
    page.wait("the job in the list", lambda d: page.els(row))
    page.wait("the job RUNNING in the list", lambda d: page.text(f"{row} td.state .badge") == "RUNNING", JOB_WAIT_S)
    assert page.text(f"{row} td.name a") == XSS_NAME  # shown literally
    # Filters: by name (the probe contains "onerror") and by state.
    name_filter = page.el("#jobs-filter-name")
    name_filter.send_keys("no-such-job")
    page.wait(
        "the name filter hiding the job", lambda d: not page.els(row) and "No job matches" in page.text("#jobs-empty")
    )
    name_filter.clear()
    name_filter.send_keys("onerror")
    page.wait("the name filter keeping the job", lambda d: page.els(row))
    page.el("#jobs-filter-state option[value='completed']").click()
    page.wait("the state filter hiding a running job", lambda d: not page.els(row))
    page.el("#jobs-filter-state option[value='live']").click()
    page.wait("the running filter", lambda d: page.els(row))

    page.el(f"{row} td.name a").click()
    page.wait("the job page", lambda d: page.visible("#page-job") and page.text("#detail-name") == XSS_NAME)
    assert page.d.title.startswith(XSS_NAME)
    # The execution graph: one vertex box, RUNNING, with its parallelism.
    node = "#detail-graph .node"
    page.wait("the vertex RUNNING in the graph", lambda d: page.text(f"{node} .badge") == "RUNNING", JOB_WAIT_S)
    assert page.text(f"{node} .node-name") == XSS_NAME
    assert "parallelism 1" in page.text(node)
    page.wait("a task manager in the vertex table", lambda d: page.text("#detail-vertices td.mono a") == "tm-1")

    page.el("#tab-btn-attempts").click()
    page.wait(
        "the attempts tab",
        lambda d: (
            page.visible("#tab-attempts")
            and "#/jobs/" in page.d.current_url
            and page.d.current_url.endswith("/attempts")
        ),
    )
    page.wait("attempt 0 on tm-1", lambda d: page.text("#detail-attempts tr td:nth-child(4)") == "tm-1")
    assert "fresh start" in page.text("#detail-attempts")

    page.el("#tab-btn-exceptions").click()
    page.wait("the exceptions tab", lambda d: "No exceptions." in page.text("#detail-exceptions"))

    page.el("#tab-btn-configuration").click()
    page.wait("the configuration tab", lambda d: "entry" in page.text("#detail-config"))

    page.el("#tab-btn-metrics").click()
    page.wait("the metrics tab", lambda d: page.els("#metrics-charts svg.chart"))
    see_the_last_minutes_at_once(page, api, jid)
    see_its_memory_beside_its_limit(page, api, jid)

    page.go(f"#/jobs/{jid}")
    page.wait("the job page again", lambda d: page.visible("#page-job"))
    page.el("#tab-btn-overview").click()
    # Back from another page the job's header is drawn again by the next poll: its Cancel button
    # stays hidden until that poll has seen the job's state.
    page.wait("the Cancel button", lambda d: page.visible("#detail-cancel"))
    page.el("#detail-cancel").click()
    page.accept_confirm()
    page.wait("the job CANCELED on its page", lambda d: page.text("#detail-state") == "CANCELED", JOB_WAIT_S)
    assert api.job(jid)["state"] == "CANCELED"
    page.go("#/jobs")
    page.el("#jobs-filter-state option[value='CANCELED']").click()
    page.wait("the job CANCELED in the list", lambda d: page.text(f"{row} td.state .badge") == "CANCELED")

    # The probe did nothing: no script ran, no element was made from the name.
    assert page.xss() is None
    assert (
        page.d.execute_script(
            "return [...document.querySelectorAll('img')].filter(i => (i.getAttribute('src') || '') === 'x').length"
        )
        == 0
    )
    assert (
        page.d.execute_script(
            "return [...document.querySelectorAll('script')].filter(s => s.textContent.includes('__xss')).length"
        )
        == 0
    )
    names = page.d.execute_script(
        "return [...document.querySelectorAll('a, span, div, td')]"
        ".filter(e => e.children.length === 0 && e.textContent === arguments[0]).length",
        XSS_NAME,
    )
    assert names >= 1


def chart_points(page) -> int:
    """Points of the first chart's line (input rows/s), 0 while it has none."""
    return page.d.execute_script(
        "const l = document.querySelector('#metrics-charts svg.chart polyline');"
        "return l ? l.getAttribute('points').trim().split(/\\s+/).length : 0"
    )


def see_the_last_minutes_at_once(page, api, jid: str) -> None:
    """A chart opened on a fresh page draws the history the TaskManager kept, not only the
    points polled since: more points than one-a-second polling could have added."""

    def kept():
        tasks = api.get(f"/jobs/{jid}/progress/history")["tasks"]
        return sum(len(t["points"]) for t in tasks) >= 8 or None

    page.wait("eight seconds of history", lambda d: kept(), JOB_WAIT_S)
    page.d.refresh()  # a new page: nothing of the charts in memory (the token stays in sessionStorage)
    opened = time.monotonic()
    page.go(f"#/jobs/{jid}/metrics")
    seen = page.wait(
        "the history drawn on the chart",
        lambda d: (lambda n: (n, time.monotonic() - opened) if n >= 8 else None)(chart_points(page)),
    )
    points, after_s = seen
    assert points > after_s + 2, f"{points} points {after_s:.1f} s after opening: live polling alone, no history"


def see_its_memory_beside_its_limit(page, api, jid: str) -> None:
    """The TaskManager page shows the running task's memory beside its limit, as its TaskManager
    measures it for the limit: "721.3 MB of 3.0 GB (PSS)" on the slot it holds."""
    page.go("#/taskmanagers/tm-1")
    text = page.wait(
        "the task's memory beside its limit",
        lambda d: next((e.text for e in page.els("#tmd-slots td.task-memory") if " of " in e.text), None),
        JOB_WAIT_S,
    )
    memory = next(s["memory"] for s in api.get("/taskmanagers/tm-1")["allocatedSlots"] if s["job_id"] == jid)
    assert re.fullmatch(r"\d+\.\d [MG]B of \d+\.\d GB \((PSS|cgroup charge)\)", text), text
    assert text.endswith(f"of {memory['limit'] / 2**30:.1f} GB ({memory['measure']})"), (text, memory)


def test_failing_job_exception_markup_is_shown_as_text(page, api, tmp_path_factory):
    jid = page.submit(
        tmp_path_factory.mktemp("failing"), "failing_probe.py", FAILING, name="failing probe", restart="none"
    )
    page.go(f"#/jobs/{jid}/exceptions")
    page.wait("the job FAILED", lambda d: page.text("#detail-state") == "FAILED", JOB_WAIT_S)
    page.wait("the exception text", lambda d: EXCEPTION_PROBE in page.text("#detail-exceptions pre.stacktrace"))
    assert EXCEPTION_PROBE in page.text("#detail-root-exception pre")
    assert "RuntimeError" in page.text("#detail-exceptions .exc-name")
    assert not page.els("#exc-probe") and not page.els("#exc-bold")
    assert page.xss() is None
    assert EXCEPTION_PROBE in api.get(f"/jobs/{jid}/exceptions")["root-exception"]


def test_a_viewer_token_is_told_its_role_cannot_change_things(page, tokens, tmp_path_factory):
    page.el("#auth-signout").click()
    assert page.sign_in(tokens["viewer"]) == "signed in · viewer"
    path = tmp_path_factory.mktemp("viewer") / "viewer_upload.py"
    path.write_text(STREAMING)
    page.go("#/submit")
    page.wait("the submit page", lambda d: page.visible("#submit-form"))
    page.el("#f-file").send_keys(str(path))
    page.el("#f-submit").click()
    page.wait("the 403 explained", lambda d: "Your token's role viewer cannot do this" in page.text("#f-message.error"))
    # Logs need the operator role: the log viewer says so in place of the log.
    page.go("#/jobmanager")
    page.wait(
        "the JobManager's log refused in place",
        lambda d: (
            "role viewer cannot do this"
            in page.d.execute_script("return document.querySelector('#jm-logs pre').textContent")
        ),
    )
    page.wait("the rest of the page still showing", lambda d: page.text("#jm-leader dd"))


def test_schedules_are_created_paused_resumed_and_deleted_from_the_page(page, api, tokens):
    if api.http.get("/jobs/schedules").status_code == 404:
        pytest.skip("this dispatcher has no /jobs/schedules")
    page.el("#auth-signout").click()
    assert page.sign_in(tokens["admin"]) == "signed in · admin"
    page.go("#/schedules")
    page.wait("an uploaded pipeline to schedule", lambda d: len(page.els("#s-jar option")) > 1)
    page.el("#s-name").send_keys("hourly <i>probe</i>")
    # The list is drawn again when the page refreshes its jars: a click on a replaced option is retried.
    page.wait("the pipeline chosen", lambda d: page.els("#s-jar option")[1].click() or True)
    page.el("#s-kind option[value='every']").click()
    every = page.el("#s-every")
    every.clear()
    every.send_keys("3600")
    page.el("#s-enabled").click()  # created paused: no job starts
    page.el("#s-submit").click()
    page.wait("the schedule created", lambda d: "created" in page.text("#s-message.ok"))
    row = "#sch-body tr"
    page.wait("the schedule listed", lambda d: page.text(f"{row} td.name a") == "hourly <i>probe</i>")
    assert "paused" in page.text(row)
    page.el(f"{row} .row-actions button").click()  # Resume
    page.wait("the schedule resumed", lambda d: "Pause" in page.text(f"{row} .row-actions"))
    [sc] = api.get("/jobs/schedules")["schedules"]
    assert sc["enabled"] is True and sc["everySeconds"] == 3600
    page.el(f"{row} .row-actions button.danger").click()
    page.accept_confirm()
    page.wait("the schedule deleted", lambda d: not page.els(row) and page.visible("#sch-empty"))
    assert api.get("/jobs/schedules")["schedules"] == []


def test_every_page_renders_without_errors(page):
    for hash_, ready in (
        ("#/overview", "#ov-completed tr"),
        ("#/taskmanagers", "#tm-body tr"),
        ("#/taskmanagers/tm-1", "#tmd-slots tr"),
        ("#/jobmanager", "#jm-leader dd"),
        ("#/schedules", "#page-schedules .panel"),
    ):
        page.go(hash_)
        page.wait(f"{hash_} rendered", lambda d, css=ready: page.els(css) and page.els(css)[0].is_displayed())
        if hash_ == "#/taskmanagers/tm-1":
            # The log viewer lists the TaskManager's log and its drivers' logs, and shows the first.
            page.wait(
                "the TaskManager's log",
                lambda d: (
                    "taskmanager" in page.d.execute_script("return document.querySelector('#tmd-logs pre').textContent")
                ),
            )
            # Read in one script: the page redraws the list on every poll, so an option element held
            # between two WebDriver calls can be stale.
            files = page.wait(
                "the log file list",
                lambda d: d.execute_script(
                    "return [...document.querySelectorAll('#tmd-logs select.log-file option')].map(o => o.value)"
                ),
            )
            assert files[0].startswith("taskmanager") and any(f.startswith("driver-") for f in files), files
    assert page.xss() is None


def test_no_content_security_policy_violations(page):
    refused = [
        e
        for e in page.console()
        if "Content Security Policy" in e.get("message", "") or "Refused to" in e.get("message", "")
    ]
    assert not refused, refused
    errors = [e for e in page.console() if e.get("level") == "SEVERE" and e.get("source") == "javascript"]
    assert not errors, errors
