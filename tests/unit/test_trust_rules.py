"""The rules behind issue 43's control-plane fixes, without services: message freshness, signed
log requests and answers, log endpoints, secret masking, the lineages' Redis rules, and which
connections name a TaskManager's report streams."""

from __future__ import annotations

import fnmatch
import time

import pytest

from services.dispatcher.guards.redaction import MASK, masked_value, names_a_secret
from services.resourcemanager.report_streams import ReportStreams
from shared import log_access, pipeline_redis, restart, streams
from shared.message_auth import MAX_AGE_S, MAX_CLOCK_SKEW_S, staleness
from shared.messages import SubmitJob, wrap


def test_an_envelope_is_fresh_within_the_window_less_the_skew_and_not_from_the_future():
    now = time.time()
    env = wrap(SubmitJob(job_id="0" * 32), sender="dispatcher")
    assert staleness(env.model_copy(update={"sent_at": now - MAX_AGE_S + 5}), now) is None
    assert staleness(env.model_copy(update={"sent_at": now + MAX_CLOCK_SKEW_S - 5}), now) is None
    old = staleness(env.model_copy(update={"sent_at": now - MAX_AGE_S - 5}), now)
    assert old is not None and old.startswith("stale:") and "'dispatcher'" in old
    ahead = staleness(env.model_copy(update={"sent_at": now + MAX_CLOCK_SKEW_S + 5}), now)
    assert ahead is not None and ahead.startswith("from the future:")


def test_a_log_request_is_read_only_with_its_own_signature_time_and_target():
    guard = log_access.LogGuard(request_key=b"r" * 32, answer_key=b"a" * 32)
    header = log_access.sign_request(b"r" * 32, "GET", "/logs/x.log?tail=10")
    assert guard.refusal("GET", "/logs/x.log?tail=10", header) is None
    for method, target, h in (
        ("GET", "/logs/y.log?tail=10", header),
        ("GET", "/logs/x.log?tail=99", header),
        ("GET", "/logs/x.log?tail=10", log_access.sign_request(b"x" * 32, "GET", "/logs")),
        ("GET", "/logs/x.log?tail=10", None),
        ("GET", "/logs/x.log?tail=10", "Bearer hr_x"),
    ):
        assert guard.refusal(method, target, h) is not None, (target, h)
    stale = log_access.sign_request(b"r" * 32, "GET", "/logs", at=time.time() - MAX_CLOCK_SKEW_S - 10)
    assert "clock" in guard.refusal("GET", "/logs", stale)
    answer = guard.sign_answer(header, 200, b"log text")
    assert log_access.answer_checks(b"a" * 32, header, 200, b"log text", answer)
    assert not log_access.answer_checks(b"a" * 32, header, 200, b"other text", answer)
    assert not log_access.answer_checks(
        b"a" * 32, log_access.sign_request(b"r" * 32, "GET", "/logs"), 200, b"log text", answer
    )  # bound to its request
    assert not log_access.answer_checks(b"a" * 32, header, 200, b"log text", None)


@pytest.mark.parametrize(
    "address, ok",
    [
        ("http://tm-1.example:9250", True),
        ("https://[::1]:9250", True),
        ("http://10.0.0.5:80/", True),
        ("http://tm-1:9250/logs", False),
        ("http://tm-1", False),
        ("file:///etc/passwd", False),
        ("gopher://x:70", False),
        ("http://u:p@x:1", False),
        ("http://x:1/?a=b", False),
        ("http://x:1#f", False),
        ("http://x:99999", False),
        ("", False),
        (None, False),
        ("http://x:1" + "0" * 400, False),
    ],
)
def test_a_log_endpoint_is_an_http_host_and_port(address, ok):
    assert (log_access.endpoint_problem(address) is None) is ok


