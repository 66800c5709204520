"""shared/storage_roots.py and shared/restore_failure.verify on a real temporary filesystem."""

from __future__ import annotations

import os

import pytest

from shared import checkpoint_storage as storage
from shared.restore_failure import SnapshotRestoreError, restoring, verify
from shared.settings import Settings
from shared.storage_roots import OutsideStorageRoots, configured_roots, confine, no_symlinks, parse_roots


@pytest.fixture
def settings(tmp_path) -> Settings:
    return Settings(home=tmp_path / "home", storage_roots=f"{tmp_path}/extra/, file://{tmp_path}/uri")


def test_roots_are_the_checkpoint_and_savepoint_dirs_then_the_setting(settings, tmp_path):
    assert configured_roots(settings) == (
        f"{tmp_path}/home/checkpoints",
        f"{tmp_path}/home/savepoints",
        f"{tmp_path}/extra",
        f"{tmp_path}/uri",
    )
    assert parse_roots(" /a, ,/b ") == ["/a", "/b"] and parse_roots(["/a", " /b"]) == ["/a", "/b"]
    assert Settings(storage_roots=["/x", "/y"]).storage_roots == "/x,/y"  # a YAML list


@pytest.mark.parametrize(
    "bad,fragment",
    [("relative/dir", "not an absolute path"), ("/", "every directory"), ("s3://bucket/x", "scheme 's3'")],
)
def test_a_bad_setting_is_a_clear_error(tmp_path, bad, fragment):
    with pytest.raises(ValueError, match="storage_roots") as err:
        configured_roots(Settings(home=tmp_path, storage_roots=bad))
    assert fragment in str(err.value)


def test_confine_resolves_dots_and_symlinks(settings, tmp_path):
    sp = settings.savepoints
    sp.mkdir(parents=True)
    assert confine(f"file://{sp}/a/../b", settings, what="target") == f"{sp}/b"
    assert confine(f"{tmp_path}/extra/new/deeper", settings, what="target") == f"{tmp_path}/extra/new/deeper"
    (sp / "to-etc").symlink_to("/etc")
    (sp / "to-extra").symlink_to(tmp_path / "extra")
    assert confine(sp / "to-extra" / "x", settings, what="target") == f"{sp}/to-extra/x"  # into another root
    for outside in ("/etc/passwd", f"{sp}/../../../etc", str(sp / "to-etc" / "x"), f"{tmp_path}/extra-not"):
        with pytest.raises(OutsideStorageRoots) as err:
            confine(outside, settings, what="savepoint target")
        assert "outside the allowed storage roots" in str(err.value) and "HEADRACE_STORAGE_ROOTS" in str(err.value)
        assert err.value.roots == configured_roots(settings)
    with pytest.raises(OutsideStorageRoots, match="which resolves to /etc"):
        confine(sp / "to-etc", settings, what="savepoint target")


def test_no_symlinks_checks_every_component_below_the_root(settings, tmp_path):
    sp = settings.savepoints
    real = sp / "savepoint-abcdef-0123456789ab"
    storage.take_empty_snapshot(real, metadata={"kind": "savepoint"})
    assert no_symlinks(real, settings, what="savepoint") == str(real)
    assert no_symlinks(sp / "gone", settings, what="savepoint") == f"{sp}/gone"
    (sp / "link").symlink_to(real)
    (sp / "dirlink").symlink_to(sp)
    for refused in (sp / "link", sp / "dirlink" / real.name, f"{sp}/dirlink/{real.name}/_metadata"):
        with pytest.raises(OutsideStorageRoots, match="goes through the symlink"):
            no_symlinks(refused, settings, what="savepoint")
    with pytest.raises(OutsideStorageRoots, match="not under an allowed storage root"):
        no_symlinks(tmp_path / "elsewhere", settings, what="savepoint")


def test_no_symlinks_accepts_the_real_path_of_a_root_that_is_itself_a_link(tmp_path):
    (tmp_path / "disk").mkdir()
    os.symlink(tmp_path / "disk", tmp_path / "mounted")
    s = Settings(home=tmp_path / "home", storage_roots=str(tmp_path / "mounted"))
    assert no_symlinks(tmp_path / "mounted" / "sp", s, what="savepoint") == f"{tmp_path}/mounted/sp"
    assert no_symlinks(tmp_path / "disk" / "sp", s, what="savepoint") == f"{tmp_path}/disk/sp"


def test_dispose_refuses_a_symlink_and_renames_nothing(tmp_path):
    real = tmp_path / "savepoint-abcdef-0123456789ab"
    storage.take_empty_snapshot(real, metadata={"kind": "savepoint"})
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(storage.SnapshotError, match="is a symlink"):
        storage.dispose(tmp_path / "link")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", real.name] and (real / "_metadata").is_file()


def _snapshot_with_files(tmp_path):
    """A snapshot of a fake Spark checkpoint at batch 2 (offset, commit and state files)."""
    live = tmp_path / "live"
    for d in ("offsets", "commits", "state/0/0"):
        (live / d).mkdir(parents=True)
    for b in range(3):
        (live / "offsets" / str(b)).write_text('v1\n{"batchWatermarkMs":0,"conf":{}}\n{"x":%d}' % b)
        (live / "commits" / str(b)).write_text('v1\n{"nextBatchWatermarkMs":0}')
        (live / "state/0/0" / f"{b + 1}.delta").write_bytes(b"x" * 100)
    return storage.take_snapshot(live, tmp_path / "chk-3", batch_id=2, metadata={"kind": "checkpoint"})


def garble(path):
    path.write_bytes(b"#" * path.stat().st_size)


@pytest.mark.parametrize(
    "damage,fragment",
    [
        (lambda d: (d / "spark/state/0/0/3.delta").write_bytes(b"x" * 10), "was truncated or rewritten"),
        (lambda d: (d / "spark/state/0/0/2.delta").unlink(), "files were deleted"),
        (lambda d: garble(d / "spark/offsets/2"), "not a Spark offset log"),  # same size: found by reading it
        (lambda d: (d / "spark/commits/2").rename(d / "spark/commits/.gone"), "files were deleted"),
    ],
)
def test_verify_finds_a_damaged_snapshot(tmp_path, damage, fragment):
    info = _snapshot_with_files(tmp_path)
    verify(info.path, info.metadata)  # intact
    damage(tmp_path / "chk-3")
    with pytest.raises(SnapshotRestoreError, match=fragment) as err:
        with restoring(info.path):
            verify(info.path, storage.read_metadata(info.path))
    assert str(err.value).startswith(f"the snapshot {info.path} could not be restored: ")
