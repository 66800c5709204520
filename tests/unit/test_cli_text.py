"""What the `headrace` command prints: its version, a help readable at 80 columns with every
option's names whole, `stop` saying what Headrace does (not Flink's "Suspending job"), and a
failed job's cause as its exception's type and message (`run --wait`, `deploy list`). The client
verbs talk to an in-process fake of the REST API (httpx's MockTransport)."""

from __future__ import annotations

import json
from importlib.metadata import version

import httpx
import pytest
import typer
from typer.testing import CliRunner

from services.cli import app as cli_app
from services.cli import deploy, job_commands

TRACE = (
    'Traceback (most recent call last):\n  File "/job/clicks.py", line 9, in parse\n    return int(raw)\n'
    "ValueError: invalid literal for int() with base 10: 'x'\n"
)


def run(*args: str, width: int = 80):
    return CliRunner().invoke(cli_app.app, list(args), terminal_width=width, env={"COLUMNS": str(width)})


def test_version_is_the_packages():
    out = run("--version")
    assert out.exit_code == 0 and out.output == f"headrace {version('headrace')}\n"


def commands(group, path: tuple[str, ...] = ()):
    # Typer's groups and commands are click's in shape (typer 0.29 ships its own copy of click).
    for name, command in group.commands.items():
        yield (*path, name), command
        if hasattr(command, "commands"):
            yield from commands(command, (*path, name))


def test_every_help_fits_80_columns_with_its_options_names_whole():
    root = typer.main.get_command(cli_app.app)
    checked = 0
    for path, command in commands(root):
        out = run(*path, "--help")
        assert out.exit_code == 0, (path, out.output)
        too_wide = [line for line in out.output.splitlines() if len(line) > 80]
        assert not too_wide, (path, too_wide)
        for param in command.params:
            for name in (*param.opts, *param.secondary_opts):
                if name.startswith("-"):
                    assert name in out.output, f"headrace {' '.join(path)} --help lacks {name}:\n{out.output}"
        checked += 1
    assert checked > 30


def fake_dispatcher(monkeypatch, module, routes: dict[tuple[str, str], object]) -> list[str]:
    """Answers each (method, path) from `routes` (a body, or a list of bodies given in turn)."""
    asked: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        key = (request.method, request.url.path)
        asked.append(f"{request.method} {request.url.path}")
        answer = routes[key]
        if isinstance(answer, list):
            answer = answer.pop(0) if len(answer) > 1 else answer[0]
        return httpx.Response(200, json=answer)

    monkeypatch.setattr(
        module, "client", lambda url: httpx.Client(base_url="http://dispatcher", transport=httpx.MockTransport(handler))
    )
    return asked


def test_stop_says_what_headrace_does(monkeypatch):
    monkeypatch.setattr(job_commands, "POLL_INTERVAL_S", 0)
    fake_dispatcher(
        monkeypatch,
        job_commands,
        {
            ("POST", "/jobs/j1/stop"): {"request-id": "r1"},
            ("GET", "/jobs/j1/savepoints/r1"): [
                {"status": {"id": "IN_PROGRESS"}},
                {"status": {"id": "COMPLETED"}, "operation": {"location": "file:/sp/x"}},
            ],
        },
    )
    out = run("stop", "j1", "--savepoint-path", "/sp")
    assert out.exit_code == 0, out.output
    assert "Suspending" not in out.output
    assert out.output.splitlines()[0] == (
        "Stopping job j1 with a savepoint in /sp; it ends FINISHED once the savepoint is complete."
    )
    assert out.output.splitlines()[-1] == "Savepoint completed. Path: /sp/x"


def test_run_wait_names_the_exception_a_failed_job_ended_with(monkeypatch, tmp_path):
    pipeline = tmp_path / "clicks.py"
    pipeline.write_text("def build(ctx):\n    pass\n")
    fake_dispatcher(
        monkeypatch,
        job_commands,
        {
            ("POST", "/jars/upload"): {"id": "jar1"},
            ("POST", "/jars/jar1/run"): {"jobid": "j1"},
            ("GET", "/jobs/j1"): {"state": "FAILED"},
            ("GET", "/jobs/j1/exceptions"): {
                "exceptionHistory": {"entries": [{"exceptionName": "ValueError", "stacktrace": TRACE}]}
            },
        },
    )
    out = run("run", str(pipeline), "--wait")
    assert out.exit_code == 1
    assert out.output.splitlines()[-1] == "Job j1 FAILED: ValueError: invalid literal for int() with base 10: 'x'"


def test_deploy_list_shows_an_errors_exception_not_a_traces_first_line(monkeypatch):
    error = f"ValueError: {TRACE}"
    fake_dispatcher(
        monkeypatch,
        deploy,
        {
            ("GET", "/deployments"): {
                "deployments": [
                    {
                        "name": "clicks",
                        "lifecycleState": "FAILED",
                        "generation": 2,
                        "stableGeneration": 1,
                        "jobId": None,
                        "error": error,
                    }
                ]
            }
        },
    )
    out = run("deploy", "list")
    assert out.exit_code == 0, out.output
    row = out.output.splitlines()[1]
    assert "Traceback" not in row and row.endswith("ValueError: invalid literal for int() with base 10: 'x'")


@pytest.mark.parametrize("args", [("--version",), ("up", "--help")])
def test_nothing_is_printed_as_rich_tables(args):
    assert "╭" not in run(*args).output and "…" not in json.dumps(run(*args).output)
