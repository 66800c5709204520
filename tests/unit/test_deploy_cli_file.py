"""`headrace deploy apply`'s deployment file, read from real YAML text and files (no HTTP): what
body PUT /deployments/{name} gets, and the one-line errors (exit 2) a wrong file ends with.
Also when `--wait` may end, judged from GET /deployments/{name}'s status alone."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from services.cli.app import app
from services.cli.deploy import before_of, wait_verdict
from services.cli.deploy_file import DeploymentFileError, load_deployment_file, parse_deployment

BASE = Path("/deploys")


def parse(text: str):
    return parse_deployment(text, "clicks.yaml", BASE)


def refused(text: str) -> str:
    with pytest.raises(DeploymentFileError) as exc:
        parse(text)
    message = str(exc.value)
    assert message.startswith("clicks.yaml: "), message
    return message


def test_a_full_spec_becomes_the_body_without_its_name():
    d = parse("""
name: clicks
jarId: 0b1c_clicks.py
entryClass: build
kind: pyspark
programArgsList: [--day, "2024-01-01"]
parallelism: 2
flinkConfiguration: {execution.checkpointing.interval: 10 s}
restartStrategy: {type: fixed-delay, attempts: 3}
upgradeMode: savepoint
state: running
rollback: {enabled: true, readyWithin: 60 s}
savepoints: {interval: null, historyMax: 5}
""")
    assert d.name == "clicks" and d.pipeline is None
    assert d.body == {
        "jarId": "0b1c_clicks.py",
        "entryClass": "build",
        "kind": "pyspark",
        "programArgsList": ["--day", "2024-01-01"],
        "parallelism": 2,
        "flinkConfiguration": {"execution.checkpointing.interval": "10 s"},
        "restartStrategy": {"type": "fixed-delay", "attempts": 3},
        "upgradeMode": "savepoint",
        "state": "running",
        "rollback": {"enabled": True, "readyWithin": "60 s"},
        "savepoints": {"interval": None, "historyMax": 5},
    }


def test_an_unquoted_date_stays_the_text_written():
    assert parse("name: a\njarId: j\nprogramArgsList: [--day, 2024-01-01]\n").body["programArgsList"] == [
        "--day",
        "2024-01-01",
    ]


def test_unknown_keys_go_to_the_server_which_names_them():
    assert parse("name: a\njarId: j\nparalelism: 2\n").body == {"jarId": "j", "paralelism": 2}


def test_pipeline_is_taken_from_the_files_directory():
    d = parse("name: a\npipeline: jobs/clicks.py\nparallelism: 1\n")
    assert d.pipeline == BASE / "jobs/clicks.py" and d.body == {"parallelism": 1}
    assert parse("name: a\npipeline: /opt/clicks.py\n").pipeline == Path("/opt/clicks.py")


@pytest.mark.parametrize("text", ["name: a\njarId: j\npipeline: p.py\n", "name: a\nparallelism: 2\n"])
def test_exactly_one_of_jar_id_and_pipeline(text):
    assert "give exactly one of `jarId`" in refused(text)


def test_a_yaml_syntax_error_names_its_line():
    message = refused("name: a\njarId: j\nrollback: {enabled: true\nstate: running\n")
    assert "not valid YAML: line 4" in message


def test_a_repeated_key_is_refused_with_its_line():
    message = refused("name: a\njarId: j\nstate: running\nparallelism: 2\nstate: suspended\n")
    assert "line 5" in message and "'state' appears twice" in message


def test_a_merge_key_may_be_overridden():
    d = parse("base: &b {enabled: true, readyWithin: 60 s}\nname: a\njarId: j\nrollback: {<<: *b, enabled: false}\n")
    assert d.body["rollback"] == {"enabled": False, "readyWithin": "60 s"}


@pytest.mark.parametrize(
    ("text", "found"), [("", "found nothing"), ("- name: a\n", "found a list"), ("just text\n", "found a str")]
)
def test_the_top_level_must_be_a_mapping(text, found):
    message = refused(text)
    assert "the top level must be a mapping" in message and found in message


@pytest.mark.parametrize("name", ["Clicks", "clicks_v2", "-clicks", "clicks-", "a" * 64, ""])
def test_an_invalid_name_is_refused_with_the_rule(name):
    message = refused(f"name: '{name}'\njarId: j\n")
    assert f"name {name!r} is not valid: 1-63 lower-case letters, digits and '-'" in message


@pytest.mark.parametrize("name", ["a", "clicks", "clicks-v2", "0day", "a" * 63])
def test_valid_names(name):
    assert parse(f"name: {name}\njarId: j\n").name == name


def test_a_missing_name_is_refused():
    assert "no `name`" in refused("jarId: j\n")


def test_a_name_yaml_reads_as_a_number_must_be_quoted():
    assert "YAML read 123 as int; quote it" in refused("name: 123\njarId: j\n")
    assert parse("name: '123'\njarId: j\n").name == "123"


def test_program_arguments_yaml_reads_as_other_than_text_must_be_quoted():
    assert "programArgsList[1]: YAML read True as bool" in refused("name: a\njarId: j\nprogramArgsList: [-v, yes]\n")


def test_a_value_without_a_json_form_is_refused():
    assert "has no JSON form" in refused("name: a\njarId: j\nflinkConfiguration: {x: !!binary aGk=}\n")


def test_a_file_and_its_relative_pipeline(tmp_path):
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "clicks.py").write_text("def build(spark):\n    pass\n")
    spec = tmp_path / "clicks.yaml"
    spec.write_text("name: clicks\npipeline: jobs/clicks.py\nparallelism: 2\n")
    d = load_deployment_file(spec)
    assert (d.name, d.body, d.pipeline) == ("clicks", {"parallelism": 2}, tmp_path / "jobs" / "clicks.py")


def test_a_missing_pipeline_is_named_with_where_it_was_looked_for(tmp_path):
    spec = tmp_path / "clicks.yaml"
    spec.write_text("name: clicks\npipeline: clicks.py\n")
    with pytest.raises(DeploymentFileError, match=f"pipeline {tmp_path / 'clicks.py'}: no such file"):
        load_deployment_file(spec)


def test_a_pipeline_must_be_py_or_zip(tmp_path):
    (tmp_path / "clicks.txt").write_text("x")
    spec = tmp_path / "clicks.yaml"
    spec.write_text("name: clicks\npipeline: clicks.txt\n")
    with pytest.raises(DeploymentFileError, match=r"a \.py file or a \.zip"):
        load_deployment_file(spec)


def test_the_command_ends_a_bad_file_with_one_line_and_exit_2(tmp_path):
    runner = CliRunner()
    missing = runner.invoke(app, ["deploy", "apply", str(tmp_path / "nope.yaml")])
    assert missing.exit_code == 2 and "nope.yaml: no such file" in missing.output
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: a\njarId: [j\n")
    result = runner.invoke(app, ["deploy", "apply", str(bad), "-m", "http://127.0.0.1:9"])
    assert result.exit_code == 2 and "not valid YAML: line" in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_wait_rejects_an_unknown_state_before_any_request(tmp_path):
    result = CliRunner().invoke(app, ["deploy", "apply", str(tmp_path / "x.yaml"), "--wait", "RUNNING"])
    assert result.exit_code == 2 and "--wait must be one of DEPLOYING, STABLE" in result.output


# --- when --wait may end -----------------------------------------------------------------------------
# History entries carry the generation of the job at the time (the old one until the new job starts).


def status(state: str | None, *history: tuple[int, str], stable: int | None = None, error: str | None = None) -> dict:
    return {
        "lifecycleState": state,
        "stableGeneration": stable,
        "error": error,
        "history": [
            {"at": 1000 * i, "generation": g, "to": to, "reason": f"r{i}"} for i, (g, to) in enumerate(history)
        ],
    }


STABLE_AT_1 = status("STABLE", (1, "DEPLOYING"), (1, "STABLE"), stable=1)


def test_stable_counts_only_at_the_generation_applied():
    before = before_of({"status": STABLE_AT_1})
    assert wait_verdict(STABLE_AT_1, "STABLE", 2, before) is None
    upgrading = status("UPGRADING", (1, "DEPLOYING"), (1, "STABLE"), (1, "UPGRADING"), stable=1)
    assert wait_verdict(upgrading, "STABLE", 2, before) is None
    done = status("STABLE", (1, "DEPLOYING"), (1, "STABLE"), (1, "UPGRADING"), (2, "STABLE"), stable=2)
    assert wait_verdict(done, "STABLE", 2, before) is True


def test_an_unchanged_spec_that_is_stable_ends_the_wait_at_once():
    assert wait_verdict(STABLE_AT_1, "STABLE", 1, before_of({"status": STABLE_AT_1})) is True


def test_a_new_deployment_waits_for_its_first_transitions():
    new = before_of(None)
    assert wait_verdict(status(None), "STABLE", 1, new) is None
    assert wait_verdict(status("DEPLOYING", (1, "DEPLOYING")), "DEPLOYING", 1, new) is True
    assert wait_verdict(status("FAILED", (1, "DEPLOYING"), (1, "FAILED"), error="boom"), "STABLE", 1, new) is False


def test_failed_or_rolled_back_after_the_request_ends_the_wait():
    before = before_of({"status": STABLE_AT_1})
    rolled = status("ROLLED_BACK", (1, "STABLE"), (2, "ROLLING_BACK"), (1, "ROLLED_BACK"), stable=1, error="not ready")
    assert wait_verdict(rolled, "STABLE", 2, before) is False
    assert wait_verdict(rolled, "ROLLED_BACK", 2, before) is True


def test_a_failed_state_from_before_the_request_does_not_end_it():
    failed = status("FAILED", (1, "STABLE"), (2, "FAILED"), stable=1, error="driver crashed")
    before = before_of({"status": failed})
    assert wait_verdict(failed, "ROLLED_BACK", 1, before) is None  # a rollback starts from FAILED
    assert wait_verdict(failed, "STABLE", 3, before) is None  # a fix applied to a failed deployment
    rolled = status("ROLLED_BACK", (1, "STABLE"), (2, "FAILED"), (1, "ROLLED_BACK"), stable=1)
    assert wait_verdict(rolled, "ROLLED_BACK", 1, before) is True


def test_a_failed_stop_with_savepoint_leaves_it_stable_with_a_new_error():
    before = before_of({"status": STABLE_AT_1})
    kept = status(
        "STABLE",
        (1, "DEPLOYING"),
        (1, "STABLE"),
        (1, "UPGRADING"),
        (1, "STABLE"),
        stable=1,
        error="the stop with a savepoint failed: x",
    )
    assert wait_verdict(kept, "STABLE", 2, before) is False
    assert wait_verdict(kept, "SUSPENDED", 2, before) is False


def test_an_old_error_does_not_end_the_wait():
    refused = status("STABLE", (1, "STABLE"), stable=1, error="a change was refused: x")
    stopping = status("STABLE", (1, "STABLE"), (1, "STABLE"), stable=1, error="a change was refused: x")
    assert wait_verdict(stopping, "SUSPENDED", 2, before_of({"status": refused})) is None


def test_suspended_ends_the_wait_also_when_it_already_was():
    suspended = status("SUSPENDED", (1, "STABLE"), (1, "SUSPENDED"), stable=1)
    assert wait_verdict(suspended, "SUSPENDED", 3, before_of({"status": suspended})) is True
