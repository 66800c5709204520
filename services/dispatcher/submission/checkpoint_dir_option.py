"""A job's own checkpoint directory option: refused unless it is the cluster's.

Flink lets a job name its checkpoint directory (`state.checkpoints.dir`, in Flink 2
`execution.checkpointing.dir`). Here the JobManager places every job's checkpoints under the
cluster's `checkpoint_dir` (`<checkpoint-dir>/<job>/chk-<n>/`), which every TaskManager checks it
can reach at start; a per-job directory would be one nobody checked. `"/etc"` was accepted and
silently ignored, so a user believed their checkpoints were somewhere they were not. Now the
option is accepted only when it names the cluster's directory, and refused with a 400 that says
where checkpoints go and which setting moves them.
"""

from __future__ import annotations

import os
import posixpath
from typing import Any

from services.dispatcher.errors import ApiError
from shared import checkpointing as cp
from shared.settings import Settings

OPTIONS = ("state.checkpoints.dir", "execution.checkpointing.dir")


def check(config: dict[str, Any], settings: Settings) -> None:
    """Raise ApiError 400 naming the option when `config` sets a checkpoint directory other
    than the cluster's."""
    cluster = posixpath.normpath(os.path.abspath(str(settings.checkpoints)))
    for option in OPTIONS:
        raw = config.get(option)
        if raw is None:
            continue
        given = _local(raw)
        if given is not None and posixpath.normpath(given) == cluster:
            continue
        raise ApiError.of(
            400,
            f"a job cannot choose its checkpoint directory: it is set per cluster, not per job (this "
            f"cluster writes every job's checkpoints under {cluster}/<job-id>/), got {raw!r}",
            field=option,
            expected=f"no {option}, or the cluster's own {cluster}",
            got=raw,
            prefix=False,
            hint="leave the option out; an operator moves all checkpoints with checkpoint_dir "
            "(HEADRACE_CHECKPOINT_DIR) on every service; a savepoint can go elsewhere "
            "(state.savepoints.dir, or the savepoint's target directory)",
        )


def _local(raw: Any) -> str | None:
    if not isinstance(raw, str) or not raw.strip():
        return None
    try:
        path = cp.to_local_path(raw.strip())
    except ValueError:
        return None
    return path if path.startswith("/") else None
