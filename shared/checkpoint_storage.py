"""Checkpoint storage: the only code that reads or writes snapshot directories.

A snapshot (a completed checkpoint or a savepoint) is a directory:

    <snapshot>/_metadata     JSON, self-describing; written last, so its presence means "complete"
    <snapshot>/spark/...     a consistent copy of one query's Spark checkpoint at batch b

How a consistent copy is taken while the query runs (Spark's files are write-once: written to a
hidden temporary file, then renamed into place; only Spark's maintenance deletes them):
  * batch b is committed once `commits/b` exists; `offsets/k`, `commits/k` for k <= b and the
    `sources/<i>/<k>` logs are tiny and copied;
  * state store files are versioned by batch + 1 (`<v>.delta`/`.snapshot` for the HDFS-backed
    store, `<v>.zip`/`.changelog` plus shared `SSTs/*.sst` for RocksDB). Versions above b + 1
    belong to a batch still in flight and are left out; the rest are hard-linked (copied where
    the filesystem cannot link), which is safe because nobody ever writes into an existing file;
  * a file deleted by Spark's maintenance while we copy, or a version chain with a hole, means
    batch b is older than `spark.sql.streaming.minBatchesToRetain` allows: SnapshotError.
Hidden files (`.<name>.crc` checksums, temporary files) are skipped: Spark reads a file without
its checksum file, and a restore was tested to work without them.

Everything is written under a hidden sibling `.<name>.inprogress-<hex>` and renamed to its final
name at the end, so a crash never leaves a half snapshot under a name someone could restore from.
No absolute path is stored inside, so a snapshot directory can be moved and still restored.

No pyspark here: this module works on files only, so the JobManager and the dispatcher use it too.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator
from urllib.parse import unquote, urlparse

from shared.errors import StateError

FORMAT = "headrace-snapshot/1"
METADATA_FILE = "_metadata"
SPARK_DIR = "spark"
INPROGRESS = ".inprogress-"

_NUMBERED = re.compile(r"^(\d+)$")
_SOURCE_LOG = re.compile(r"^(\d+)(\.compact)?$")
# `<v>.delta`, `<v>.snapshot` (HDFS-backed store), `<v>.zip`, `<v>.changelog` (RocksDB), also with
# the `_<unique id>` suffix of Spark's state checkpoint format version 2.
_STATE_VERSION = re.compile(r"^(\d+)(?:_[0-9A-Za-z-]+)?\.(delta|snapshot|zip|changelog)$")
_FULL_KINDS = {"snapshot", "zip"}


class SnapshotError(StateError):
    """A snapshot cannot be taken, read, restored or disposed of; the message names the path."""


@dataclass(frozen=True)
class SnapshotInfo:
    path: str
    batch_id: int
    state_size: int
    files: int
    duration_ms: int
    source_offsets: tuple[str, ...]
    metadata: dict = field(compare=False)


# ---------------------------------------------------------------- paths

def local_path(path: str | os.PathLike) -> Path:
    """A plain path or a `file:` URI (`file:///p`, `file:/p`, `file://localhost/p`) as a Path."""
    text = os.fspath(path)
    if isinstance(text, str) and re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:/", text):
        url = urlparse(text)
        if url.scheme.lower() != "file":
            raise SnapshotError(f"{text}: scheme {url.scheme!r} is not supported; checkpoint storage is a "
                                f"filesystem path (plain or file:///...)")
        if url.netloc not in ("", "localhost"):
            raise SnapshotError(f"{text}: a file URI with host {url.netloc!r} is not supported; "
                                f"write file:///absolute/path")
        return Path(unquote(url.path))
    return Path(text)


def new_savepoint_dir(parent: str | Path, job_id: str) -> Path:
    """Flink's savepoint naming: `<parent>/savepoint-<first 6 of the job id>-<12 hex>` (not created)."""
    return local_path(parent) / f"savepoint-{job_id[:6]}-{secrets.token_hex(6)}"


