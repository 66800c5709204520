"""Pure logic behind issue 21's submission checks: strict booleans, entry names, the client
verbs' dispatcher address and artifact ids that keep their suffix."""

from __future__ import annotations

import pytest
from pydantic_core import PydanticCustomError

from services.cli.client_address import dispatcher_url
from services.dispatcher.guards.strict_fields import entry_problem, strict_bool
from shared.ids import new_artifact_id
from shared.settings import Settings


@pytest.mark.parametrize(
    "raw, expected", [(True, True), (False, False), ("true", True), ("FALSE", False), (" True ", True)]
)
def test_strict_bool_takes_true_and_false(raw, expected):
    assert strict_bool(raw) is expected


@pytest.mark.parametrize("raw", ["yes", "no", "on", "1", 1, 0, "", None, [], "t"])
def test_strict_bool_refuses_everything_else(raw):
    with pytest.raises(PydanticCustomError) as err:
        strict_bool(raw)
    assert "true or false" in str(err.value)


@pytest.mark.parametrize(
    "name, problem",
    [
        ("build", None),
        ("_run2", None),
        ("os.system", "another module"),
        ("pkg:main", "another module"),
        ("class", "identifier"),
        ("1abc", "identifier"),
        ("", "empty"),
        (None, "empty"),
        ("x" * 300, "longer"),
    ],
)
def test_entry_names(name, problem):
    found = entry_problem(name)
    assert (found is None) if problem is None else (problem in found), found


def test_the_dispatcher_address_comes_from_m_or_the_settings():
    def never():
        raise AssertionError("settings read although -m was given")

    assert dispatcher_url("http://h:1/", never) == "http://h:1"
    assert dispatcher_url("h:2", never) == "http://h:2"
    assert dispatcher_url(None, lambda: Settings(dispatcher_port=9999)) == "http://127.0.0.1:9999"
    assert dispatcher_url(None, lambda: Settings(dispatcher_host="0.0.0.0", dispatcher_port=1)) == "http://127.0.0.1:1"
    assert dispatcher_url(None, lambda: Settings(dispatcher_host="::1", dispatcher_port=2)) == "http://[::1]:2"


@pytest.mark.parametrize("name, suffix", [("a" * 300 + ".py", ".py"), ("b" * 200 + ".zip", ".zip"), ("job.py", ".py")])
def test_artifact_ids_keep_the_suffix_the_driver_loads_by(name, suffix):
    artifact_id = new_artifact_id(name)
    assert artifact_id.endswith(suffix) and len(artifact_id) <= 33 + 80
