"""Who checkpoints a Delta table's log, and when (connectors/delta_log_checkpoint.py): the rules
that need no Spark."""

from __future__ import annotations

import json

import pytest

from services.taskmanager.runtime.connectors.delta_log import last_checkpoint
from services.taskmanager.runtime.connectors.delta_log_checkpoint import (
    NO_INLINE_CHECKPOINT,
    LogCheckpoints,
    creation_properties,
    faithful,
    table_interval,
)
from services.taskmanager.runtime.connectors.delta_maintenance import Policy

OURS = {"delta.checkpointInterval": str(NO_INLINE_CHECKPOINT)}


def test_a_table_the_sink_creates_has_no_inline_checkpoint_unless_asked_to_keep_deltas():
    assert creation_properties(10) == OURS
    assert creation_properties(0) == {}
    assert table_interval(OURS) == NO_INLINE_CHECKPOINT
    assert table_interval({}) == 10 and table_interval({"delta.checkpointInterval": "x"}) == 10


def test_the_sink_checkpoints_only_where_deltas_interval_is_longer_than_its_own(tmp_path):
    every_10 = LogCheckpoints(str(tmp_path), 10)
    assert every_10.wanted(OURS)
    assert every_10.wanted({"delta.checkpointInterval": "100"})
    assert not every_10.wanted({})  # Delta's default: its hook checkpoints every 10 commits already
    assert not LogCheckpoints(str(tmp_path), 0).wanted(OURS)
    assert "inside every 10th commit" in every_10.describe({})
    assert "every 10 commits, after the commit" in every_10.describe(OURS)
    assert "no writer checkpoints" in LogCheckpoints(str(tmp_path), 0).describe(OURS)
    with pytest.raises(ValueError, match="logCheckpoint.every"):
        LogCheckpoints(str(tmp_path), -1)


def test_a_checkpoint_is_due_every_n_versions_after_the_newest_one(tmp_path):
    log = tmp_path / "_delta_log"
    log.mkdir()
    assert last_checkpoint(str(tmp_path)) == 0
    (log / "_last_checkpoint").write_text(json.dumps({"version": 20, "size": 3}))
    ckpt = LogCheckpoints(str(tmp_path), 10)
    assert [v for v in range(18, 33) if ckpt.due(v)] == [30, 31, 32]
    ckpt.committed(None, 25, {})  # Delta's own interval: nothing to do
    assert not ckpt.written


def test_the_cadence_is_read_from_the_sinks_options_before_the_jobs():
    assert Policy().log_checkpoint_every == 10
    assert Policy.read({"logCheckpoint.every": "0"}, {"sink.delta.logCheckpoint.every": "50"}).log_checkpoint_every == 0
    assert Policy.read({}, {"sink.delta.logCheckpoint.every": "50"}).log_checkpoint_every == 50
    with pytest.raises(ValueError, match="logCheckpoint.every.*commits"):
        Policy.read({"logCheckpoint.every": "often"}, {})


def test_delta_rs_writes_only_checkpoints_it_copies_faithfully():
    assert faithful(1, 2, None, None)
    assert faithful(1, 4, None, None)
    assert faithful(3, 7, ["appendOnly", "invariants"], None) is False  # a reader version past 1
    assert faithful(1, 7, ["appendOnly", "changeDataFeed"], None)
    assert not faithful(1, 7, ["appendOnly", "domainMetadata"], None)
    assert not faithful(1, 5, None, None)  # column mapping
    assert not faithful(3, 7, ["deletionVectors"], ["deletionVectors"])
