"""The Redis keys a job declares (shared/redis_key_grants.py): what a pattern may be, the ACL
rules its lineage's user gets, and the submission check of a cluster that requires them."""

from __future__ import annotations

import fnmatch

import pytest

from services.dispatcher.errors import ApiError
from services.dispatcher.submission.submitter import check_config
from shared import job_options, pipeline_redis
from shared import redis_key_grants as grants
from shared.settings import Settings

READ, WRITE = grants.READ_OPTION, grants.WRITE_OPTION
CONTROL_AND_BOOKKEEPING = (
    "hr:jm:epoch",
    "hr:stream:dlq",
    "tm.tm-1",
    "_kombu.binding.x",
    "unacked_index",
    f"headrace:sink:{'b' * 32}:out:attempt",
)


def reaches(rules: list[str], key: str, mode: str) -> bool:
    """Whether Redis's rules (`~p`, `%R~p`, `%W~p`, `%RW~p`) let `mode` ("R" or "W") of `key`."""
    for rule in rules:
        perms, sep, pattern = rule.partition("~")
        if not sep:
            continue
        allowed = perms.lstrip("%") or "RW"
        if mode in allowed and fnmatch.fnmatchcase(key, pattern.replace("[^", "[!")):
            return True
    return False


@pytest.mark.parametrize(
    "value, expected",
    [
        (["clicks", "counts:*"], ("clicks", "counts:*")),
        ("clicks; counts:*", ("clicks", "counts:*")),
        ("a,b,a", ("a", "b")),
        ([], ()),
        ("", ()),
        ("hrx", ("hrx",)),  # "hr" + "x" is not under "hr:"
        ("headrace:out", ("headrace:out",)),
    ],
)
def test_key_patterns_a_job_may_declare(value, expected):
    assert grants.parse_patterns(value) == expected
    assert job_options.problems({READ: value}) == []


@pytest.mark.parametrize(
    "pattern, says",
    [
        ("*", "would reach the control plane"),
        ("h*", "'hr:'"),
        ("hr:*", "'hr:'"),
        ("hr:jm:epoch", "'hr:'"),
        ("tm.tm-1", "'tm.'"),
        ("t*", "'tm.'"),
        ("_kombu.x", "'_kombu.'"),
        ("un*", "'unacked'"),
        ("unacked_index", "'unacked'"),
        ("headrace:*", "'headrace:sink:'"),
        ("headrace:sink:abc:out", "'headrace:sink:'"),
        ("a*b", "only as its last character"),
        ("a?", "no other glob character"),
        ("a[bc]", "no other glob character"),
        ("two words", "without spaces"),
        ("x" * 300, "at most 256"),
    ],
)
def test_a_pattern_that_reaches_headraces_own_keys_or_is_not_plain_is_refused(pattern, says):
    with pytest.raises(grants.RefusedValue, match=None) as refused:
        grants.parse_patterns([pattern])
    assert says in str(refused.value)
    [problem] = job_options.problems({WRITE: [pattern]})
    assert problem.option == WRITE and says in problem.message and '"clicks"' in problem.message


def test_other_refused_values():
    for value in (5, None, [""], [5], {"a": 1}):
        assert job_options.problems({READ: value}), value
    assert "at most 64" in job_options.problems({READ: [f"k{n}" for n in range(65)]})[0].message


def test_a_declaring_lineages_user_reaches_its_keys_its_bookkeeping_and_nothing_else():
    lineage = "a" * 32
    declared = grants.grants_of({READ: ["clicks", "shared:*"], WRITE: "out;out:*"})
    assert declared == grants.KeyGrants(read=("clicks", "shared:*"), write=("out", "out:*"))
    rules = pipeline_redis.lineage_rules(lineage, declared.acl_rules())
    for key in ("clicks", "shared:x", "out", "out:1"):
        assert reaches(rules, key, "R"), key
    for key in ("out", "out:1", f"headrace:sink:{lineage}:out:attempt"):
        assert reaches(rules, key, "W"), key
    for key in ("clicks", "shared:x"):  # read-only: no XADD, XTRIM or DEL
        assert not reaches(rules, key, "W"), key
    for key in ("another-jobs-out", "clicksx", "outx", *CONTROL_AND_BOOKKEEPING):
        assert not reaches(rules, key, "R") and not reaches(rules, key, "W"), key
    # No declaration: every data key, as before.
    assert grants.grants_of({"noop.duration": 1}) is None
    everything = pipeline_redis.lineage_rules(lineage)
    assert reaches(everything, "another-jobs-out", "W")
    assert not any(reaches(everything, key, "R") for key in CONTROL_AND_BOOKKEEPING[:-1])
    # Declaring nothing at all reaches only the bookkeeping.
    nothing = pipeline_redis.lineage_rules(lineage, grants.grants_of({READ: []}).acl_rules())
    assert not reaches(nothing, "clicks", "R") and reaches(nothing, f"headrace:sink:{lineage}:x:y", "W")