def dir_size(path: Path) -> int:
    """Bytes of every regular file under `path` (a hard-linked file counts in full)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except FileNotFoundError:
                pass
    return total


# ---------------------------------------------------------------- reading a live Spark checkpoint

def _batch_files(log_dir: Path) -> list[int]:
    try:
        names = os.listdir(log_dir)
    except FileNotFoundError:
        return []
    return sorted(int(n) for n in names if _NUMBERED.match(n))


def latest_committed_batch(live: Path) -> int | None:
    """The highest batch n with `commits/n` (None: no batch committed yet)."""
    batches = _batch_files(Path(live) / "commits")
    return batches[-1] if batches else None


def latest_planned_batch(live: Path) -> int | None:
    """The highest batch n with `offsets/n`: planned, perhaps not committed yet."""
    batches = _batch_files(Path(live) / "offsets")
    return batches[-1] if batches else None


def _offset_log(spark_dir: Path, batch_id: int) -> tuple[dict, list[str]]:
    """(batch metadata, one line per source) of `offsets/<batch_id>`."""
    path = Path(spark_dir) / "offsets" / str(batch_id)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise SnapshotError(f"{path}: the offset log of batch {batch_id} does not exist") from None
    if len(lines) < 2 or not lines[0].startswith("v"):
        raise SnapshotError(f"{path}: not a Spark offset log (expected a version line, then a JSON line)")
    try:
        meta = json.loads(lines[1])
    except ValueError as exc:
        raise SnapshotError(f"{path}: its batch metadata line is not JSON ({exc})") from None
    return meta, [line.strip() for line in lines[2:]]


# The end of event time, as far as a drained query is concerned (9999-12-31T23:59:59Z): far
# beyond any real event, yet far from overflowing Spark's arithmetic on watermarks.
END_OF_TIME_MS = 253402300799000


def log_final_watermark_batch(live: Path) -> int:
    """Append to a stopped query's offset log one more batch with the same source offsets as
    its last committed batch (no new data) and a watermark at the end of time, and return its
    id. Restarted, Spark runs that logged batch and its stateful operators emit every window
    still open: what a drained stop (Flink's MAX_WATERMARK) needs. The query must be stopped
    and its last planned batch committed."""
    committed = latest_committed_batch(live)
    planned = latest_planned_batch(live)
    if committed is None or planned != committed:
        raise SnapshotError(f"{live}: the query's last planned batch ({planned}) is not committed "
                            f"({committed}); drain it before ending event time")
    meta, sources = _offset_log(live, committed)
    meta = {**meta, "batchWatermarkMs": END_OF_TIME_MS, "batchTimestampMs": int(time.time() * 1000)}
    nxt = committed + 1
    text = "\n".join(["v1", json.dumps(meta, separators=(",", ":")), *sources])
    path = Path(live) / "offsets" / str(nxt)
    tmp = path.with_name(f".{nxt}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
    return nxt


def spark_conf_at(spark_dir: Path, batch_id: int) -> dict:
    """The Spark configuration the query pinned in `offsets/<batch_id>` (shuffle partitions,
    state store provider, state format versions ...)."""
    meta, _sources = _offset_log(spark_dir, batch_id)
    return dict(meta.get("conf") or {})


def _json_objects(text: str) -> Iterator[Any]:
    """Every top-level JSON object embedded in `text` (Spark's schema files wrap JSON in a
    binary framing whose details changed between versions)."""
    decoder = json.JSONDecoder()
    i = text.find("{")
    while i >= 0:
        try:
            obj, end = decoder.raw_decode(text, i)
        except ValueError:
            i = text.find("{", i + 1)
            continue
        yield obj
        i = text.find("{", end)


def _read_schema(path: Path) -> tuple[dict | None, dict | None]:
    """(key schema, value schema) StructType JSON dicts from a state schema file."""
    try:
        text = path.read_bytes().decode("utf-8", errors="replace")
    except OSError:
        return None, None
    structs = []
    for obj in _json_objects(text):
        if isinstance(obj, dict) and obj.get("type") == "struct":
            structs.append(obj)
        elif isinstance(obj, dict) and ("keySchema" in obj or "valueSchema" in obj):
            # schema format v3: one JSON object per column family with nested schemas
            key, value = obj.get("keySchema"), obj.get("valueSchema")
            key = json.loads(key) if isinstance(key, str) else key
            value = json.loads(value) if isinstance(value, str) else value
            return key, value
    key = structs[0] if len(structs) > 0 else None
    value = structs[1] if len(structs) > 1 else None
    return key, value


def _schema_file(op_dir: Path, store: str) -> Path | None:
    """The schema file of `store` in operator dir `op_dir`: Spark writes it beside partition 0."""
    candidates = [op_dir / "0" / "_metadata" / "schema"] if store == "default" else []
    candidates.append(op_dir / "0" / store / "_metadata" / "schema")
    for c in candidates:
        if c.is_file():
            return c
    v3 = op_dir / "_stateSchema" / store
    if v3.is_dir():
        files = sorted((p for p in v3.iterdir() if p.is_file() and not p.name.startswith(".")),
                       key=lambda p: _leading_int(p.name))
        if files:
            return files[-1]
    return None


def _leading_int(name: str) -> int:
    m = re.match(r"^(\d+)", name)
    return int(m.group(1)) if m else -1


def _operator_metadata(op_dir: Path) -> dict | None:
    path = op_dir / "_metadata" / "metadata"
    if not path.is_file():
        return None
    text = path.read_text(encoding="utf-8", errors="replace")
    for obj in _json_objects(text):
        if isinstance(obj, dict) and "operatorInfo" in obj:
            return obj
    return None


def state_operators(spark_dir: Path) -> list[dict]:
    """The stateful operators of a Spark checkpoint, by id:
    [{"id", "name", "stores": [{"name", "partitions", "key_schema", "value_schema"}]}]
    (`name` is Spark's, e.g. "stateStoreSave"; schemas are StructType JSON dicts or None)."""
    state = Path(spark_dir) / "state"
    if not state.is_dir():
        return []
    ops = []
    for op_dir in sorted((p for p in state.iterdir() if p.is_dir() and _NUMBERED.match(p.name)),
                         key=lambda p: int(p.name)):
        meta = _operator_metadata(op_dir)
        partition_dirs = [p for p in op_dir.iterdir() if p.is_dir() and _NUMBERED.match(p.name)]
        if meta is not None:
            info = meta.get("operatorInfo") or {}
            name = info.get("operatorName")
            store_infos = meta.get("stateStoreInfo") or []
        else:  # no operator metadata (written since Spark 4.0): describe what the files show
            name = None
            store_infos = [{"storeName": "default", "numPartitions": len(partition_dirs)}]
        stores = []
        for s in store_infos:
            store = s.get("storeName", "default")
            schema = _schema_file(op_dir, store)
            key, value = _read_schema(schema) if schema is not None else (None, None)
            stores.append({"name": store, "partitions": int(s.get("numPartitions", len(partition_dirs))),
                           "key_schema": key, "value_schema": value})
        ops.append({"id": int(op_dir.name), "name": name, "stores": stores})
    return ops


def _state_partitions(operators: list[dict], conf: dict) -> int | None:
    for op in operators:
        for store in op["stores"]:
            if store.get("partitions"):
                return int(store["partitions"])
    value = conf.get("spark.sql.shuffle.partitions")
    return int(value) if value not in (None, "") else None


# ---------------------------------------------------------------- copying

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


_VANISHED_LIVE = ("vanished while taking the snapshot: Spark's maintenance deletes files older than "
                  "spark.sql.streaming.minBatchesToRetain batches; snapshot a newer batch")
_VANISHED_SNAPSHOT = "is missing: the snapshot is damaged (a file was deleted from it); restore another one"


def _copy_tree(src_root: Path, dst_root: Path, files: Iterable[Path], *, vanished: str,
               may_vanish=lambda rel: False) -> tuple[int, int, list[Path]]:
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
                f"deleted it (spark.sql.streaming.minBatchesToRetain): snapshot a newer batch")


def _ranges(values: list[int]) -> str:
    out, start = [], None
    for i, v in enumerate(values):
        if start is None:
            start = v
        if i + 1 == len(values) or values[i + 1] != v + 1:
            out.append(str(start) if start == v else f"{start}-{v}")
            start = None
    return ", ".join(out) or "none"


def _fsync(path: Path, *, directory: bool = False) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _write_json_atomic(path: Path, obj: dict) -> None:
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, sort_keys=True)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _inprogress_dir(target: Path) -> Path:
    return target.parent / f".{target.name}{INPROGRESS}{secrets.token_hex(6)}"


