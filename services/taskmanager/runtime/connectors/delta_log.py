"""What the Delta connector reads of a table's transaction log: the one module that knows Delta
Lake's internals.

Two readers, for two needs:
  * the table's current state (version, this sink's transaction version, table properties,
    schema) from Delta's own `DeltaLog` in the driver's JVM, through py4j: the same snapshot
    Spark's writes check against, Delta's log checkpoints included. `DeltaLog.update` is an
    internal API (stable across Delta 2-4); everything else goes through SQL.
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

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


def table_state(spark: Any, path: str, app_id: str) -> TableState:
    """The latest snapshot (Delta's own, refreshed from the log)."""
    if not table_exists(path):
        return TableState(version=-1)
    jvm = spark._jvm
    none = jvm.scala.Option.empty()
    snap = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, path).update(False, none, none)
    version = int(snap.version())
    if version < 0:
        return TableState(version=-1)
    txn = snap.transactions().get(app_id)
    conf = jvm.scala.jdk.javaapi.CollectionConverters.asJava(snap.metadata().configuration())
    return TableState(version=version, txn=int(txn.get()) if txn.isDefined() else None,
                      properties={str(k): str(v) for k, v in conf.items()},
                      schema_json=str(snap.metadata().schemaString()), timestamp_ms=int(snap.timestamp()))


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
    return Commit(version=version, operation=str(info.get("operation", "")),
                  user_metadata=str(info.get("userMetadata") or ""), txns=txns, data_change=data_change,
                  files_added=added, rows=rows, timestamp_ms=int(info.get("timestamp", 0)),
                  engine=str(info.get("engineInfo", "")))


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
