"""Copying: a consistent snapshot of a running query's Spark checkpoint at a committed batch (state
files hard-linked, logs copied, the version chains checked), and a snapshot materialised back
into a fresh Spark checkpoint location."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import time
from pathlib import Path
from typing import Iterable, Iterator

from shared.checkpoint_storage.layout import (
    FORMAT,
    INPROGRESS,
    METADATA_FILE,
    SPARK_DIR,
    SnapshotError,
    SnapshotInfo,
    _fsync,
    _inprogress_dir,
    _load,
    _write_json_atomic,
    local_path,
)
from shared.checkpoint_storage.spark_files import (
    _FULL_KINDS,
    _NUMBERED,
    _SOURCE_LOG,
    _STATE_VERSION,
    _leading_int,
    _offset_log,
    _state_partitions,
    latest_committed_batch,
    state_operators,
)


def _walk(root: Path) -> Iterator[tuple[Path, list[str]]]:
    """(directory, visible file names) under `root`; listing errors are raised, not ignored."""

    def fail(err: OSError) -> None:
        raise err

    for dirpath, dirnames, filenames in os.walk(root, onerror=fail):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        yield Path(dirpath), sorted(f for f in filenames if not f.startswith("."))


def _include(rel: Path, batch_id: int) -> bool:
    """Whether `rel` (relative to the Spark checkpoint dir) belongs to the snapshot of batch_id."""
    parts = rel.parts
    top, name = parts[0], parts[-1]
    if top in ("offsets", "commits"):
        return len(parts) == 2 and bool(_NUMBERED.match(name)) and int(name) <= batch_id
    if top == "sources":
        m = _SOURCE_LOG.match(name)
        return m is None or int(m.group(1)) <= batch_id
    if top == "state":
        m = _STATE_VERSION.match(name)
        if m:
            return int(m.group(1)) <= batch_id + 1
        if "_stateSchema" in parts or ("_metadata" in parts and "v2" in parts):
            # schema and operator metadata files named by the batch that wrote them
            n = _leading_int(name)
            return n <= batch_id
        return True
    return top == "metadata" and len(parts) == 1


def _is_state_data(rel: Path) -> bool:
    """Versioned state data and RocksDB's SST files: large, and never rewritten, so they are
    hard-linked. Everything else is copied, so no later writer shares an inode with a snapshot."""
    name = rel.parts[-1]
    return rel.parts[0] == "state" and (bool(_STATE_VERSION.match(name)) or name.endswith(".sst"))


def _place(src: Path, dst: Path, *, link: bool) -> None:
    """Hard-link (state files) or copy `src` to `dst`."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    if link:
        try:
            os.link(src, dst)
            return
        except FileNotFoundError:
            raise
        except OSError:  # EXDEV, EPERM, a filesystem without hard links: copy instead
            pass
    shutil.copyfile(src, dst)


_VANISHED_LIVE = (
    "vanished while taking the snapshot: Spark's maintenance deletes files older than "
    "spark.sql.streaming.minBatchesToRetain batches; snapshot a newer batch"
)
_VANISHED_SNAPSHOT = "is missing: the snapshot is damaged (a file was deleted from it); restore another one"


def _copy_tree(
    src_root: Path, dst_root: Path, files: Iterable[Path], *, vanished: str, may_vanish=lambda rel: False
) -> tuple[int, int, list[Path]]:
    """Place each relative path of `files`; returns (files, bytes, the paths placed). A file that
    disappears meanwhile is an error unless `may_vanish(rel)`."""
    count = size = 0
    placed = []
    for rel in files:
        src, dst = src_root / rel, dst_root / rel
        try:
            _place(src, dst, link=_is_state_data(rel))
            size += os.lstat(dst).st_size
        except FileNotFoundError:
            if may_vanish(rel):
                continue
            raise SnapshotError(f"{src} {vanished}") from None
        count += 1
        placed.append(rel)
    return count, size, placed


def _old_enough_to_vanish(batch_id: int):
    """Which files of a running query Spark's maintenance may delete while a snapshot of batch_id
    copies them, without harm to that snapshot: logs of batches before the last two (a restart
    reads the newest batch's and, when it was not committed, the one before), and state
    versions (whether the chain to batch_id's state survived is checked after the copy)."""

    def check(rel: Path) -> bool:
        top, name = rel.parts[0], rel.parts[-1]
        if top in ("offsets", "commits", "sources"):
            m = _SOURCE_LOG.match(name)
            return m is not None and int(m.group(1)) < batch_id - 1
        return top == "state" and bool(_STATE_VERSION.match(name))

    return check


