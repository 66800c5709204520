"""What a TaskManager runs: only files inside its artifact directory whose sha256 is the one the
catalog recorded (services/taskmanager/tasks/artifact_check.py), on real files and symlinks."""

from __future__ import annotations

import hashlib
import os

from services.taskmanager.tasks.artifact_check import ArtifactChecker
from shared.task_protocol import TaskSpec

SOURCE = b"def build(ctx):\n    pass\n"
DIGEST = hashlib.sha256(SOURCE).hexdigest()


def spec(path, sha256=DIGEST, kind="pyspark") -> TaskSpec:
    return TaskSpec(
        job_id="j",
        vertex_id="v",
        execution_id="e",
        attempt=0,
        parallelism=1,
        kind=kind,
        artifact_path=str(path) if path else None,
        artifact_sha256=sha256,
        checkpoint_dir="/tmp/c",
        catalog_url="sqlite://",
        redis_url="redis://",
    )


def setup(tmp_path):
    artifacts = tmp_path / "artifacts"
    artifacts.mkdir()
    (artifacts / "ok.py").write_bytes(SOURCE)
    outside = tmp_path / "evil.py"
    outside.write_bytes(SOURCE)  # the very bytes of an uploaded artifact, but not one
    return ArtifactChecker(artifacts), artifacts, outside


def test_an_uploaded_artifact_with_the_catalogs_sha256_runs(tmp_path):
    check, artifacts, _ = setup(tmp_path)
    assert check.refusal(spec(artifacts / "ok.py")) is None
    assert check.refusal(spec(artifacts / "ok.py", sha256=DIGEST.upper())) is None
    assert check.refusal(spec(None, sha256=None, kind="noop")) is None  # a no-op task runs no file


def test_files_outside_the_artifact_directory_never_run(tmp_path):
    check, artifacts, outside = setup(tmp_path)
    assert "outside this TaskManager's artifact directory" in check.refusal(spec(outside))
    assert "outside" in check.refusal(spec(artifacts / ".." / "evil.py"))
    os.symlink(outside, artifacts / "link.py")  # a symlink inside that leads out
    refused = check.refusal(spec(artifacts / "link.py"))
    assert "outside" in refused and str(outside) in refused
    # A symlinked artifact directory is fine: what counts is where the files really are.
    alias = tmp_path / "alias"
    os.symlink(artifacts, alias)
    assert ArtifactChecker(alias).refusal(spec(artifacts / "ok.py")) is None


def test_an_artifact_changed_after_upload_or_without_a_recorded_sha256_is_refused(tmp_path):
    check, artifacts, _ = setup(tmp_path)
    path = artifacts / "ok.py"
    assert check.refusal(spec(path)) is None  # hashed and cached
    path.write_bytes(SOURCE + b"import os\n")  # another size and mtime: hashed again
    assert "not the" in check.refusal(spec(path)) and "changed after upload" in check.refusal(spec(path))
    assert "without the sha256" in check.refusal(spec(path, sha256=None))
    assert "names none" in check.refusal(spec(None))
    assert "cannot be read" in check.refusal(spec(artifacts / "missing.py"))
    (artifacts / "dir.py").mkdir()
    assert "not a regular file" in check.refusal(spec(artifacts / "dir.py"))
