"""The one size parser (shared/sizes.py) against Flink's MemorySize spellings: what it accepts,
what it refuses and how the refusal says to write it; and the options and settings read with it."""

from __future__ import annotations

import pytest

from services.dispatcher.guards import limits
from services.dispatcher.guards.archive_bounds import ArtifactLimits
from services.taskmanager.memory import limit as memory_limit
from shared import job_options, sizes
from shared.settings import Settings

KIB, MIB, GIB, TIB = 1024, 1024**2, 1024**3, 1024**4


# Every label of Flink's MemoryUnit, with and without a space, in any case; a bare number is bytes.
@pytest.mark.parametrize(
    "raw, size",
    [
        ("1024", 1024),
        (" 1024 ", 1024),
        (2048, 2048),
        (2048.0, 2048),
        ("1b", 1),
        ("10 bytes", 10),
        ("64k", 64 * KIB),
        ("64 kb", 64 * KIB),
        ("64KB", 64 * KIB),
        ("64 kibibytes", 64 * KIB),
        ("512m", 512 * MIB),
        ("512 mb", 512 * MIB),
        ("512 MB", 512 * MIB),
        ("512 mebibytes", 512 * MIB),
        ("1g", GIB),
        ("1 gb", GIB),
        ("1G", GIB),
        ("3 gibibytes", 3 * GIB),
        ("2t", 2 * TIB),
        ("2 tb", 2 * TIB),
        ("1 tebibytes", TIB),
        ("9223372036854775807", 2**63 - 1),
    ],
)
def test_flink_spellings_are_accepted(raw, size):
    assert sizes.parse_bytes(raw) == size


# Refused as Flink refuses them, each with what to write instead where there is a Flink spelling.
@pytest.mark.parametrize(
    "raw, says",
    [
        ("1.5g", "a fraction (write '1536m')"),
        ("0.5 kb", "a fraction (write '512b')"),
        ("1.3k", "a fraction"),
        ("1 GiB", "an IEC unit (write '1g'"),
        ("64KiB", "an IEC unit (write '64k'"),
        ("5 PB", "an unknown unit 'PB'"),
        ("10 mbs", "an unknown unit 'mbs'"),
        ("0", "out of range"),
        (0, "out of range"),
        ("9223372036854775808", "out of range"),
        ("-5", "not a size"),
        (-5, "out of range"),
        ("", "not a size"),
        ("lots", "not a size"),
        ("1e3", "not a size"),
        ("1 000", "not a size"),
        (True, "not a size"),
        (None, "not a size"),
        (1.5, "not a size"),
        ([1], "not a size"),
    ],
)
def test_what_flink_refuses_is_refused_with_how_to_write_it(raw, says):
    with pytest.raises(sizes.InvalidSize) as caught:
        sizes.parse_bytes(raw, what="the_setting")
    assert str(caught.value).startswith(f"the_setting: {says}")
    assert sizes.EXPECTED in str(caught.value)


def test_a_default_unit_reads_bare_numbers_as_flink_parse_with_a_unit_does():
    assert sizes.parse_bytes("1024", default_unit="m") == GIB
    assert sizes.parse_bytes(2, default_unit="m") == 2 * MIB
    assert sizes.parse_bytes("2k", default_unit="m") == 2 * KIB  # a unit given wins


@pytest.mark.parametrize(
    "size, spelled", [(GIB, "1g"), (1536 * MIB, "1536m"), (3 * KIB, "3k"), (1000, "1000b"), (2 * TIB, "2t")]
)
def test_spark_spelling_has_no_space_and_no_fraction(size, spelled):
    assert sizes.spark_spelling(size) == spelled


@pytest.mark.parametrize(
    "raw, spelled", [("2g", "2g"), ("2 gb", "2g"), ("1024", "1g"), (512, "512m"), ("1536 mb", "1536m")]
)
def test_spark_executor_memory_follows_spark_and_is_passed_as_spark_spells_it(raw, spelled):
    assert job_options.spark_executor_memory(raw) == spelled
    assert job_options.problems({job_options.EXECUTOR_MEMORY: raw}) == []


@pytest.mark.parametrize("raw", ["1.5g", "2 GiB", "lots", 0])
def test_a_bad_spark_executor_memory_is_refused_at_submission(raw):
    assert [p.option for p in job_options.problems({job_options.EXECUTOR_MEMORY: raw})] == ["spark.executor.memory"]


@pytest.mark.parametrize(
    "raw, limit", [("6g", 6 * GIB), ("6 gb", 6 * GIB), ("off", None), ("OFF", None), ("none", None)]
)
def test_the_memory_limit_option_reads_sizes_and_off_alike_at_submission_and_in_the_taskmanager(raw, limit):
    assert job_options.problems({job_options.MEMORY_LIMIT: raw}) == []
    assert memory_limit.task_limit({job_options.MEMORY_LIMIT: raw}, 3 * GIB) == limit


def test_the_dispatchers_size_settings_name_themselves_when_unreadable():
    assert limits.upload_limit(Settings(max_upload_bytes="500 mb")) == 500 * MIB
    with pytest.raises(ValueError, match="HEADRACE_MAX_UPLOAD_BYTES: a fraction"):
        limits.upload_limit(Settings(max_upload_bytes="0.5g"))
    assert ArtifactLimits.from_settings(Settings(max_artifact_source_bytes="64 kb")).source == 64 * KIB
    with pytest.raises(ValueError, match="max_artifact_uncompressed_bytes: an IEC unit"):
        ArtifactLimits.from_settings(Settings(max_artifact_uncompressed_bytes="1 GiB"))
