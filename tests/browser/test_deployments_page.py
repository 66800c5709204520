"""The Deployments page (#/deployments, #/deployments/<name>) in headless Chromium against a real
cluster with authentication on: a deployment of a no-op job made with `PUT /deployments/{name}`
is listed STABLE with a link to its job; a rollback with nothing to roll back to shows the
server's refusal; after a second generation the page shows what changed key by key (with the
spec's markup as text) and the lifecycle history newest first; Suspend from the page suspends it,
and a viewer token is told its role cannot.

The REST API makes the deployment's generations (the page has no form for specs) and checks
what the page claims; the page's buttons do the rest.
"""

from __future__ import annotations

import json

import pytest

# The same browser, sign-in and page helpers as the dashboard's own tests, and the same skips
# (no Chromium, chromedriver, selenium or redis-server: that module skips, and so does this one).
from tests.browser.dashboard_page import JOB_WAIT_S, Page, api, browser, tokens  # noqa: F401
from tests.clusters import start_cluster
from tests.waiting import wait_for

NAME = "clicks-dedup"
# A program argument that is markup: the diff and the spec must show it as text.
ARG_PROBE = '<b id="diff-probe">x</b><img src="x" onerror="window.__xss=4">'
ROW = f"#dep-body tr[data-key='{NAME}']"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, pg_url_module):
    # As test_dashboard.py's, without the warm Spark driver: no-op jobs start no Spark.
    c = start_cluster(
        tmp_path_factory.mktemp("deployments-home"),
        catalog_url=pg_url_module,
        taskmanagers=1,
        slots=2,
        warm_drivers=0,
        auth="required",
    )
    yield c
    c.stop()


@pytest.fixture(scope="module")
def page(browser, cluster, tokens, tmp_path_factory):
    browser.get(cluster.dispatcher_url + "/")
    p = Page(browser, tmp_path_factory.mktemp("deployment-screenshots"))
    assert p.sign_in(tokens["admin"]) == "signed in · admin"
    return p


def spec(jar: str, *, parallelism: int, args: list[str]) -> dict:
    # As tests/integration/test_deployments.py's: a no-op task that runs until it is replaced (it ends
    # after 1 s by default) and checkpoints (a generation is ready once its job completed one; no-op
    # jobs have no periodic checkpoints unless asked); upgrades stop it with a savepoint (the default).
    return {
        "jarId": jar,
        "kind": "noop",
        "programArgsList": args,
        "parallelism": parallelism,
        "flinkConfiguration": {"noop.duration": "-1", "execution.checkpointing.interval": "500 ms"},
        "restartStrategy": {"type": "fixed-delay", "attempts": 5, "delay": "200 ms"},
        "rollback": {"enabled": True, "readyWithin": "10 s"},
    }


def put(rest, body: dict) -> None:
    r = rest.http.put(f"/deployments/{NAME}", json=body)
    assert r.status_code == 200, r.text


def wait_deployment(rest, what: str, ok, timeout_s: float = JOB_WAIT_S) -> dict:
    return wait_for(
        f"deployment {NAME} {what}", lambda: rest.get(f"/deployments/{NAME}"), timeout_s, poll_s=0.5, until=ok
    )


def stable_at(generation: int):
    return lambda d: d["status"]["lifecycleState"] == "STABLE" and d["status"]["stableGeneration"] == generation


@pytest.fixture(scope="module")
def jar(api, tmp_path_factory) -> str:
    if api.http.get("/deployments").status_code == 404:
        pytest.skip("this dispatcher has no /deployments")
    return api.upload_noop_pipeline(tmp_path_factory.mktemp("deployment-jar"))


@pytest.fixture(scope="module")
def first_generation(api, jar) -> dict:
    put(api, spec(jar, parallelism=1, args=["--generation", "1"]))
    return wait_deployment(api, "STABLE at generation 1", stable_at(1))


def test_the_list_shows_the_deployment_stable_with_its_job(page, api, first_generation):
    page.go("#/deployments")
    page.wait("the deployment listed", lambda d: page.els(ROW))
    page.wait("the deployment STABLE in the list", lambda d: page.text(f"{ROW} td.state .badge") == "STABLE")
    assert page.el("#nav a.active").text == "Deployments"
    # STABLE is drawn like a RUNNING job.
    assert "state-RUNNING" in page.el(f"{ROW} td.state .badge").get_attribute("class")
    assert page.text(f"{ROW} td.name a") == NAME
    assert page.text(f"{ROW} td:nth-child(3)") == "1"  # generation
    assert page.text(f"{ROW} td:nth-child(4)") == "1"  # stable generation
    [listed] = [d for d in api.get("/deployments")["deployments"] if d["name"] == NAME]
    job_id = listed["jobId"]
    assert job_id
    page.wait(
        "the job's link",
        lambda d: (page.el(f"{ROW} a.job-link").get_attribute("href") or "").endswith(f"#/jobs/{job_id}"),
    )
    page.el(f"{ROW} td.name a").click()
    page.wait("the deployment's page", lambda d: page.visible("#page-deployment") and page.text("#depd-name") == NAME)
    page.wait("its job on its page", lambda d: job_id in page.text("#depd-facts"))


