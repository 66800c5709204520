"""Reading a live Spark checkpoint: its offset and commit logs (which batch is committed, the
configuration a query pinned) and its stateful operators with their schemas."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any, Iterator

from shared.checkpoint_storage.layout import SnapshotError

_NUMBERED = re.compile(r"^(\d+)$")
_SOURCE_LOG = re.compile(r"^(\d+)(\.compact)?$")


# `<v>.delta`, `<v>.snapshot` (HDFS-backed store), `<v>.zip`, `<v>.changelog` (RocksDB), also with
# the `_<unique id>` suffix of Spark's state checkpoint format version 2.
_STATE_VERSION = re.compile(r"^(\d+)(?:_[0-9A-Za-z-]+)?\.(delta|snapshot|zip|changelog)$")
_FULL_KINDS = {"snapshot", "zip"}


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
        raise SnapshotError(
            f"{live}: the query's last planned batch ({planned}) is not committed "
            f"({committed}); drain it before ending event time"
        )
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
        files = sorted(
            (p for p in v3.iterdir() if p.is_file() and not p.name.startswith(".")), key=lambda p: _leading_int(p.name)
        )
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
    for op_dir in sorted(
        (p for p in state.iterdir() if p.is_dir() and _NUMBERED.match(p.name)), key=lambda p: int(p.name)
    ):
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
            stores.append(
                {
                    "name": store,
                    "partitions": int(s.get("numPartitions", len(partition_dirs))),
                    "key_schema": key,
                    "value_schema": value,
                }
            )
        ops.append({"id": int(op_dir.name), "name": name, "stores": stores})
    return ops


def _state_partitions(operators: list[dict], conf: dict) -> int | None:
    for op in operators:
        for store in op["stores"]:
            if store.get("partitions"):
                return int(store["partitions"])
    value = conf.get("spark.sql.shuffle.partitions")
    return int(value) if value not in (None, "") else None