# ---------------------------------------------------------------- taking snapshots

def take_snapshot(live: Path, target: Path, *, batch_id: int, metadata: dict) -> SnapshotInfo:
    """Snapshot the live Spark checkpoint `live` at committed batch `batch_id` into `target`
    (which must not exist). Safe while the query runs. Raises SnapshotError."""
    started = time.monotonic()
    live, target = local_path(live), local_path(target)
    if not (live / "commits" / str(batch_id)).is_file():
        newest = latest_committed_batch(live)
        raise SnapshotError(f"{live}: batch {batch_id} is not committed (no commits/{batch_id}; newest committed "
                            f"batch: {newest}); snapshot a committed batch")
    if os.path.lexists(target):
        raise SnapshotError(f"{target} already exists; a snapshot is written to a new directory only")
    target.parent.mkdir(parents=True, exist_ok=True)
    work = _inprogress_dir(target)
    spark_dst = work / SPARK_DIR
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
        count, size, placed = _copy_tree(live, spark_dst, selected, vanished=_VANISHED_LIVE,
                                         may_vanish=_old_enough_to_vanish(batch_id))
        if len(placed) < len(selected):
            check_state_chains(files, placed, batch_id)
        info = _finish(work, target, batch_id=batch_id, metadata=metadata, files=count, size=size,
                       started=started)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return info