def test_a_rollback_with_nothing_to_roll_back_to_shows_the_servers_refusal(page, api, first_generation):
    page.go(f"#/deployments/{NAME}")
    page.wait("the Rollback button", lambda d: page.visible("#depd-rollback"))
    page.el("#depd-rollback").click()
    page.accept_confirm()
    page.wait("the refusal next to the buttons", lambda d: page.text("#depd-message.error"))
    # The same POST from here: refused the same way (a 409 changes nothing).
    r = api.http.post(f"/deployments/{NAME}/rollback")
    assert r.status_code == 409, r.text
    assert r.json()["errors"][0] in page.text("#depd-message.error")


def test_the_second_generation_shows_its_difference_and_the_history(page, api, jar, first_generation):
    put(api, spec(jar, parallelism=2, args=["--generation", "2", ARG_PROBE]))
    d = wait_deployment(api, "STABLE at generation 2", stable_at(2))
    page.go(f"#/deployments/{NAME}")
    block = "#depd-generations .generation[data-key='2:1']"
    page.wait("generation 2 compared with generation 1", lambda _: page.els(block))
    # Newest first: generation 2's block comes before generation 1's.
    keys = page.d.execute_script(
        "return [...document.querySelectorAll('#depd-generations .generation')].map(g => g.dataset.key)"
    )
    assert keys[:2] == ["2:1", "1:"], keys
    par = f"{block} tr[data-path='parallelism']"
    assert page.text(f"{par} td.diff-change") == "changed"
    assert (page.text(f"{par} td.diff-from"), page.text(f"{par} td.diff-to")) == ("1", "2")
    args = f"{block} tr[data-path='programArgsList']"
    assert page.text(f"{args} td.diff-from") == '["--generation","1"]'
    assert page.text(f"{args} td.diff-to") == json.dumps(["--generation", "2", ARG_PROBE], separators=(",", ":"))
    assert not page.els(f"{block} tr[data-path='jarId']")  # unchanged keys are not listed
    assert not page.els("#diff-probe") and page.xss() is None

    # The history, newest first, as the server has it (of two at the same time, the later listed first).
    history = sorted(reversed(d["status"]["history"]), key=lambda h: h["at"], reverse=True)
    page.wait("the whole history", lambda _: len(page.els("#depd-history tr")) >= len(history))
    newest = "#depd-history tr:first-child"
    assert page.text(f"{newest} td:nth-child(2)") == str(history[0]["generation"])
    assert page.text(f"{newest} td:nth-child(4)") == history[0]["to"]
    assert page.text(f"{newest} td:nth-child(5)") == (history[0]["reason"] or "–")
    assert any(h["generation"] == 2 for h in history)
    # The savepoint generation 1's job stopped with for the upgrade.
    [sp] = d["savepoints"]
    assert sp["trigger"] == "upgrade", d["savepoints"]
    page.wait("the upgrade's savepoint", lambda _: len(page.els("#depd-savepoints tr")) == 1)
    cells = [page.text(f"#depd-savepoints tr td:nth-child({i})") for i in (2, 3, 4, 6)]
    assert cells == [sp["path"], "upgrade", str(sp["generation"]), "yes" if sp["disposed"] else "no"]
    assert not page.visible("#depd-savepoints-empty")

    page.go("#/deployments")
    page.wait(
        "generation 2 in the list",
        lambda _: page.text(f"{ROW} td:nth-child(3)") == "2" and page.text(f"{ROW} td:nth-child(4)") == "2",
    )


