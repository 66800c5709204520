"""What the Delta connector reads of a table's transaction log: the one module that knows Delta
Lake's internals.

Two readers, for two needs:
  * the table's current state (version, this sink's transaction version, table properties,
    schema) from the newest commit's checksum file, else from Delta's own `DeltaLog` in the
    driver's JVM through py4j (`DeltaLog.update` is an internal API, stable across Delta 2-4);
    everything else goes through SQL.
  * single commits (`_delta_log/<version>.json`, JSON lines of actions) read as files: which
    commit carries this sink's transaction, what it added, who wrote the commits after a
    version. Commits older than the log's retention (`delta.logRetentionDuration`, 30 days) may
    be gone: `commit` then answers None.

Transaction versions carry the fence: a sink's streaming writes set `txnAppId` (its lineage and
table) and `txnVersion` = seq * 2**40 + batch + 1, where `seq` grows with every attempt that takes
the sink over. Delta skips a write whose version is not above the one it recorded for the app,
inside the commit's own optimistic transaction, so a batch re-run by the same attempt is
skipped, and every batch of an older attempt (a zombie) is skipped too: its seq is lower. A
RESTORE leaves the recorded versions as they were (checked on Delta 4.4), which is why the seq,
not the batch id alone, must grow for a replay after an undo to be written at all.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

TXN_SEARCH = 1000  # commits searched for an app's transaction version before asking the snapshot
SEQ_SHIFT = 40  # batch ids below 2**40 - 1; seqs below 2**23
USER_METADATA_CONF = "spark.databricks.delta.commitInfo.userMetadata"
TAG = "headrace"  # userMetadata of every commit a sink makes: "headrace:<app id>:<what>"


def txn_version(seq: int, batch_id: int) -> int:
    """The transaction version of `batch_id` (-1: the fence commit of a restore) for seq."""
    if seq < 1 or batch_id + 1 >= 1 << SEQ_SHIFT:
        raise ValueError(f"cannot encode seq {seq}, batch {batch_id} as a Delta transaction version")
    return (seq << SEQ_SHIFT) | (batch_id + 1)


def seq_of(version: int | None) -> int:
    return 0 if version is None else version >> SEQ_SHIFT


def batch_of(version: int) -> int:
    return (version & ((1 << SEQ_SHIFT) - 1)) - 1


def tag(app_id: str, what: str) -> str:
    return f"{TAG}:{app_id}:{what}"


def quoted(path: str) -> str:
    """`path` as a SQL identifier: delta.`<path>`."""
    return "delta.`" + path.replace("`", "``") + "`"


def sql_string(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


@dataclass(frozen=True)
class TableState:
    """A table's latest snapshot as the sink needs it; version -1: no table yet."""

    version: int
    txn: int | None = None  # the sink's app's transaction version
    properties: dict[str, str] = field(default_factory=dict)
    schema_json: str | None = None
    timestamp_ms: int = 0

    @property
    def exists(self) -> bool:
        return self.version >= 0


def table_exists(path: str) -> bool:
    log = Path(path) / "_delta_log"
    return log.is_dir() and any(log.glob("*.json"))


def latest_version(path: str) -> int:
    """The newest commit's version (-1: no table), from the log's file names as Delta lists them."""
    try:
        names = os.listdir(Path(path) / "_delta_log")
    except FileNotFoundError:
        return -1
    versions = [int(n[:20]) for n in names if len(n) == 25 and n.endswith(".json") and n[:20].isdigit()]
    return max(versions, default=-1)


def table_state(spark: Any, path: str, app_id: str) -> TableState:
    """The latest snapshot's version, this app's transaction version, properties and schema.

    Read from the newest commit's checksum file (`<version>.crc`: Delta writes the table's
    metadata and every app's transaction version into it after each commit) when it is there.
    Otherwise from Delta's snapshot in the JVM, except the transaction version: a snapshot works it
    out with a Spark job over the whole log state (6-10 s per batch on 2 loaded cores, against a
    tenth of that for the commit itself), so it is looked up in the newest commits instead, the
    snapshot's answer being the fallback when the log no longer holds them."""
    latest = latest_version(path)
    if latest < 0:
        return TableState(version=-1)
    crc = _read_json(Path(path) / "_delta_log" / f"{latest:020d}.crc")
    meta = crc.get("metadata") if isinstance(crc, dict) else None
    if isinstance(meta, dict) and isinstance(crc.get("setTransactions"), list):
        txn = next((int(t["version"]) for t in crc["setTransactions"] if t.get("appId") == app_id), None)
        newest = commit(path, latest)
        return TableState(
            version=latest,
            txn=txn,
            properties={str(k): str(v) for k, v in (meta.get("configuration") or {}).items()},
            schema_json=meta.get("schemaString"),
            timestamp_ms=newest.timestamp_ms if newest else 0,
        )
    return _snapshot_state(spark, path, app_id)