def take_empty_snapshot(target: Path, *, metadata: dict) -> SnapshotInfo:
    """A snapshot of a query that never planned a batch: restoring it is a fresh start.
    `spark.batch_id` is -1."""
    started = time.monotonic()
    target = local_path(target)
    if os.path.lexists(target):
        raise SnapshotError(f"{target} already exists; a snapshot is written to a new directory only")
    target.parent.mkdir(parents=True, exist_ok=True)
    work = _inprogress_dir(target)
    try:
        (work / SPARK_DIR).mkdir(parents=True)
        info = _finish(work, target, batch_id=-1, metadata=metadata, files=0, size=0, started=started)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return info


def _finish(work: Path, target: Path, *, batch_id: int, metadata: dict, files: int, size: int,
            started: float) -> SnapshotInfo:
    spark_dir = work / SPARK_DIR
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
    meta = {**metadata, "format": FORMAT, "spark": spark, "size_bytes": size, "files": files,
            "completed_at": time.time()}
    _write_json_atomic(work / METADATA_FILE, meta)
    _fsync(work, directory=True)
    if os.path.lexists(target):
        raise SnapshotError(f"{target} appeared while the snapshot was being written; not overwriting it")
    os.rename(work, target)
    _fsync(target.parent, directory=True)
    return SnapshotInfo(path=str(target), batch_id=batch_id, state_size=size, files=files,
                        duration_ms=int((time.monotonic() - started) * 1000),
                        source_offsets=tuple(source_offsets), metadata=meta)


