"""The restore compatibility rules (shared/restore_compat.py) on fabricated snapshot metadata, and
how the dispatcher reads the planner's answer (services/dispatcher/submission/restore_check.py)."""

from __future__ import annotations

import copy

import pytest

from services.dispatcher.submission import restore_check
from shared import restore_compat as rc

WINDOW = "struct<start:timestamp,end:timestamp>"
WINDOW_JSON = {
    "type": "struct",
    "fields": [
        {"name": "start", "type": "timestamp", "nullable": True, "metadata": {}},
        {"name": "end", "type": "timestamp", "nullable": True, "metadata": {}},
    ],
}


def op(
    op_id,
    kind="aggregate",
    keys=("window", "url"),
    key_types=(WINDOW, "string"),
    values=("count",),
    value_types=("bigint",),
    exprs=None,
    spark_name=None,
):
    spark_name = spark_name or {
        "aggregate": "stateStoreSave",
        "deduplicate": "dedupe",
        "deduplicateWithinWatermark": "dedupeWithinWatermark",
    }.get(kind)
    store = {
        "name": "default",
        "key_names": list(keys),
        "key_types": list(key_types),
        "value_names": list(values),
        "value_types": list(value_types),
    }
    return {
        "id": op_id,
        "kind": kind,
        "spark_name": spark_name,
        "key_names": list(keys),
        "key_exprs": list(exprs or keys),
        "key_types": list(key_types),
        "value_names": list(values),
        "value_types": list(value_types),
        "stores": [store],
    }


def dedupe_op(op_id, key="i"):
    return op(
        op_id,
        "deduplicateWithinWatermark",
        keys=(key,),
        key_types=("bigint",),
        values=("expiresAtMicros",),
        value_types=("bigint",),
    )


CLICKS = {"format": "redis_stream", "options": {"stream": "clicks"}}


def plan(*ops, sources=None):
    return {
        "version": 1,
        "streaming": True,
        "output_mode": "update",
        "sources": sources if sources is not None else [CLICKS],
        "operators": list(ops),
    }


def field(name, typ):
    return {"name": name, "type": typ, "nullable": True, "metadata": {}}


def struct(*fields):
    return {"type": "struct", "fields": list(fields)}


def state_files_op(op_id, name="stateStoreSave", key=None, value=None, partitions=2):
    return {
        "id": op_id,
        "name": name,
        "stores": [
            {
                "name": "default",
                "partitions": partitions,
                "key_schema": key if key is not None else struct(field("window", WINDOW_JSON), field("url", "string")),
                "value_schema": value if value is not None else struct(field("count", "long")),
            }
        ],
    }


def snapshot(old_plan=None, *, operators=None, partitions=2, offsets=1):
    return {
        "format": "headrace-snapshot/1",
        "job_id": "a" * 32,
        "vertex_id": "b" * 32,
        "checkpoint_id": 7,
        "kind": "savepoint",
        "pipeline": {
            "artifact_sha256": "f" * 64,
            "entry": "build",
            "args": ["--x", "1"],
            **({"plan": old_plan} if old_plan is not None else {}),
        },
        "spark": {
            "batch_id": 12,
            "conf": {"spark.sql.shuffle.partitions": str(partitions)},
            "source_offsets": [{"id": "1-0"}] * offsets,
            "state_partitions": partitions,
            "operators": operators if operators is not None else [state_files_op(0, partitions=partitions)],
        },
    }


def check(meta, new_plan, *, shuffle=None, allow=False):
    return rc.check(meta, new_plan, new_shuffle_partitions=shuffle, allow_non_restored_state=allow)


# ---------------------------------------------------------------- types


