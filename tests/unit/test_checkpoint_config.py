"""Checkpoint options with Flink's names: defaults, cluster default vs job, validation messages."""

from __future__ import annotations

import pytest

from shared.checkpointing import InvalidCheckpointConfig, checkpoint_config, to_local_path


def test_defaults_are_flinks_except_retained_three_and_retain_on_cancellation():
    cfg = checkpoint_config({})
    assert not cfg.periodic
    assert (cfg.timeout_s, cfg.min_pause_s, cfg.max_concurrent, cfg.tolerable_failures) == (600, 0, 1, 0)
    assert (cfg.num_retained, cfg.retention, cfg.restore_mode) == (3, "RETAIN_ON_CANCELLATION", "NO_CLAIM")


def test_job_options_override_the_cluster_default():
    cluster = {"execution.checkpointing.interval": "10 s", "state.checkpoints.num-retained": 5}
    cfg = checkpoint_config(
        {"execution.checkpointing.interval": "500 ms", "execution.checkpointing.min-pause": "2000"}, cluster
    )
    assert (cfg.interval_s, cfg.min_pause_s, cfg.num_retained) == (0.5, 2.0, 5)


@pytest.mark.parametrize("off", [0, "0", "disabled", ""])
def test_an_interval_of_zero_or_disabled_turns_periodic_checkpoints_off(off):
    cluster = {"execution.checkpointing.interval": "10 s"}
    assert not checkpoint_config({"execution.checkpointing.interval": off}, cluster).periodic
    assert checkpoint_config({}, cluster).interval_s == 10.0


def test_retention_and_restore_mode_names():
    cfg = checkpoint_config(
        {
            "execution.checkpointing.externalized-checkpoint-retention": "no_externalized_checkpoints",
            "execution.savepoint-restore-mode": "claim",
            "execution.savepoint.ignore-unclaimed-state": "true",
        }
    )
    assert (cfg.retention, cfg.restore_mode, cfg.allow_non_restored_state) == ("DELETE_ON_CANCELLATION", "CLAIM", True)


@pytest.mark.parametrize(
    "key, value, says",
    [
        ("execution.checkpointing.interval", "fast", "duration"),
        ("execution.checkpointing.interval", "10 ms", "at least 100 ms"),
        ("execution.checkpointing.timeout", 0, "greater than 0"),
        ("execution.checkpointing.max-concurrent-checkpoints", 0, ">= 1"),
        ("execution.checkpointing.tolerable-failed-checkpoints", -1, ">= 0"),
        ("state.checkpoints.num-retained", "many", ">= 1"),
        ("execution.checkpointing.externalized-checkpoint-retention", "KEEP", "RETAIN_ON_CANCELLATION"),
        ("execution.savepoint-restore-mode", "STEAL", "NO_CLAIM"),
        ("execution.savepoint.path", "s3://bucket/sp", "not supported"),
        ("execution.savepoint.ignore-unclaimed-state", "maybe", "true or false"),
    ],
)
def test_bad_values_name_the_option_and_what_is_expected(key, value, says):
    with pytest.raises(InvalidCheckpointConfig) as err:
        checkpoint_config({key: value})
    assert err.value.field == key and says in str(err.value)


def test_file_uris_and_plain_paths_name_the_same_directory():
    assert to_local_path("file:///tmp/sp") == to_local_path("/tmp/sp") == "/tmp/sp"
    assert to_local_path("file://localhost/tmp/sp") == "/tmp/sp"
    assert to_local_path("file:/tmp/sp") == "/tmp/sp"  # the form Flink prints
    with pytest.raises(ValueError):
        to_local_path("file://tmp/sp")