def test_suspend_from_the_page_and_a_viewer_is_refused(page, api, tokens, first_generation):
    page.go(f"#/deployments/{NAME}")
    page.wait("the Suspend button", lambda _: page.visible("#depd-suspend") and page.text("#depd-suspend") == "Suspend")
    page.el("#depd-suspend").click()
    page.accept_confirm()
    page.wait("the suspend accepted", lambda _: page.text("#depd-message.ok"))
    d = wait_deployment(api, "SUSPENDED", lambda x: x["status"]["lifecycleState"] == "SUSPENDED")
    assert d["spec"]["state"] == "suspended"
    page.wait(
        "SUSPENDED on the page",
        lambda _: page.text("#depd-state .badge") == "SUSPENDED" and page.text("#depd-suspend") == "Resume",
    )
    # Suspending is a change of the spec: generation 3, which differs from 2 in its state alone.
    assert max(g["generation"] for g in d["generations"]) == 3
    block = "#depd-generations .generation[data-key='3:2']"
    page.wait("generation 3 compared with generation 2", lambda _: page.els(block))
    assert page.attributes(f"{block} tbody tr", "data-path") == ["state"]
    state = f"{block} tr[data-path='state']"
    assert (page.text(f"{state} td.diff-from"), page.text(f"{state} td.diff-to")) == ('"running"', '"suspended"')

    page.el("#auth-signout").click()
    assert page.sign_in(tokens["viewer"]) == "signed in · viewer"
    page.go(f"#/deployments/{NAME}")
    page.wait("the page for a viewer", lambda _: page.text("#depd-suspend") == "Resume")
    page.el("#depd-suspend").click()
    page.accept_confirm()
    page.wait(
        "the 403 explained", lambda _: "Your token's role viewer cannot do this" in page.text("#depd-message.error")
    )
    assert api.get(f"/deployments/{NAME}")["spec"]["state"] == "suspended"


def test_an_autoscaled_deployment_shows_its_evaluations_and_parallelism(page, api, jar):
    name = "autoscaled"
    body = {
        **spec(jar, parallelism=1, args=["--autoscaled"]),
        "autoscaler": {"enabled": True, "minParallelism": 1, "maxParallelism": 2, "stabilization": "0 s"},
    }
    r = api.http.put(f"/deployments/{name}", json=body)
    assert r.status_code == 200, r.text
    page.go(f"#/deployments/{name}")
    page.wait("the autoscaler panel", lambda d: page.visible("#depd-autoscaler"))
    # A no-op task reports no figures: the autoscaler looks and says so.
    page.wait("its last evaluation", lambda d: "too few figures" in page.text("#depd-autoscaler-note"))
    assert page.els("#depd-autoscaler-charts .chart-box")
    assert "Parallelism" in page.text("#depd-facts")
    assert api.http.delete(f"/deployments/{name}?savepoint=false").status_code == 202


def test_the_autoscaler_panels_samples_carry_each_evaluations_figures(page):
    out = page.d.execute_script(
        "return Autoscaler.autoscalerSamples(arguments[0])",
        [
            {"at": 1, "parallelism": 1, "proposed": 2, "outcome": "scale-up", "figures": {"lag": 900, "busy": 1}},
            {"at": 2, "parallelism": 2, "proposed": 2, "outcome": "wait", "figures": {}},
        ],
    )
    assert out == [{"t": 1, "parallelism": 1, "lag": 900, "busy": 1}, {"t": 2, "parallelism": 2}]
    kept = page.d.execute_script(
        "return Autoscaler.decisions(arguments[0]).map((e) => e.at)",
        [{"at": 1, "outcome": "scale-up"}, {"at": 2, "outcome": "keep"}, {"at": 3, "outcome": "scale-down"}],
    )
    assert kept == [3, 1]


def test_the_diff_function_names_nested_keys_by_dotted_paths(page):
    out = page.d.execute_script(
        "return Deployments.diffSpecs(arguments[0], arguments[1])",
        {
            "parallelism": 1,
            "rollback": {"enabled": True, "readyWithin": "30 s"},
            "gone": 1,
            "flinkConfiguration": {"a": {"x": 1, "y": 2}},
        },
        {
            "parallelism": 1,
            "rollback": {"enabled": False},
            "kind": "noop",
            "flinkConfiguration": {"a": {"y": 2, "x": 1}},
        },
    )
    assert out == [
        {"path": "gone", "change": "removed", "from": 1},
        {"path": "kind", "change": "added", "to": "noop"},
        {"path": "rollback.enabled", "change": "changed", "from": True, "to": False},
        {"path": "rollback.readyWithin", "change": "removed", "from": "30 s"},
    ]


def test_no_content_security_policy_violations_or_script_errors(page):
    refused = [
        e
        for e in page.console()
        if "Content Security Policy" in e.get("message", "") or "Refused to" in e.get("message", "")
    ]
    assert not refused, refused
    errors = [e for e in page.console() if e.get("level") == "SEVERE" and e.get("source") == "javascript"]
    assert not errors, errors
    assert page.xss() is None