def test_secrets_are_named_by_their_keys_and_found_in_urls_and_arguments():
    for name in (
        "password",
        "db.password",
        "sasl.jaas.config",
        "kafka.sasl.jaas.config",
        "api_token",
        "apiKey",
        "ssl.keystore.key",
        "aws.secret.access",
        "private_key",
        "client-secret",
    ):
        assert names_a_secret(name), name
    for name in ("key.serializer", "sink.table", "keyColumns", "url", "monkey"):
        assert not names_a_secret(name), name
    assert masked_value("x", ["--password", "p", "--db=redis://u:pw@h:1/0", "-v", "--token", "--x"]) == [
        "--password",
        MASK,
        f"--db=redis://u:{MASK}@h:1/0",
        "-v",
        "--token",
        "--x",
    ]


def test_more_than_a_hundred_restarts_must_pause_a_second():
    for ok in (
        {"type": "fixed-delay", "attempts": 100, "delay": 0},
        {"type": "fixed-delay", "attempts": 10**9, "delay": "1 s"},
        {"type": "exponential-delay", "initial-backoff": "100 ms"},
        {"type": "none"},
        {"type": "exponential-delay", "initial-backoff": 0, "attempts-before-reset-backoff": 5},
    ):
        restart.normalise(ok)
    for bad, field in (
        ({"type": "fixed-delay", "attempts": 101, "delay": "500 ms"}, "restartStrategy.delay"),
        ({"type": "failure-rate", "max-failures-per-interval": 1000, "delay": 0}, "restartStrategy.delay"),
        (
            {"type": "exponential-delay", "initial-backoff": "10 ms", "max-backoff": "500 ms"},
            "restartStrategy.initial-backoff",
        ),
    ):
        with pytest.raises(restart.InvalidRestartStrategy) as err:
            restart.normalise(bad)
        assert err.value.field == field


def matches(patterns: list[str], key: str) -> bool:
    return any(fnmatch.fnmatchcase(key, p.replace("[^", "[!")) for p in patterns)


def test_a_lineages_user_reaches_its_bookkeeping_and_the_data_not_the_control_plane_nor_another_lineage():
    mine, other = "a" * 32, "b" * 32
    rules = [r[1:] for r in pipeline_redis.lineage_rules(mine) if r.startswith("~")]
    for key in (
        "clicks",
        "out",
        "headrace",
        "headrace:x",
        "headrace:sinks",
        f"headrace:sink:{mine}:out:attempt",
        "h",
        "hr",
        "tm",
        "x:hr:y",
    ):
        assert matches(rules, key), key
    for key in (
        f"headrace:sink:{other}:out:attempt",
        "headrace:sink:",
        f"headrace:sink:{mine}",
        f"headrace:sink:{mine}x:out",
        "hr:jm:epoch",
        "tm.tm-1",
        "_kombu.x",
        "unacked",
    ):
        assert not matches(rules, key), key
    shared = [r[1:] for r in pipeline_redis.shared_rules().split() if r.startswith("~")]
    assert matches(shared, "clicks") and not matches(shared, f"headrace:sink:{mine}:out:attempt")
    with pytest.raises(ValueError):
        pipeline_redis.lineage_user("a*b")
    assert pipeline_redis.lineage_of_user(pipeline_redis.lineage_user(mine)) == mine
    assert pipeline_redis.lineage_password(b"s" * 32, mine) != pipeline_redis.lineage_password(b"s" * 32, other)


def test_only_a_taskmanagers_own_connection_names_its_report_streams():
    found = ReportStreams()
    found.discover(
        [
            {"name": streams.reporter_name("tm-1"), "user": "taskmanager.tm-1"},
            {"name": streams.reporter_name("tm-2"), "user": "taskmanager.tm-1"},  # tm-1 naming itself tm-2
            {"name": streams.reporter_name("sim"), "user": "default"},  # the admin: a benchmark's simulator
            {"name": streams.reporter_name("a*b"), "user": "default"},
            {"name": "hr-tm-host-1-abc", "user": "taskmanager.tm-3"},
        ]
    )
    assert found.names() == [streams.tm_rm_stream("tm-1"), streams.tm_rm_stream("sim")]
