"""The runner's warm-up flags for each kind of driver a TaskManager starts."""

from services.taskmanager.drivers.process import warm_up_args
from services.taskmanager.runtime.runner import parse_args
from shared.driver_contract import WARM_UP_BATCHES
from shared.settings import Settings


def test_a_driver_a_task_waits_for_skips_the_warm_up_whatever_the_setting():
    assert warm_up_args(in_reserve=False, query=True) == ("--no-warmup",)
    assert warm_up_args(in_reserve=False, query=False) == ("--no-warmup",)


def test_a_driver_in_reserve_runs_the_query_unless_the_setting_is_off():
    assert warm_up_args(in_reserve=True, query=True) == ("--warm-up-batches", str(WARM_UP_BATCHES))
    assert warm_up_args(in_reserve=True, query=True, batches=3) == ("--warm-up-batches", "3")
    assert warm_up_args(in_reserve=True, query=False) == ("--no-warmup-query",)


def test_the_setting_defaults_on_and_reads_the_environment(monkeypatch):
    monkeypatch.delenv("HEADRACE_WARM_UP_QUERY", raising=False)
    assert Settings().warm_up_query is True
    monkeypatch.setenv("HEADRACE_WARM_UP_QUERY", "false")
    assert Settings().warm_up_query is False
    monkeypatch.delenv("HEADRACE_WARM_UP_BATCHES", raising=False)
    assert Settings().warm_up_batches == WARM_UP_BATCHES == 150
    monkeypatch.setenv("HEADRACE_WARM_UP_BATCHES", "20")
    assert Settings().warm_up_batches == 20


def test_the_runner_accepts_each_flag():
    base = ["--parallelism", "2", "--workdir", "/tmp/w", "--events-fd", "3"]
    reserve = parse_args([*base, "--no-warmup-query"])
    assert reserve.no_warmup_query and not reserve.no_warmup
    assert parse_args([*base, "--no-warmup"]).no_warmup
    assert parse_args(base).warm_up_batches == WARM_UP_BATCHES
    assert parse_args([*base, "--warm-up-batches", "7"]).warm_up_batches == 7