@pytest.mark.parametrize(
    "json_type, text",
    [
        ("long", "bigint"),
        ("integer", "int"),
        ("short", "smallint"),
        ("byte", "tinyint"),
        ("string", "string"),
        ("void", "void"),
        ("decimal(10,2)", "decimal(10,2)"),
        (WINDOW_JSON, WINDOW),
        ({"type": "array", "elementType": "long", "containsNull": True}, "array<bigint>"),
        (
            {"type": "map", "keyType": "string", "valueType": WINDOW_JSON, "valueContainsNull": True},
            f"map<string,{WINDOW}>",
        ),
        (struct(field("a b", "double"), field("c`d", "date")), "struct<`a b`:double,`c``d`:date>"),
    ],
)
def test_type_string_renders_spark_json_types(json_type, text):
    assert rc.type_string(json_type) == text


def test_type_shape_drops_field_names_like_sparks_positional_check():
    assert rc.type_shape(WINDOW) == "struct<timestamp,timestamp>"
    assert (
        rc.type_shape("struct<`a:b,c`:decimal(10,2),x:map<string,array<struct<y:int>>>>")
        == "struct<decimal(10,2),map<string,array<struct<int>>>>"
    )
    assert rc.type_shape("interval day to second") == "interval day to second"


# ---------------------------------------------------------------- operators, against a recorded plan


def test_same_plan_is_compatible():
    old = plan(op(0))
    verdict = check(snapshot(old), copy.deepcopy(old))
    assert verdict.ok and verdict.problems == [] and verdict.drop_operators == []


def test_changed_grouping_key_with_the_same_types_is_refused_by_name():
    verdict = check(snapshot(plan(op(0))), plan(op(0, keys=("window", "user_id"))))
    assert not verdict.ok
    [problem] = verdict.problems
    assert "operator 0 (aggregate by window, url)" in problem
    assert "its key changed from (window, url) to (window, user_id)" in problem
    assert rc.HINT_RENAMED_KEY in verdict.hints and rc.HINT_CHANGED_STATE in verdict.hints


def test_changed_key_types_show_old_and_new_types():
    verdict = check(snapshot(plan(op(0))), plan(op(0, keys=("window", "i"), key_types=(WINDOW, "bigint"))))
    [problem] = verdict.problems
    assert f"was (window: {WINDOW}, url: string), now (window: {WINDOW}, i: bigint)" in problem


def test_added_grouping_key_is_refused():
    new = plan(op(0, keys=("window", "url", "user_id"), key_types=(WINDOW, "string", "string")))
    [problem] = check(snapshot(plan(op(0))), new).problems
    assert "to (window, url, user_id)" in problem and "key types changed" in problem


def test_computed_keys_are_compared_by_expression_not_by_sparks_made_up_name():
    old = plan(op(0, keys=("_groupingexpression",), key_types=("string",), exprs=("upper(url)",)))
    assert check(snapshot(old), copy.deepcopy(old)).ok
    new = plan(op(0, keys=("_groupingexpression",), key_types=("string",), exprs=("lower(url)",)))
    [problem] = check(snapshot(old), new).problems
    assert "from (upper(url)) to (lower(url))" in problem


def test_changed_aggregate_buffers_are_refused():
    new = plan(op(0, values=("sum", "count"), value_types=("double", "bigint")))  # count() -> avg()
    [problem] = check(snapshot(plan(op(0))), new).problems
    assert "state values changed: was (count: bigint), now (sum: double, count: bigint)" in problem


def test_changed_aggregate_with_the_same_buffer_types_is_refused_by_name():
    new = plan(op(0, values=("sum",), value_types=("bigint",)))  # count() -> sum(n)
    [problem] = check(snapshot(plan(op(0))), new).problems
    assert "aggregates changed" in problem and "(count: bigint)" in problem and "(sum: bigint)" in problem


def test_changed_operator_kind_is_refused():
    verdict = check(
        snapshot(plan(op(0))),
        plan(op(0, "deduplicate", keys=("url",), key_types=("string",), values=("__dummy__",), value_types=("void",))),
    )
    [problem] = verdict.problems
    assert "operator 0 (aggregate by window, url) in the snapshot is operator 0 (deduplicate by url)" in problem