def test_a_cluster_that_requires_declarations_refuses_a_job_without_them():
    required = Settings(pipeline_redis_keys="declared")
    with pytest.raises(ApiError) as refused:
        check_config({"execution.checkpointing.interval": "10 s"}, required)
    assert refused.value.status == 400
    [problem] = refused.value.problems
    assert problem.field == WRITE and "pipeline_redis_keys: declared" in problem.text()
    check_config({WRITE: ["out"], READ: []}, required)
    check_config({READ: []}, required)
    check_config({}, Settings())  # shared (the default): nothing to declare


@pytest.mark.parametrize(
    "a, b, common",
    [
        ("clicks", "clicks", True),
        ("clicks", "clicks2", False),
        ("clicks*", "clicks2", True),
        ("clicks2", "clicks*", True),
        ("click*", "clicks:*", True),
        ("tenant-a:*", "tenant-b:*", False),
        ("a*", "b", False),
        ("clicks:out", "clicks:*", True),
    ],
)
def test_patterns_overlap_when_some_key_matches_both(a, b, common):
    assert grants.overlap(a, b) is common
    assert grants.overlap(b, a) is common


def test_only_writes_clash():
    mine = grants.KeyGrants(read=("shared-src",), write=("out-a", "counts:*"))
    assert grants.write_clash(mine, grants.KeyGrants(read=("out-a",), write=("out-b",))) is None
    assert grants.write_clash(mine, grants.KeyGrants(write=("counts:eu",))) == ("counts:*", "counts:eu")
    assert grants.write_clash(grants.KeyGrants(read=("x",)), grants.KeyGrants(write=("x",))) is None


# --- what a job that declares nothing gets: its connectors' claims (pipeline_redis_keys: connectors)


def test_a_connector_claims_whole_keys_outside_headraces_own():
    assert grants.claim_problem(("clicks",), ("counts",), {}) is None
    assert "whole keys" in grants.claim_problem((), ("counts:*",), {})
    assert "'hr:'" in grants.claim_problem(("hr:jm:epoch",), (), {})
    assert "at most 256" in grants.claim_problem(("x" * 300,), (), {})


def test_a_claimed_write_is_refused_while_another_lineage_writes_the_stream():
    others = {"a" * 32: ("counts",), "b" * 32: ("tenant-b:*",)}
    problem = grants.claim_problem((), ("counts",), others)
    assert "a" * 32 in problem and "'counts'" in problem and "Stop that job" in problem
    assert "b" * 32 in grants.claim_problem((), ("tenant-b:out",), others)
    # Reading another lineage's output is allowed, as with Kafka topics.
    assert grants.claim_problem(("counts", "tenant-b:out"), ("mine",), others) is None


def test_a_lineage_users_rules_as_redis_lists_them():
    lineage = "c" * 32
    listed = [f"~headrace:sink:{lineage}:*", "%R~clicks", "~counts", "%RW~both", "%W~w-only", "~tenant:*"]
    # What a re-deploy keeps of its claims: whole data keys, with their access.
    assert grants.claimed_rules(listed) == ["%R~clicks", "~counts", "~both", "~w-only"]
    # What it writes, for other lineages' claims: declared prefixes too, never its bookkeeping.
    assert grants.written_patterns(listed) == ("counts", "both", "w-only", "tenant:*")
    # A user that reaches every data key (pipeline_redis_keys: shared) owns no stream alone.
    every = [f"~{p}" for p in pipeline_redis.data_patterns()]
    assert grants.written_patterns(every) == () and grants.claimed_rules(every) == []