def check_state_chains(files: Iterable[Path], selected: Iterable[Path], batch_id: int) -> None:
    """Every state store directory (one holding versioned state files among `files`, relative
    paths of the live checkpoint) must keep, among the `selected` files, version batch_id + 1
    reachable from a full version (`.snapshot`/`.zip`) or from version 1 through incremental ones
    (`.delta`/`.changelog`) without a hole; otherwise Spark could not load the batch's state."""
    stores: dict[Path, dict[int, set[str]]] = {}
    for rel in files:
        if rel.parts[0] == "state" and _STATE_VERSION.match(rel.name):
            stores.setdefault(rel.parent, {})
    for rel in selected:
        m = _STATE_VERSION.match(rel.name)
        if m and rel.parent in stores:
            stores[rel.parent].setdefault(int(m.group(1)), set()).add(m.group(2))
    want = batch_id + 1
    for directory, versions in sorted(stores.items()):
        v = want
        while v >= 1:
            kinds = versions.get(v)
            if kinds is None:
                break
            v = 0 if kinds & _FULL_KINDS else v - 1
        if v > 0:
            raise SnapshotError(
                f"{directory}: state version {v} is missing, so batch {batch_id} (state version {want}) cannot be "
                f"restored (versions present up to {want}: {_ranges(sorted(versions))}); Spark's maintenance "
                f"deleted it (spark.sql.streaming.minBatchesToRetain): snapshot a newer batch"
            )


def _ranges(values: list[int]) -> str:
    out, start = [], None
    for i, v in enumerate(values):
        if start is None:
            start = v
        if i + 1 == len(values) or values[i + 1] != v + 1:
            out.append(str(start) if start == v else f"{start}-{v}")
            start = None
    return ", ".join(out) or "none"


def _work_dir(target: Path) -> tuple[Path, Path, bool]:
    """(the in-progress directory, where its Spark files go, whether the snapshot is written in
    place). `target` must not exist, or be an empty directory made for this snapshot (a
    TaskManager makes it for its driver, which may not write the directory above: the snapshot's
    files then go into it and `_metadata`, written last, says it is complete)."""
    if target.is_dir() and not target.is_symlink() and not any(target.iterdir()):
        work = target / f".{SPARK_DIR}{INPROGRESS}{secrets.token_hex(6)}"
        return work, work, True
    if os.path.lexists(target):
        raise SnapshotError(f"{target} already exists; a snapshot is written to a new directory only")
    target.parent.mkdir(parents=True, exist_ok=True)
    work = _inprogress_dir(target)
    return work, work / SPARK_DIR, False


def take_snapshot(live: Path, target: Path, *, batch_id: int, metadata: dict) -> SnapshotInfo:
    """Snapshot the live Spark checkpoint `live` at committed batch `batch_id` into `target`
    (which must not exist, or be an empty directory made for it: `_work_dir`). Safe while the
    query runs. Raises SnapshotError."""
    started = time.monotonic()
    live, target = local_path(live), local_path(target)
    if not (live / "commits" / str(batch_id)).is_file():
        newest = latest_committed_batch(live)
        raise SnapshotError(
            f"{live}: batch {batch_id} is not committed (no commits/{batch_id}; newest committed "
            f"batch: {newest}); snapshot a committed batch"
        )
    work, spark_dst, in_place = _work_dir(target)
    try:
        spark_dst.mkdir(parents=True)
        try:
            files = [(d / n).relative_to(live) for d, names in _walk(live) for n in names]
        except FileNotFoundError as exc:
            raise SnapshotError(f"{live}: a directory vanished while listing it ({exc.filename})") from None
        selected = [rel for rel in files if _include(rel, batch_id)]
        check_state_chains(files, selected, batch_id)
        # Spark's maintenance runs beside us: it may delete the oldest retained files of a busy
        # query (minBatchesToRetain) during the copy. Those are not needed to restore batch_id;
        # the state chains are checked again on what was actually copied.
        count, size, placed = _copy_tree(
            live, spark_dst, selected, vanished=_VANISHED_LIVE, may_vanish=_old_enough_to_vanish(batch_id)
        )
        if len(placed) < len(selected):
            check_state_chains(files, placed, batch_id)
        info = _finish(
            work,
            target,
            batch_id=batch_id,
            metadata=metadata,
            files=count,
            size=size,
            started=started,
            in_place=in_place,
        )
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return info