def test_new_operator_is_refused_because_spark_cannot_add_state():
    verdict = check(snapshot(plan(op(0))), plan(op(0), dedupe_op(1)))
    [problem] = verdict.problems
    assert "operator 1 (deduplicateWithinWatermark by i) is new" in problem
    assert rc.HINT_NO_NEW_STATE in verdict.hints


def test_first_stateful_operator_is_refused():
    verdict = check(snapshot(plan(), operators=[]), plan(op(0)))
    assert "operator 0 (aggregate by window, url) is new" in verdict.problems[0]


def test_removed_trailing_operator_needs_allow_non_restored_state():
    meta = snapshot(plan(op(0), dedupe_op(1)))
    refused = check(meta, plan(op(0)))
    [problem] = refused.problems
    assert "operator 1 (deduplicateWithinWatermark by i) is not in the new pipeline" in problem
    assert rc.HINT_ALLOW_DROP in refused.hints and refused.drop_operators == []
    allowed = check(meta, plan(op(0)), allow=True)
    assert allowed.ok and allowed.drop_operators == [1]


def test_snapshot_taken_before_the_first_batch_constrains_nothing():
    meta = snapshot(plan(op(0)), partitions=2)
    meta["spark"]["batch_id"] = -1
    assert check(meta, plan(dedupe_op(0)), shuffle=8).ok


def test_removed_leading_operator_is_refused_even_with_allow_non_restored_state():
    meta = snapshot(plan(op(0), dedupe_op(1)))
    verdict = check(meta, plan(dedupe_op(0)), allow=True)  # the aggregate went: the dedupe is now operator 0
    assert not verdict.ok and verdict.drop_operators == []
    assert any(
        "operator 0 (aggregate by window, url) in the snapshot is operator 0 (deduplicateWithinWatermark" in p
        for p in verdict.problems
    )
    assert any("cannot be dropped with allowNonRestoredState" in p for p in verdict.problems)
    assert rc.HINT_DROP_ONLY_TRAILING in verdict.hints
    # Without the flag, the hint does not send the user to a flag that cannot help.
    assert rc.HINT_ALLOW_DROP not in check(meta, plan(dedupe_op(0))).hints


def test_join_stores_are_compared_one_by_one():
    def join(value_types):
        key = {"key_names": ["field0"], "key_types": ["bigint"]}
        stores = [
            {"name": "left-keyToNumValues", **key, "value_names": ["value"], "value_types": ["bigint"]},
            {
                "name": "left-keyWithIndexToValue",
                "key_names": ["field0", "index"],
                "key_types": ["bigint", "bigint"],
                "value_names": None,
                "value_types": value_types,
            },
        ]
        return {
            "id": 0,
            "kind": "join",
            "spark_name": "symmetricHashJoin",
            "key_names": ["field0"],
            "key_exprs": ["i"],
            "key_types": ["bigint"],
            "value_names": None,
            "value_types": None,
            "stores": stores,
        }

    old = plan(join(["bigint", "string", "boolean"]))
    assert check(snapshot(old), plan(join(["bigint", "string", "boolean"]))).ok
    [problem] = check(snapshot(old), plan(join(["bigint", "boolean"]))).problems
    assert problem.startswith("operator 0 (join on i): its state values in state store left-keyWithIndexToValue")


# ---------------------------------------------------------------- operators, against state schema files only


def test_without_a_recorded_plan_the_state_schema_files_are_compared():
    meta = snapshot()  # no plan: an older snapshot
    assert check(meta, plan(op(0))).ok
    [problem] = check(meta, plan(op(0, keys=("window", "i"), key_types=(WINDOW, "bigint")))).problems
    assert f"was (window: {WINDOW}, url: string), now (window: {WINDOW}, i: bigint)" in problem
    [problem] = check(meta, plan(op(0, keys=("window", "user_id")))).problems
    assert "was (window" in problem and "url: string" in problem and "user_id: string" in problem


