"""The CLI's REST call tells a dispatcher that is slow to answer from one that cannot be reached:
a submission from a savepoint waits for the restore check, which may take minutes on a loaded
machine, and "is the cluster up?" sent the reader the wrong way."""

from __future__ import annotations

import httpx
import pytest
import typer

from services.cli.common import call


def client_raising(error: type[httpx.TransportError]) -> httpx.Client:
    def handler(request: httpx.Request) -> httpx.Response:
        raise error("no answer", request=request)

    return httpx.Client(base_url="http://127.0.0.1:9", transport=httpx.MockTransport(handler), timeout=30)


def test_a_timeout_says_how_long_it_waited_for_what(capsys):
    with pytest.raises(typer.Exit) as exited:
        call(client_raising(httpx.ReadTimeout), "POST", "/jars/j/run", json={}, timeout=180)
    assert exited.value.exit_code == 1
    err = capsys.readouterr().err
    assert "did not answer POST /jars/j/run within 180 s" in err and "is the cluster up" not in err


def test_the_client_timeout_is_named_when_the_call_sets_none(capsys):
    with pytest.raises(typer.Exit):
        call(client_raising(httpx.ReadTimeout), "GET", "/jobs/overview")
    assert "within 30 s" in capsys.readouterr().err


def test_a_refused_connection_asks_whether_the_cluster_is_up(capsys):
    with pytest.raises(typer.Exit):
        call(client_raising(httpx.ConnectError), "GET", "/jobs/overview")
    assert "cannot reach the dispatcher at http://127.0.0.1:9: is the cluster up?" in capsys.readouterr().err
