"""One idempotent Delta write (append or overwrite) without Delta's state reconstruction.

A DataFrame write with `txnAppId` and `txnVersion` first asks the transaction's snapshot for the
app's last version (`OptimisticTransaction.txnVersion`), and open-source Delta answers that with
three Spark jobs over the log's state, even where the newest checksum file (`<version>.crc`)
already lists every app's version: 0.5 of a 0.7 s commit on a 2-core driver
(docs/benchmarks.md, "Where the 0.65 s goes"). Every commit makes a new snapshot, so a streaming
sink paid it for every micro-batch.

`write_once` runs the same steps as Delta's own path write (`WriteIntoDelta.run`, delta-io/delta
4.4): a transaction on the table, the skip when the app has already reached the version, the
rows written and committed with the `SetTransaction` action. Only the question is answered
differently: from the checksum file of the transaction's read version when it lists the set
transactions, else by Delta's lookup. The app id is recorded among the transaction's reads
exactly as Delta's lookup does, so a concurrent commit of the same app id still fails this one
(Delta's conflict check), and the table's log is what Delta itself would have written.

It calls Delta's JVM classes as the pinned release has them (`WriteIntoDelta`'s and
`DeltaOperations.Write`'s arguments, the transaction's `readTxn`, which Scala leaves reachable):
a Delta upgrade runs tests/integration/test_delta_idempotent_write.py first, which fails on any
drift in them.
"""

from __future__ import annotations

from typing import Any, Mapping


def write_once(
    spark: Any,
    df: Any,
    path: str,
    *,
    app_id: str,
    version: int,
    mode: str,
    options: Mapping[str, str],
    user_metadata: str,
) -> bool:
    """Write `df` to the Delta table at `path` as the app's transaction `version`, in `mode`
    ("append" or "overwrite"); False when the app's last version is already >= `version`
    (nothing written, as Delta skips it). Raises Delta's own errors (conflicts, schema)."""
    jvm = spark._jvm
    delta = jvm.org.apache.spark.sql.delta
    jspark = spark._jsparkSession
    log = delta.DeltaLog.forTable(jspark, path)
    txn = log.startTransaction()
    active = getattr(getattr(delta, "OptimisticTransaction$"), "MODULE$")  # as withNewTransaction does
    active.setActive(txn)
    try:
        if last_version(txn, app_id) >= version:
            return False
        params = {
            **options,
            "path": path,
            "txnAppId": app_id,
            "txnVersion": str(version),
            "userMetadata": user_metadata,
        }
        delta_options = delta.DeltaOptions(_scala_map(jvm, params), jspark.sessionState().conf())
        table_conf = _scala_map(jvm, {k: v for k, v in options.items() if k.startswith("delta.")})
        configs = getattr(getattr(delta, "DeltaConfigs$"), "MODULE$")
        save_mode = jvm.org.apache.spark.sql.SaveMode.valueOf(mode.capitalize())
        none = jvm.scala.Option.empty()
        command = delta.commands.WriteIntoDelta(
            log,
            save_mode,
            delta_options,
            _scala_seq(jvm, []),
            configs.validateConfigurations(table_conf),
            df._jdf,
            none,
            none,
            False,
        )
        data = command.writeAndReturnCommitData(txn, jspark, none, False)
        operation = getattr(delta, "DeltaOperations$Write")(
            save_mode,
            jvm.scala.Option.apply(_scala_seq(jvm, [])),
            delta_options.replaceWhere(),
            jvm.scala.Option.apply(user_metadata),
            none,
            _flag(jvm, delta_options.canOverwriteSchema()),
            _flag(jvm, delta_options.canMergeSchema()),
            none,
            none,
        )
        txn.commitIfNeeded(data.actions(), operation, data.stringTags())
        return True
    finally:
        active.clearActive()


def last_version(txn: Any, app_id: str) -> int:
    """The app's last transaction version as of the transaction's read version (-1: none), read
    from that version's checksum file when it lists the set transactions; the app id is added to
    the transaction's reads first, as `OptimisticTransaction.txnVersion` does."""
    checksum = txn.snapshot().checksumOpt()
    listed = checksum.get().setTransactions() if checksum.isDefined() else None
    if listed is None or not listed.isDefined():
        return int(txn.txnVersion(app_id))  # Delta's own lookup (a Spark job over the log)
    txn.readTxn().addOne(app_id)
    found = -1
    it = listed.get().iterator()
    while it.hasNext():
        action = it.next()
        if action.appId() == app_id:
            found = max(found, int(action.version()))
    return found


def _flag(jvm: Any, value: bool) -> Any:
    """Some(true) for a set flag, else None: how Delta's own write records it in the commit."""
    return jvm.scala.Option.apply(True) if value else jvm.scala.Option.empty()


def _scala_map(jvm: Any, values: Mapping[str, str]) -> Any:
    java = jvm.java.util.HashMap()
    for key, value in values.items():
        java.put(key, value)
    return jvm.org.apache.spark.api.python.PythonUtils.toScalaMap(java)


def _scala_seq(jvm: Any, values: list[str]) -> Any:
    java = jvm.java.util.ArrayList()
    for value in values:
        java.add(value)
    return jvm.org.apache.spark.api.python.PythonUtils.toSeq(java)