def test_state_files_compare_nested_types_positionally_and_skip_made_up_names():
    nested_renamed = struct(
        field("window", struct(field("a", "timestamp"), field("b", "timestamp"))),
        field("_groupingexpression", "string"),
    )
    meta = snapshot(operators=[state_files_op(0, key=nested_renamed)])
    new = plan(op(0, keys=("window", "_groupingexpression"), exprs=("window", "upper(url)")))
    assert check(meta, new).ok
    top_renamed = struct(field("w", WINDOW_JSON), field("_groupingexpression", "string"))
    [problem] = check(snapshot(operators=[state_files_op(0, key=top_renamed)]), new).problems
    assert problem == (
        f"operator 0 (aggregate by w): its key changed: was (w: {WINDOW}, _groupingexpression: "
        f"string), now (window: {WINDOW}, _groupingexpression: string)"
    )


def test_state_files_operator_names_map_to_kinds():
    meta = snapshot(
        operators=[
            state_files_op(
                0, name="dedupe", key=struct(field("user_id", "string")), value=struct(field("__dummy__", "void"))
            )
        ]
    )
    assert check(
        meta,
        plan(
            op(0, "deduplicate", keys=("user_id",), key_types=("string",), values=("__dummy__",), value_types=("void",))
        ),
    ).ok
    [problem] = check(meta, plan(op(0))).problems
    assert "operator 0 (deduplicate by user_id) in the snapshot is operator 0 (aggregate by window, url)" in problem


def test_operator_without_spark_metadata_is_compared_by_its_schemas():
    meta = snapshot(operators=[{**state_files_op(0), "name": None}])
    assert check(meta, plan(op(0))).ok
    [problem] = check(meta, plan(op(0, keys=("window", "i"), key_types=(WINDOW, "bigint")))).problems
    assert problem.startswith("operator 0 (stateful operator by window, url): its key types changed")


def test_unknown_schemas_only_compare_the_operators_kind():
    unknown = {"name": "default", "partitions": 2, "key_schema": None, "value_schema": None}
    meta = snapshot(operators=[{"id": 0, "name": "stateStoreSave", "stores": [unknown]}])
    assert check(meta, plan(op(0, keys=("user_id",), key_types=("string",)))).ok


# ---------------------------------------------------------------- partitions, sources, configuration


def test_explicit_different_shuffle_partitions_are_refused():
    meta = snapshot(plan(op(0)), partitions=4)
    verdict = check(meta, None, shuffle=8)
    assert verdict.problems == [
        "spark.sql.shuffle.partitions is set to 8, but the snapshot's state has 4 partitions "
        "(Spark would keep 4 and ignore the option)"
    ]
    assert verdict.hints == [
        "the state partition count is fixed when a job first starts (like Flink's max "
        "parallelism): drop the option or set it to 4; parallelism can still change"
    ]
    assert check(meta, None, shuffle=4).ok
    assert check(meta, None, shuffle=None).ok


def test_partition_count_falls_back_to_the_stores_and_the_conf():
    meta = snapshot(plan(op(0)), partitions=3)
    del meta["spark"]["state_partitions"]
    assert not check(meta, None, shuffle=2).ok
    meta["spark"]["operators"] = []
    assert rc.state_partitions(meta["spark"]) == 3  # from the pinned conf


def test_changed_source_stream_is_refused():
    old = plan(op(0))
    new = plan(op(0), sources=[{"format": "redis_stream", "options": {"stream": "clicks-v2"}}])
    verdict = check(snapshot(old), new)
    assert verdict.problems == ["source 0 changed: was redis_stream(stream=clicks), now redis_stream(stream=clicks-v2)"]
    assert verdict.hints == [rc.HINT_FRESH_SOURCE]


