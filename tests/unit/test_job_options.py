"""Where a job's state partition count comes from (shared/job_options.py), as the driver, the
dispatcher's restore check and the autoscaler read it."""

from __future__ import annotations

import pytest

from shared import job_options


@pytest.mark.parametrize("config, expected", [
    ({}, None),
    ({"pipeline.max-parallelism": 16}, 16),
    ({"pipeline.max-parallelism": "64"}, 64),
    ({"spark.sql.shuffle.partitions": "8", "pipeline.max-parallelism": 16}, 8),  # Spark's own name first
    ({"maxParallelism": 4}, 4),
    ({"pipeline.max-parallelism": "many"}, None),
])
def test_a_jobs_state_partitions_by_either_name(config, expected):
    assert job_options.explicit_state_partitions(config) == expected
    assert job_options.state_partitions(config, 4) == (expected or 4)


def test_the_driver_applies_pipeline_max_parallelism_as_spark_shuffle_partitions():
    from services.taskmanager.runtime.restore import sql_conf_keys

    assert sql_conf_keys({"pipeline.max-parallelism": 16, "spark.sql.ansi.enabled": "true", "other": 1}) == {
        "spark.sql.shuffle.partitions": "16", "spark.sql.ansi.enabled": "true"}