def take_empty_snapshot(target: Path, *, metadata: dict) -> SnapshotInfo:
    """A snapshot of a query that never planned a batch: restoring it is a fresh start.
    `spark.batch_id` is -1."""
    started = time.monotonic()
    target = local_path(target)
    work, spark_dst, in_place = _work_dir(target)
    try:
        spark_dst.mkdir(parents=True)
        info = _finish(
            work, target, batch_id=-1, metadata=metadata, files=0, size=0, started=started, in_place=in_place
        )
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return info


def _finish(
    work: Path,
    target: Path,
    *,
    batch_id: int,
    metadata: dict,
    files: int,
    size: int,
    started: float,
    in_place: bool = False,
) -> SnapshotInfo:
    spark_dir = work if in_place else work / SPARK_DIR
    if batch_id >= 0:
        batch_meta, source_offsets = _offset_log(spark_dir, batch_id)
        conf = dict(batch_meta.get("conf") or {})
        operators = state_operators(spark_dir)
        watermark = batch_meta.get("batchWatermarkMs")
        query_id = _query_id(spark_dir)
    else:
        conf, source_offsets, operators, watermark, query_id = {}, [], [], None, None
    spark = {
        "batch_id": batch_id,
        "watermark_ms": watermark,
        "conf": conf,
        "source_offsets": source_offsets,
        "operators": operators,
        "state_partitions": _state_partitions(operators, conf) if batch_id >= 0 else None,
        "query_id": query_id,
    }
    meta = {
        **metadata,
        "format": FORMAT,
        "spark": spark,
        "size_bytes": size,
        "files": files,
        "completed_at": time.time(),
    }
    if in_place:
        _fsync(work, directory=True)
        os.rename(work, target / SPARK_DIR)
        _write_json_atomic(target / METADATA_FILE, meta)  # last: the snapshot is complete
        _fsync(target, directory=True)
        return SnapshotInfo(
            path=str(target),
            batch_id=batch_id,
            state_size=size,
            files=files,
            duration_ms=int((time.monotonic() - started) * 1000),
            source_offsets=tuple(source_offsets),
            metadata=meta,
        )
    _write_json_atomic(work / METADATA_FILE, meta)
    _fsync(work, directory=True)
    if os.path.lexists(target):
        raise SnapshotError(f"{target} appeared while the snapshot was being written; not overwriting it")
    os.rename(work, target)
    _fsync(target.parent, directory=True)
    return SnapshotInfo(
        path=str(target),
        batch_id=batch_id,
        state_size=size,
        files=files,
        duration_ms=int((time.monotonic() - started) * 1000),
        source_offsets=tuple(source_offsets),
        metadata=meta,
    )


def _query_id(spark_dir: Path) -> str | None:
    try:
        obj = json.loads((spark_dir / "metadata").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return obj.get("id") if isinstance(obj, dict) else None


def restore(snapshot: str | Path, live: Path, *, drop_operators: Iterable[int] = ()) -> dict:
    """Materialise a snapshot into `live`, a Spark checkpoint location that must not exist or be
    empty; the state of the operators in `drop_operators` is left out (allowNonRestoredState).
    Returns the snapshot's metadata. Raises SnapshotError."""
    directory, meta = _load(snapshot)
    live = local_path(live)
    if live.exists() and (not live.is_dir() or any(live.iterdir())):
        raise SnapshotError(
            f"{live} is not empty: a snapshot is restored only into a new, empty directory, "
            f"never over another query's checkpoint"
        )
    drop = {str(int(op)) for op in drop_operators}
    src = directory / SPARK_DIR
    rels = []
    for d, names in _walk(src):
        for n in names:
            rel = (d / n).relative_to(src)
            if len(rel.parts) > 1 and rel.parts[0] == "state" and rel.parts[1] in drop:
                continue
            rels.append(rel)
    live.parent.mkdir(parents=True, exist_ok=True)
    work = live.parent / f".{live.name}.restoring-{secrets.token_hex(6)}"
    try:
        work.mkdir()
        _copy_tree(src, work, rels, vanished=_VANISHED_SNAPSHOT)  # a snapshot's files never vanish
        # rename(2) replaces an empty directory: the live location appears complete or not at all
        os.rename(work, live)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return meta