def test_changed_source_format_and_count_are_refused():
    old = plan(op(0))
    new = plan(
        op(0),
        sources=[
            {"format": "datagen", "options": {"seed": "1"}},
            {"format": "redis_stream", "options": {"stream": "clicks"}},
        ],
    )
    problems = check(snapshot(old), new).problems
    assert "source 0 changed: was redis_stream(stream=clicks), now datagen(seed=1)" in problems
    assert any("reads 2 source(s), the snapshot has offsets for 1" in p for p in problems)


def test_sources_compare_only_options_both_sides_recorded():
    old = plan(op(0), sources=[{"format": "redis_stream", "options": {}}])
    assert check(snapshot(old), plan(op(0))).ok


def test_without_a_recorded_plan_only_the_number_of_sources_is_compared():
    assert check(snapshot(offsets=1), plan(op(0))).ok
    [problem] = check(snapshot(offsets=2), plan(op(0))).problems
    assert "reads 1 source(s), the snapshot has offsets for 2" in problem


def test_batch_pipeline_cannot_start_from_a_snapshot():
    batch = {"version": 1, "streaming": False, "output_mode": None, "sources": [], "operators": []}
    assert "batch job" in check(snapshot(plan(op(0))), batch).problems[0]


def test_message_lists_every_problem_then_what_to_do():
    verdict = check(snapshot(plan(op(0)), partitions=2), plan(op(0, keys=("window", "user_id"))), shuffle=5)
    text = verdict.message(rc.describe_snapshot(snapshot()))
    assert text.startswith(f"The job cannot start from savepoint 7 of job {'a' * 32}:\n  - spark.sql.shuffle")
    assert "\n  - operator 0 (aggregate by window, url): its key changed" in text
    assert "\nWhat to do:\n  - the state partition count is fixed" in text


# ---------------------------------------------------------------- the dispatcher's side


def test_same_pipeline_runs_the_configuration_rules_without_planning(caplog):
    meta = snapshot(plan(op(0)), partitions=2)
    same = dict(
        python="/nonexistent/python",
        artifact_path="/nonexistent.py",
        artifact_sha256="f" * 64,
        entry="build",
        args=["--x", "1"],
        parallelism=3,
        snapshot_meta=meta,
    )
    restore_check.check_restore(config={}, **same)
    assert "cannot start the planner" not in caplog.text  # it did not try
    restore_check.check_restore(config={}, **{**same, "args": ["--x", "2"]})
    assert "cannot start the planner with /nonexistent/python" in caplog.text  # a changed pipeline is planned
    with pytest.raises(restore_check.RestoreIncompatible) as err:
        restore_check.check_restore(config={"spark.sql.shuffle.partitions": "6"}, **same)
    assert "set to 6, but the snapshot's state has 2 partitions" in err.value.message
    assert "drop the option or set it to 2" in err.value.hint


def test_configuration_flags_are_read_like_flinks():
    assert restore_check.allow_non_restored({"execution.savepoint.ignore-unclaimed-state": "true"})
    assert restore_check.allow_non_restored({"execution.savepoint.ignore-unclaimed-state": True})
    assert not restore_check.allow_non_restored({})
    assert restore_check.explicit_shuffle_partitions({"spark.sql.shuffle.partitions": " 4 "}) == 4
    assert restore_check.explicit_shuffle_partitions({}) is None


def test_planner_results_are_read_by_whose_fault_a_failure_is():
    signature = plan(op(0))
    assert restore_check.interpret({"ok": True, "plan": signature}, artifact_path="/a/p.py", entry="build") == signature
    assert (
        restore_check.interpret(
            {"ok": False, "stage": "spark", "error": "JVM died"}, artifact_path="/a/p.py", entry="build"
        )
        is None
    )
    assert restore_check.interpret({"reason": "timed out"}, artifact_path="/a/p.py", entry="build") is None
    with pytest.raises(restore_check.RestoreIncompatible) as err:
        restore_check.interpret(
            {"ok": False, "stage": "build", "error": "NameError: name 'F' is not defined"},
            artifact_path="/a/p.py",
            entry="build",
        )
    assert "p.py (build) could not be built" in err.value.message and "NameError" in err.value.message
