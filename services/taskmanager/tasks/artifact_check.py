"""Artifacts only from the catalog: what a TaskManager checks before a pipeline file may run.

A deploy names the file to run (`spec.artifact_path`) and the sha256 the catalog recorded when
the dispatcher stored it (`spec.artifact_sha256`, the JobManager copies it from the artifact's
row). The file must resolve, symlinks followed, inside this TaskManager's artifact directory
(`settings.artifacts`) and hash to that value; otherwise nothing runs and the deploy is refused
with the reason. The signature on the command already says the leader sent it; this says the
leader's catalog knew the bytes, so a file dropped beside the artifacts, or an artifact changed
after upload, is never run.

Hashes are kept per (device, inode, size, mtime): a burst of deploys of one job hashes its file
once.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import stat
from pathlib import Path

from shared.task_protocol import TaskSpec

_CHUNK = 1 << 20
_CACHE_MAX = 256


class ArtifactChecker:
    def __init__(self, artifact_dir: Path):
        self.root = Path(os.path.realpath(artifact_dir))
        self._hashes: dict[tuple, str] = {}

    def refusal(self, spec: TaskSpec) -> str | None:
        """Why this task's artifact may not run here, or None."""
        if spec.kind != "pyspark":
            return None  # a no-op task runs no file
        if not spec.artifact_path:
            return "a pyspark task needs an artifact recorded in the catalog; this deploy names none"
        if not spec.artifact_sha256:
            return (
                f"artifact {spec.artifact_path} comes without the sha256 the catalog recorded at upload: "
                f"nothing runs that the catalog does not vouch for"
            )
        real = Path(os.path.realpath(spec.artifact_path))
        if not real.is_relative_to(self.root):
            shown = spec.artifact_path if str(real) == spec.artifact_path else f"{spec.artifact_path} (-> {real})"
            return (
                f"artifact {shown} is outside this TaskManager's artifact directory {self.root}: only uploaded "
                f"artifacts run (settings artifact_dir must name the directory the dispatcher stores them in)"
            )
        try:
            st = real.stat()
        except OSError as exc:
            return f"artifact {spec.artifact_path} cannot be read here: {exc.strerror or exc}"
        if not stat.S_ISREG(st.st_mode):
            return f"artifact {spec.artifact_path} is not a regular file"
        try:
            digest = self._sha256(real, st)
        except OSError as exc:
            return f"artifact {spec.artifact_path} cannot be read here: {exc.strerror or exc}"
        if not hmac.compare_digest(digest, spec.artifact_sha256.lower()):
            return (
                f"artifact {spec.artifact_path} has sha256 {digest}, not the {spec.artifact_sha256} the catalog "
                f"recorded at upload: it was changed after upload; upload it again"
            )
        return None

    def _sha256(self, path: Path, st: os.stat_result) -> str:
        key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        digest = self._hashes.get(key)
        if digest is None:
            h = hashlib.sha256()
            with open(path, "rb") as f:
                while chunk := f.read(_CHUNK):
                    h.update(chunk)
            digest = h.hexdigest()
            if len(self._hashes) >= _CACHE_MAX:
                self._hashes.clear()
            self._hashes[key] = digest
        return digest