def _snapshot_state(spark: Any, path: str, app_id: str) -> TableState:
    jvm = spark._jvm
    none = jvm.scala.Option.empty()
    snap = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, path).update(False, none, none)
    version = int(snap.version())
    if version < 0:
        return TableState(version=-1)
    found, txn = _newest_txn(path, app_id, version)
    if not found:
        option = snap.transactions().get(app_id)
        txn = int(option.get()) if option.isDefined() else None
    conf = jvm.scala.jdk.javaapi.CollectionConverters.asJava(snap.metadata().configuration())
    return TableState(
        version=version,
        txn=txn,
        properties={str(k): str(v) for k, v in conf.items()},
        schema_json=str(snap.metadata().schemaString()),
        timestamp_ms=int(snap.timestamp()),
    )


def _newest_txn(path: str, app_id: str, latest: int) -> tuple[bool, int | None]:
    """(answered, the app's transaction version) from the commits, newest first: an app's versions
    only grow, so the newest commit naming it has its current one. Not answered when a commit the
    search needs is gone (log clean-up), or after TXN_SEARCH commits without it (a long history of
    other writers: the snapshot's one Spark job is cheaper then)."""
    for v in range(latest, max(-1, latest - TXN_SEARCH), -1):
        c = commit(path, v)
        if c is None:
            return False, None
        if app_id in c.txns:
            return True, c.txns[app_id]
    return latest < TXN_SEARCH, None


def last_checkpoint(path: str) -> int:
    """The version of the newest log checkpoint `_last_checkpoint` names (0: none yet)."""
    data = _read_json(Path(path) / "_delta_log" / "_last_checkpoint")
    try:
        return int(data["version"])
    except (KeyError, TypeError, ValueError):
        return 0


def checkpoint(spark: Any, path: str) -> int:
    """Checkpoint the table's newest snapshot with Delta's own `DeltaLog.checkpoint`; its version.
    Delta logs and swallows its own failures there, so success is read back from
    `_last_checkpoint`: RuntimeError when it does not name the version."""
    jvm = spark._jvm
    none = jvm.scala.Option.empty()
    log = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, path)
    snapshot = log.update(False, none, none)
    version = int(snapshot.version())
    log.checkpoint(snapshot, none)
    if last_checkpoint(path) < version:
        raise RuntimeError(f"Delta wrote no checkpoint of version {version} (its log's warning says why)")
    return version


def _read_json(file: Path) -> Any:
    try:
        return json.loads(file.read_text())
    except (FileNotFoundError, ValueError):
        return None


@contextlib.contextmanager
def tagged(spark: Any, text: str) -> Iterator[None]:
    """SQL commands run meanwhile (ALTER, RESTORE, MERGE, OPTIMIZE, VACUUM) carry `text` as their
    commit's userMetadata, so the sink can tell its own commits from other writers'."""
    spark.conf.set(USER_METADATA_CONF, text)
    try:
        yield
    finally:
        spark.conf.unset(USER_METADATA_CONF)


@dataclass(frozen=True)
class Commit:
    """One commit of the log, summed up."""

    version: int
    operation: str
    user_metadata: str
    txns: dict[str, int]  # app id -> transaction version
    data_change: bool  # it added or removed data (OPTIMIZE, VACUUM and property changes do not)
    files_added: int
    rows: int
    timestamp_ms: int
    engine: str

    def by(self, app_id: str) -> bool:
        return app_id in self.txns or self.user_metadata.startswith(f"{TAG}:{app_id}:")

    def describe(self) -> str:
        who = ", ".join(f"transaction app {a}" for a in self.txns) or self.user_metadata or self.engine or "unknown"
        return f"version {self.version} ({self.operation} by {who})"


def commit(path: str, version: int) -> Commit | None:
    """Commit `version`, or None when the log no longer holds its file."""
    try:
        text = (Path(path) / "_delta_log" / f"{version:020d}.json").read_text()
    except FileNotFoundError:
        return None
    info: dict[str, Any] = {}
    txns: dict[str, int] = {}
    data_change, added, rows = False, 0, 0
    for line in text.splitlines():
        if not line.strip():
            continue
        action = json.loads(line)
        if "commitInfo" in action:
            info = action["commitInfo"]
        elif "txn" in action:
            txns[str(action["txn"]["appId"])] = int(action["txn"]["version"])
        elif "add" in action or "remove" in action:
            act = action.get("add") or action.get("remove")
            data_change = data_change or bool(act.get("dataChange", True))
            if "add" in action and act.get("dataChange", True):
                added += 1
                rows += _num_records(act)
    return Commit(
        version=version,
        operation=str(info.get("operation", "")),
        user_metadata=str(info.get("userMetadata") or ""),
        txns=txns,
        data_change=data_change,
        files_added=added,
        rows=rows,
        timestamp_ms=int(info.get("timestamp", 0)),
        engine=str(info.get("engineInfo", "")),
    )


def _num_records(add: dict[str, Any]) -> int:
    try:
        return int(json.loads(add.get("stats") or "{}").get("numRecords", 0))
    except (TypeError, ValueError):
        return 0


def find_txn(path: str, app_id: str, version: int, after: int, upto: int) -> Commit | None:
    """The commit in (after, upto] that recorded `app_id`'s transaction `version`."""
    for v in range(upto, after, -1):
        c = commit(path, v)
        if c is not None and c.txns.get(app_id) == version:
            return c
    return None