def _query_id(spark_dir: Path) -> str | None:
    try:
        obj = json.loads((spark_dir / "metadata").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return obj.get("id") if isinstance(obj, dict) else None


# ---------------------------------------------------------------- reading snapshots

def resolve_snapshot(path: str | Path) -> Path:
    """The snapshot directory for a path given as the directory, its `_metadata` file or a
    `file:` URI of either. Raises SnapshotError unless it is a complete snapshot."""
    directory, _meta = _load(path)
    return directory


def read_metadata(path: str | Path) -> dict:
    """The `_metadata` of a complete snapshot (same path forms as resolve_snapshot)."""
    _directory, meta = _load(path)
    return meta


def _snapshot_dir(path: str | Path) -> Path:
    p = local_path(path)
    return p.parent if p.name == METADATA_FILE and not p.is_dir() else p


def _load(path: str | Path) -> tuple[Path, dict]:
    directory = _snapshot_dir(path)
    if not directory.exists():
        raise SnapshotError(f"{directory} does not exist")
    if not directory.is_dir():
        raise SnapshotError(f"{directory} is a file, not a snapshot directory (expected a directory holding "
                            f"{METADATA_FILE}, or its {METADATA_FILE} file)")
    meta_path = directory / METADATA_FILE
    if not meta_path.is_file():
        if INPROGRESS in directory.name:
            raise SnapshotError(f"{directory} is an unfinished snapshot (still being written, or its writer "
                                f"crashed): it has no {METADATA_FILE}; it cannot be restored")
        raise SnapshotError(f"{directory} is not a snapshot: it holds no {METADATA_FILE} file (give the directory "
                            f"of a completed checkpoint or savepoint, e.g. .../chk-<n> or .../savepoint-...)")
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise SnapshotError(f"{meta_path}: unreadable snapshot metadata ({exc})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        got = meta.get("format") if isinstance(meta, dict) else type(meta).__name__
        raise SnapshotError(f"{meta_path}: format {got!r} is not {FORMAT!r}; this is not a Headrace snapshot "
                            f"or it was written by an incompatible version")
    if not (directory / SPARK_DIR).is_dir():
        raise SnapshotError(f"{directory}: its {SPARK_DIR}/ directory is missing; the snapshot is damaged")
    return directory, meta


# ---------------------------------------------------------------- restore and dispose

def restore(snapshot: str | Path, live: Path, *, drop_operators: Iterable[int] = ()) -> dict:
    """Materialise a snapshot into `live`, a Spark checkpoint location that must not exist or be
    empty; the state of the operators in `drop_operators` is left out (allowNonRestoredState).
    Returns the snapshot's metadata. Raises SnapshotError."""
    directory, meta = _load(snapshot)
    live = local_path(live)
    if live.exists() and (not live.is_dir() or any(live.iterdir())):
        raise SnapshotError(f"{live} is not empty: a snapshot is restored only into a new, empty directory, "
                            f"never over another query's checkpoint")
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


def dispose(path: str | Path) -> None:
    """Delete a snapshot directory. Gone already: nothing to do. A directory without `_metadata`
    is refused (SnapshotError): it is not ours to delete."""
    directory = _snapshot_dir(path)
    if not os.path.lexists(directory):
        return
    if os.path.islink(directory):  # renaming it would move the link and leave the link's target
        raise SnapshotError(f"{directory} is a symlink; a snapshot is disposed of by its real path only")
    meta_path = directory / METADATA_FILE
    if not directory.is_dir() or not meta_path.is_file():
        raise SnapshotError(f"{directory} is not a snapshot (no {METADATA_FILE}); refusing to delete it")
    try:
        fmt = json.loads(meta_path.read_text(encoding="utf-8")).get("format")
    except (OSError, ValueError, AttributeError):
        fmt = None
    if fmt != FORMAT:
        # e.g. a Flink savepoint, which also has a _metadata file: not ours to delete
        raise SnapshotError(f"{meta_path} is not {FORMAT!r} metadata; refusing to delete {directory}")
    # Renamed away first: a crash mid-delete must not leave a `_metadata` over a partial tree.
    trash = directory.parent / f".{directory.name}.disposing-{secrets.token_hex(6)}"
    try:
        os.rename(directory, trash)
    except FileNotFoundError:
        return
    shutil.rmtree(trash)
