"""How a Delta sink's rows become commits; delta_sink.py decides whether and when to write.

A micro-batch is one commit stamped with Delta's idempotent-write pair, `txnAppId` (the sink's
app id) and `txnVersion` (delta_log.txn_version: the attempt's seq and the batch), and a
`userMetadata` tag naming the sink and the batch: `append` and `complete` (overwrite) go through
delta_idempotent_write.py with the pipeline's writer options (Delta's own write path, minus the
state reconstruction its version lookup costs), `update` through one MERGE by the key columns
(compared null-safely), for which the pair is set as session confs around the statement.
A batch job's write carries the tag but no transaction version. A table that does not exist yet
is created empty, with the pipeline's schema, `partition_by` and the sink's table properties (its
log checkpoint interval, delta_log_checkpoint.py) in the creating commit.
"""

from __future__ import annotations

import hashlib
from typing import Any, Mapping, Sequence

from . import delta_claim, delta_log, delta_schema
from .delta_errors import RUNBOOK
from .delta_idempotent_write import write_once
from .delta_maintenance import OPTION_KEYS


class DeltaWriter:
    """The writes of one sink's table: its path, app id, schema, output mode and writer options."""

    def __init__(
        self,
        path: str,
        app: str,
        schema: Any,
        *,
        output_mode: str,
        key_columns: Sequence[str] = (),
        partition_by: Sequence[str] = (),
        options: Mapping[str, str] | None = None,
    ):
        self.path, self.app, self.schema = path, app, schema
        self.output_mode, self.key_columns, self.partition_by = output_mode, tuple(key_columns), tuple(partition_by)
        self.writer_options = {k: str(v) for k, v in (options or {}).items() if k not in OPTION_KEYS}
        self.merge_schema = self.writer_options.get("mergeSchema", "false").lower() == "true"

    def ensure_table(self, spark: Any, properties: Mapping[str, str]) -> None:
        """Create the table when there is none; `properties` (Delta's `delta.*` table properties)
        are part of the creating commit."""
        if delta_log.table_exists(self.path):
            return
        writer = (
            self.empty(spark)
            .write.format("delta")
            .mode("append")
            .options(**properties)
            .option("userMetadata", delta_log.tag(self.app, "create"))
        )
        if self.partition_by:
            writer = writer.partitionBy(*self.partition_by)
        try:
            writer.save(self.path)
        except Exception as exc:
            if not (delta_claim.is_conflict(exc) and delta_log.table_exists(self.path)):
                raise

    def empty(self, spark: Any) -> Any:
        return spark.createDataFrame([], self.schema)

    # -- a micro-batch: one commit with the transaction version `txn`

    def write_batch(self, spark: Any, df: Any, txn: int, batch_id: int) -> None:
        what = f"batch {batch_id}"
        try:
            if self.output_mode == "update":
                self._merge(spark, df, txn, what)
            else:
                self.commit_txn(spark, df, txn, "overwrite" if self.output_mode == "complete" else "append", what)
        except Exception as exc:
            if delta_schema.is_schema_refusal(exc):
                current = delta_log.table_state(spark, self.path, self.app)
                delta_schema.check(self.path, current.schema_json, df.schema, merge_schema=self.merge_schema)
            if "MULTIPLE_SOURCE_ROW_MATCHING_TARGET_ROW" in str(exc):
                raise ValueError(
                    f"Delta sink {self.path} (update mode): micro-batch {batch_id} holds several rows "
                    f"with the same key {list(self.key_columns)}; MERGE needs one row per key "
                    f'({RUNBOOK}, "Update mode")'
                ) from exc
            raise

    def commit_txn(self, spark: Any, df: Any, txn: int, mode: str, what: str) -> None:
        write_once(
            spark,
            df,
            self.path,
            app_id=self.app,
            version=txn,
            mode=mode,
            options=self.writer_options,
            user_metadata=delta_log.tag(self.app, what),
        )

    def _merge(self, spark: Any, df: Any, txn: int, what: str) -> None:
        view = f"headrace_delta_{hashlib.sha1(self.app.encode()).hexdigest()[:12]}"
        df.createOrReplaceTempView(view)
        on = " AND ".join(f"t.`{k}` <=> s.`{k}`" for k in self.key_columns)
        confs = {"spark.databricks.delta.write.txnAppId": self.app, "spark.databricks.delta.write.txnVersion": str(txn)}
        if self.merge_schema:
            confs["spark.databricks.delta.schema.autoMerge.enabled"] = "true"
        for key, value in confs.items():
            spark.conf.set(key, value)
        try:
            with delta_log.tagged(spark, delta_log.tag(self.app, what)):
                spark.sql(
                    f"MERGE INTO {delta_log.quoted(self.path)} AS t USING {view} AS s ON {on} "
                    f"WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *"
                )
        finally:
            for key in confs:
                spark.conf.unset(key)
            spark.catalog.dropTempView(view)

    # -- a batch job: no transaction version

    def write_untracked(self, spark: Any, df: Any) -> None:
        if self.output_mode == "update":
            with delta_log.tagged(spark, delta_log.tag(self.app, "batch job")):
                self._merge_untracked(spark, df)
            return
        mode = "overwrite" if self.output_mode == "complete" else "append"
        df.write.format("delta").mode(mode).options(**self.writer_options).option(
            "userMetadata", delta_log.tag(self.app, "batch job")
        ).save(self.path)

    def _merge_untracked(self, spark: Any, df: Any) -> None:
        view = f"headrace_delta_batch_{hashlib.sha1(self.app.encode()).hexdigest()[:12]}"
        df.createOrReplaceTempView(view)
        on = " AND ".join(f"t.`{k}` <=> s.`{k}`" for k in self.key_columns)
        try:
            spark.sql(
                f"MERGE INTO {delta_log.quoted(self.path)} AS t USING {view} AS s ON {on} "
                f"WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *"
            )
        finally:
            spark.catalog.dropTempView(view)
