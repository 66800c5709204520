"""Where a job's state partition count comes from (shared/job_options.py), as the driver, the
dispatcher's restore check and the autoscaler read it."""

from __future__ import annotations

import pytest

from shared import job_options


@pytest.mark.parametrize(
    "config, expected",
    [
        ({}, None),
        ({"pipeline.max-parallelism": 16}, 16),
        ({"pipeline.max-parallelism": "64"}, 64),
        ({"spark.sql.shuffle.partitions": "8", "pipeline.max-parallelism": 16}, 8),  # Spark's own name first
        ({"maxParallelism": 4}, 4),
        ({"pipeline.max-parallelism": "many"}, None),
    ],
)
def test_a_jobs_state_partitions_by_either_name(config, expected):
    assert job_options.explicit_state_partitions(config) == expected
    assert job_options.state_partitions(config, 4) == (expected or 4)


def test_the_driver_applies_pipeline_max_parallelism_as_spark_shuffle_partitions():
    from services.taskmanager.runtime.restore import sql_conf_keys

    assert sql_conf_keys({"pipeline.max-parallelism": 16, "spark.sql.ansi.enabled": "true", "other": 1}) == {
        "spark.sql.shuffle.partitions": "16",
        "spark.sql.ansi.enabled": "true",
    }


@pytest.mark.parametrize(
    "config, expected",
    [
        ({"headrace.latency-mode": True}, job_options.LATENCY_STATE_PARTITIONS),
        ({"headrace.latency-mode": "true"}, job_options.LATENCY_STATE_PARTITIONS),
        ({"headrace.latency-mode": "TRUE", "pipeline.max-parallelism": 8}, 8),  # the job's own choice wins
        ({"headrace.latency-mode": False}, None),
        ({"headrace.latency-mode": "sometimes"}, None),  # refused at submission; reads as off
    ],
)
def test_the_latency_mode_chooses_fewer_state_partitions_unless_the_job_does(config, expected):
    from services.taskmanager.runtime.restore import sql_conf_keys

    assert job_options.chosen_state_partitions(config) == expected
    assert job_options.state_partitions(config, 4) == (expected or 4)
    assert sql_conf_keys(config).get("spark.sql.shuffle.partitions") == (str(expected) if expected else None)


def test_the_latency_mode_does_not_refuse_a_restore_of_another_partition_count():
    """Its 2 partitions are a first start's choice: restoring a snapshot with 4 keeps them."""
    from shared import restore_compat

    snapshot = {"spark": {"batch_id": 7, "state_partitions": 4}}
    config = {"headrace.latency-mode": True}
    assert job_options.explicit_state_partitions(config) is None
    assert restore_compat.check(
        snapshot,
        None,
        new_shuffle_partitions=job_options.explicit_state_partitions(config),
        allow_non_restored_state=False,
    ).ok
    assert not restore_compat.check(snapshot, None, new_shuffle_partitions=2, allow_non_restored_state=False).ok


@pytest.mark.parametrize("value", ["yes", 1, "on", None, ""])
def test_the_latency_mode_is_a_boolean(value):
    [problem] = job_options.problems({"headrace.latency-mode": value})
    assert problem.option == "headrace.latency-mode"
    assert "true or false" in problem.message


@pytest.mark.parametrize("value", [True, False, "true", " False "])
def test_the_latency_mode_takes_json_and_configuration_file_booleans(value):
    assert job_options.problems({"headrace.latency-mode": value}) == []
