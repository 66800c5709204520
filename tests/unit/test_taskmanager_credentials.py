"""Pure logic of the per-TaskManager credentials: ids, ACL rule arguments, ACL files, compose
variables, the inspection-only remote-control table. (What Redis makes of the rules is tested
against a real server in tests/integration/test_redis_acl_taskmanagers.py.)"""

from __future__ import annotations

import pytest

from services.cluster import compose_credentials, redis_auth
from services.cluster import taskmanager_credentials as creds
from services.taskmanager import remote_control
from shared import cluster_keys

SECRET = bytes(range(32))


@pytest.mark.parametrize("bad", ["", "tm-*", "tm 1", "-tm", "tm[1]", "a" * 101, "tm\\1", "tm:1"])
def test_ids_that_would_widen_a_key_pattern_are_refused(bad):
    with pytest.raises(ValueError, match="must be 1-100 letters, digits"):
        redis_auth.taskmanager_user(bad)


def test_user_names_round_trip():
    assert redis_auth.taskmanager_user("host-1a2b.c_d") == "taskmanager.host-1a2b.c_d"
    assert redis_auth.taskmanager_of("taskmanager.tm-3") == "tm-3"
    assert redis_auth.taskmanager_of("taskmanager") is None and redis_auth.taskmanager_of("jobmanager") is None


def test_a_selector_is_one_acl_setuser_argument():
    args = creds.rule_args(redis_auth.taskmanager_rules("tm-1"))
    xadd = [a for a in args if a.endswith("+xadd)")]
    assert xadd == ["(~hr:stream:rm:tm:tm-1 ~hr:stream:jm:tm:tm-1 ~hr:stream:dlq:tm:tm-1 +xadd)"]
    assert "~tm.tm-1" in args and "~hr:stream:tm:tm-1" in args
    assert not any(a in ("~tm.*", "~hr:stream:tm:*", "~hr:*", "~*") for a in args)
    # The remote-control channel is in a subscribe-only selector, never with +publish.
    pidbox = [a for a in args if "celery.pidbox" in a and a.startswith("(&")]
    assert pidbox and all("+publish" not in a for a in pidbox)


def test_every_publisher_gets_xadd_alone_on_streams_it_does_not_consume():
    for service in redis_auth.SERVICES:
        args = creds.rule_args(redis_auth.rules(service))
        full = {a[1:] for a in args if a.startswith("~")}
        for selector in [a for a in args if a.startswith("(")]:
            streams_in_it = {p[1:] for p in selector.strip("()").split() if p.startswith("~")}
            assert not (streams_in_it & full), (service, selector)
        assert "hr:stream:dlq" not in full, service  # nobody but the admin trims the dead letters


def test_config_carries_the_derived_keys_and_never_the_secret_or_the_catalog():
    catalog = "postgresql://headrace:catalog-password@db:5432/headrace"
    config = creds.taskmanager_config(
        {"cluster_secret": SECRET.hex(), "home": "/h", "catalog_url": catalog},
        "tm-2",
        "redis://taskmanager.tm-2:pw@h:1/0",
        SECRET,
    )
    assert "cluster_secret" not in config and SECRET.hex() not in str(config)
    assert "catalog_url" not in config and "catalog-password" not in str(config)
    assert config["taskmanager_key"] == cluster_keys.sender_key(SECRET, "tm-2").hex()
    assert config["taskmanager_command_key"] == cluster_keys.command_key(SECRET, "tm-2").hex()


def test_taskmanagers_saved_in_an_acl_file_are_found_again(tmp_path):
    path = tmp_path / "users.acl"
    assert creds.ids_in_acl_file(path) == []
    passwords = {u: "x" for u in redis_auth.USERS}
    path.write_text(redis_auth.acl_file(passwords, {"tm-1": "a", "tm-7": "b"}))
    assert creds.ids_in_acl_file(path) == ["tm-1", "tm-7"]


def test_compose_taskmanagers_need_fixed_distinct_ids(tmp_path):
    compose = tmp_path / "docker-compose.yml"
    compose.write_text("services:\n  a: {command: [taskmanager, --id, tm-1]}\n  b: {command: [jobmanager]}\n")
    assert compose_credentials.compose_taskmanagers(compose) == ["tm-1"]
    compose.write_text(
        "services:\n  a: {command: [taskmanager, --id, tm-1]}\n  b: {command: [taskmanager, --id, tm_1]}\n"
    )
    with pytest.raises(ValueError, match="share variable names"):
        compose_credentials.compose_taskmanagers(compose)
    compose.write_text("services:\n  a: {command: [taskmanager, --slots, '2']}\n")
    with pytest.raises(ValueError, match="without --id"):
        compose_credentials.compose_taskmanagers(compose)


def test_remote_control_keeps_inspection_and_refuses_the_rest():
    from celery.worker import control

    table = remote_control.handlers()
    assert table["ping"] is control.Panel.data["ping"]
    assert table["active_queues"] is control.Panel.data["active_queues"]
    for command in (
        "shutdown",
        "pool_restart",
        "revoke",
        "add_consumer",
        "cancel_consumer",
        "rate_limit",
        "time_limit",
        "autoscale",
        "pool_grow",
        "pool_shrink",
        "disable_events",
        "conf",
        "memdump",
    ):
        assert table[command] is not control.Panel.data[command]
        assert "disabled on Headrace TaskManagers" in table[command](None)["error"]
    assert control.Panel.data["shutdown"] is not table["shutdown"]  # Celery's own registry is untouched
