"""Delta Lake as a source: a streaming read of a table (bronze -> silver -> gold chains) and a
bounded read for batch jobs, on the path the pipeline gives (confined by delta_paths.py).

The streaming source is Delta's own: its offsets (table version and file index) are in the
query's offset log, which every checkpoint and savepoint copies, so a restore reads on exactly
where the snapshot was taken. `starting_version` applies to a fresh start only. Options are
Delta's (`maxFilesPerTrigger`, `maxBytesPerTrigger`, `skipChangeCommits`, `ignoreDeletes`, ...).

A streaming read fails at a commit that removed rows (Delta's rule): a complete-mode or
update-mode table upstream, or an upstream restore that undid batches. `skipChangeCommits`
skips such commits (runbooks/delta.md, "A restore that undid batches").
"""

from __future__ import annotations

from typing import Any, Mapping

from . import delta_log


def _missing(path: str) -> FileNotFoundError:
    return FileNotFoundError(
        f"there is no Delta table at {path} (no _delta_log/): start the job that writes it first, or check the path"
    )


def delta_stream(
    spark: Any, path: str, *, starting_version: int | str | None = None, options: Mapping[str, Any] | None = None
) -> Any:
    if not delta_log.table_exists(path):
        raise _missing(path)
    reader = spark.readStream.format("delta").options(**{k: str(v) for k, v in (options or {}).items()})
    if starting_version is not None:
        reader = reader.option("startingVersion", str(starting_version))
    return reader.load(path)


def delta_table(spark: Any, path: str, *, version: int | None = None) -> Any:
    if not delta_log.table_exists(path):
        raise _missing(path)
    reader = spark.read.format("delta")
    if version is not None:
        reader = reader.option("versionAsOf", str(version))
    return reader.load(path)
