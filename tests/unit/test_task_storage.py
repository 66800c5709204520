"""What a task is handed of the storage roots and taken back from it (tasks/storage.py): its
attempt directory and its snapshot targets only, never their parents; a snapshot sealed by root
before it is reported; a restore read through a view whose lineage is the one root trusts."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from services.taskmanager.tasks.storage import StorageRefused, StorageRoots, TaskStorage
from shared import safe_fs
from shared import task_protocol as tp
from shared.untrusted_code import UntrustedUser

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="handing directories to another user needs root")

DRIVER = 4243


def storage(ck: Path, uid: int = DRIVER) -> TaskStorage:
    owners = safe_fs.Ownership(driver_uid=lambda u: u in (DRIVER, DRIVER + 1), driver_gid=lambda g: False)
    return TaskStorage(StorageRoots((ck,), owners), UntrustedUser("drv", uid, uid))


def spec(ck: Path, job: str = "job-a", execution: str = "e1", restore_from: str | None = None) -> tp.TaskSpec:
    return tp.TaskSpec(
        job_id=job,
        vertex_id="v",
        execution_id=execution,
        attempt=1,
        parallelism=1,
        checkpoint_dir=str(ck / job / "v" / "live" / execution),
        redis_url="redis://x",
        restore_from=restore_from,
        artifact_sha256="abc",
    )


def owner_mode(p: Path) -> tuple[int, int]:
    st = p.lstat()
    return st.st_uid, stat.S_IMODE(st.st_mode)


def write_snapshot(target: Path, uid: int, lineage: dict, job_id: str = "someone-else") -> None:
    """What a (hostile) driver writes into the target made for it."""
    (target / "spark" / "commits").mkdir(parents=True)
    (target / "spark" / "commits" / "0").write_text("v1")
    (target / "_metadata").write_text(
        json.dumps(
            {
                "job_id": job_id,
                "lineage": lineage,
                "kind": "checkpoint",
                "pipeline": {"plan": {"ops": 1}},
                "spark": {"batch_id": 0},
            }
        )
    )
    for p in (target / "spark", target / "spark" / "commits", target / "spark" / "commits" / "0", target / "_metadata"):
        os.chown(p, uid, uid)
        os.chmod(p, 0o700 if p.is_dir() else 0o600)


def test_only_the_attempt_directory_is_handed_over(tmp_path):
    ck = tmp_path / "ck"
    ck.mkdir()
    s = storage(ck)
    assert s.prepare(spec(ck)) == {}
    assert owner_mode(ck / "job-a" / "v" / "live" / "e1") == (DRIVER, 0o700)
    for d in ("job-a", "job-a/v", "job-a/v/live"):
        assert owner_mode(ck / d) == (0, 0o711), d
    assert s.lineage["id"] == "job-a"


def test_a_live_directory_replaced_by_a_link_is_refused(tmp_path):
    ck, secret = tmp_path / "ck", tmp_path / "root-only"
    (ck / "job-a" / "v").mkdir(parents=True)
    secret.mkdir(mode=0o700)
    (ck / "job-a" / "v" / "live").symlink_to(secret)
    with pytest.raises(safe_fs.UnsafePath):
        storage(ck).prepare(spec(ck))
    assert owner_mode(secret) == (0, 0o700) and list(secret.iterdir()) == []


def test_a_snapshot_is_sealed_with_the_lineage_root_knows_and_taken_back_at_the_end(tmp_path):
    ck = tmp_path / "ck"
    ck.mkdir()
    s = storage(ck)
    s.prepare(spec(ck))
    target = ck / "job-a" / "chk-1"
    s.snapshot_target(target)
    assert owner_mode(target) == (DRIVER, 0o700) and owner_mode(ck / "job-a") == (0, 0o711)
    write_snapshot(target, DRIVER, lineage={"id": "victim-lineage", "generation": 7})
    s.seal(tp.SnapshotTaken(checkpoint_id=1, path=str(target), batch_id=0, state_size=2, duration_ms=1))
    assert owner_mode(target) == (0, 0o700)
    meta = json.loads((target / "_metadata").read_text())
    assert meta["lineage"] == {"id": "job-a", "generation": 0} and meta["job_id"] == "job-a"
    assert meta["pipeline"]["plan"] == {"ops": 1} and meta["pipeline"]["artifact_sha256"] == "abc"
    assert owner_mode(target / "_metadata") == (0, 0o644)
    assert owner_mode(target / "spark" / "commits" / "0") == (DRIVER, 0o644)  # readable through a view
    with pytest.raises(StorageRefused, match="not a target it was given"):
        s.seal(
            tp.SnapshotTaken(checkpoint_id=2, path=str(ck / "job-b" / "chk-1"), batch_id=0, state_size=0, duration_ms=1)
        )
    s.release()
    assert {p.lstat().st_uid for p in target.rglob("*")} == {0}


def test_a_restore_reads_a_view_and_an_unsealed_snapshot_names_no_lineage(tmp_path):
    ck = tmp_path / "ck"
    ck.mkdir()
    first = storage(ck)
    first.prepare(spec(ck))
    sealed = ck / "job-a" / "chk-1"
    first.snapshot_target(sealed)
    write_snapshot(sealed, DRIVER, lineage={"id": "job-a", "generation": 0})
    first.seal(tp.SnapshotTaken(checkpoint_id=1, path=str(sealed), batch_id=0, state_size=2, duration_ms=1))
    first.release()

    again = storage(ck, DRIVER + 1)
    update = again.prepare(spec(ck, job="job-b", execution="e2", restore_from=str(sealed)))
    view = Path(update["restore_from"])
    assert view.parent == ck / "job-b" / "v" / "live" / "e2" and view.name.startswith(".restore-")
    assert (view / "spark" / "commits" / "0").stat().st_ino == (sealed / "spark" / "commits" / "0").stat().st_ino
    assert owner_mode(view) == (0, 0o755)
    assert again.lineage == {"id": "job-a", "generation": 1, "fence": 1}  # a job resumed from job-a's snapshot
    assert again.original(f"cannot restore {view}: damaged") == f"cannot restore {sealed}: damaged"

    forged = ck / "job-x" / "chk-9"
    forged.mkdir(parents=True)
    os.chown(forged, DRIVER, DRIVER)
    write_snapshot(forged, DRIVER, lineage={"id": "job-a", "generation": 3})  # never sealed
    third = storage(ck, DRIVER + 1)
    update = third.prepare(spec(ck, job="job-c", execution="e3", restore_from=str(forged)))
    assert third.lineage == {"id": "job-c", "generation": 0, "fence": 1}
    assert json.loads((Path(update["restore_from"]) / "_metadata").read_text())["lineage"]["id"] == "job-c"


def test_a_storage_root_itself_is_never_handed_over(tmp_path):
    ck = tmp_path / "ck"
    ck.mkdir()
    s = storage(ck)
    s.prepare(spec(ck))
    with pytest.raises(StorageRefused, match="storage root itself"):
        s.snapshot_target(ck)
    with pytest.raises(StorageRefused, match="not under a storage root"):
        s.snapshot_target(tmp_path / "elsewhere" / "savepoint-1")


def test_a_view_of_another_snapshot_is_made_only_for_the_tasks_own_lineage(tmp_path):
    """A sink committed a newer checkpoint than the one restored (SinkAheadOfRestore): the task
    reads it through a view; a snapshot of another lineage is refused."""
    ck = tmp_path / "ck"
    ck.mkdir()
    first = storage(ck)
    first.prepare(spec(ck))
    own = ck / "job-a" / "chk-2"
    first.snapshot_target(own)
    write_snapshot(own, DRIVER, lineage={"id": "job-a", "generation": 0})
    first.seal(tp.SnapshotTaken(checkpoint_id=2, path=str(own), batch_id=0, state_size=2, duration_ms=1))
    other = ck / "job-z" / "chk-1"
    first.snapshot_target(other)  # (any target works for the test: sealed as job-a's, then relabelled)
    write_snapshot(other, DRIVER, lineage={"id": "job-z", "generation": 0})
    first.release()
    meta = json.loads((other / "_metadata").read_text())
    (other / "_metadata").write_text(json.dumps(meta | {"lineage": {"id": "job-z", "generation": 0}}))

    again = storage(ck, DRIVER + 1)
    again.prepare(spec(ck, execution="e2"))
    view = Path(again.request_view(str(own)))
    assert view.parent == ck / "job-a" / "v" / "live" / "e2" and (view / "spark" / "commits" / "0").read_text() == "v1"
    with pytest.raises(StorageRefused, match="not a snapshot of this task's lineage job-a"):
        again.request_view(str(other))
    forged = ck / "job-y" / "chk-1"  # never sealed, naming job-a's lineage
    forged.mkdir(parents=True)
    os.chown(forged, DRIVER, DRIVER)
    write_snapshot(forged, DRIVER, lineage={"id": "job-a", "generation": 0})
    with pytest.raises(StorageRefused, match="not a snapshot of this task's lineage job-a"):
        again.request_view(str(forged))
    assert [p.name for p in view.parent.iterdir() if p.name.startswith(".restore-")] == [view.name]
