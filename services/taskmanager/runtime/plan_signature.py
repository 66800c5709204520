"""The signature of a streaming query's state: its sources and stateful operators, read from the
optimized logical plan on the driver, without starting the query.

    plan_signature(df) -> {
      "version": 1, "streaming": True, "output_mode": "update" | None,
      "sources": [{"format": "redis_stream", "options": {"stream": "clicks"}}],
      "operators": [{"id": 0, "kind": "aggregate", "spark_name": "stateStoreSave",
                     "key_names": ["window", "url"], "key_exprs": ["window", "url"],
                     "key_types": ["struct<start:timestamp,end:timestamp>", "string"],
                     "value_names": ["count"], "value_types": ["bigint"],
                     "stores": [{"name": "default", "key_names", "key_types", "value_names", "value_types"}]}]}

What it predicts is what Spark 4.3 writes into `state/<id>/<partition>/[<store>/]_metadata/schema`
([T]: checked against real checkpoints in tests/integration/test_plan_signature.py; [M]: checked
by hand against a real checkpoint once):
  * operator ids: pre-order over the plan, children left to right, so operator 0 is the one
    nearest the sink (IncrementalExecution numbers them in a top-down transform) [T];
  * aggregate: key = the grouping columns (`_groupingexpression` for a computed one), value = the
    aggregate BUFFERS with stateFormatVersion 2 (count -> count: bigint; avg -> sum: double,
    count: bigint) [T]; version 1 stores the keys too;
  * deduplicate: key = the columns, value = __dummy__: void [T]; within watermark:
    expiresAtMicros: bigint [T]; distinct() is a deduplicate by every column [M];
  * stream-stream join: keyToNumValues and keyWithIndexToValue per side, keyed by the equi-join
    keys (field0..), the latter's value = the side's columns + matched [T];
  * session window aggregate: key = the other grouping columns + sessionStartTime, value = all
    grouping columns + buffers [M];
  * limit (append mode only): key: void, value: bigint [M];
  * applyInPandasWithState: key = grouping columns, value = groupState struct [M] (+ timeout);
  * transformWithState: keys only (its stores are column families Spark names at run time).
Sources: every streaming relation of the analyzed plan in pre-order, as Spark lists them in its
offset log (a DataFrame unioned with itself has two) [M].

`check_before_start` is the driver's last word before a restore: it raises IncompatibleStateError
or returns the operators whose state must be dropped (allowNonRestoredState).
"""

from __future__ import annotations

import json
from typing import Any, Iterator, Mapping

from shared import restore_compat
from shared.errors import StateError

SIGNATURE_VERSION = 1

# Options that say WHICH data a source reads (its offsets mean nothing for other data). Connection
# settings are left out on purpose: a job moved to another cluster reads the same stream elsewhere.
IDENTIFYING_OPTIONS = {
    "redis_stream": ("stream",),
    "datagen": ("seed",),
    "kafka": ("subscribe", "subscribepattern", "assign"),
    "socket": ("host", "port"),
    "parquet": ("path",),
    "json": ("path",),
    "csv": ("path",),
    "text": ("path",),
    "orc": ("path",),
}

_SPARK_NAMES = {
    "aggregate": "stateStoreSave",
    "sessionWindowAggregate": "sessionWindowStateStoreSaveExec",
    "deduplicate": "dedupe",
    "deduplicateWithinWatermark": "dedupeWithinWatermark",
    "join": "symmetricHashJoin",
    "limit": "globalLimit",
    "flatMapGroupsWithState": "flatMapGroupsWithState",
    "applyInPandasWithState": "applyInPandasWithState",
    "transformWithState": None,  # transformWithStateExec or ...InPySparkExec: compared by kind
}


_KINDS_BY_NODE = {
    "Aggregate": "aggregate",
    "Deduplicate": "deduplicate",
    "DeduplicateWithinWatermark": "deduplicateWithinWatermark",
    "Join": "join",
    "GlobalLimit": "limit",
    "FlatMapGroupsInPandasWithState": "applyInPandasWithState",
    "FlatMapGroupsWithState": "flatMapGroupsWithState",
    "TransformWithState": "transformWithState",
    "TransformWithStateInPySpark": "transformWithState",
}


class IncompatibleStateError(StateError):
    """The query cannot start from the snapshot; str() says what changed and what to do."""

    def __init__(self, verdict: restore_compat.Verdict, snapshot: str = "this snapshot"):
        self.verdict = verdict
        self.problems = list(verdict.problems)
        self.hints = list(verdict.hints)
        super().__init__(verdict.message(snapshot))


def check_before_start(
    df,
    snapshot_meta: Mapping[str, Any],
    *,
    shuffle_partitions: int | None,
    allow_non_restored_state: bool,
    output_mode: str | None = None,
) -> list[int]:
    """Compare the query about to start with the snapshot it restores. Returns the ids of the
    operators whose state must be dropped (only with allowNonRestoredState, only trailing ones);
    raises IncompatibleStateError when Spark could not restore it (or would restore it wrongly)."""
    # A restored query runs with the state format versions its checkpoint pinned, not the session's.
    pinned = (snapshot_meta.get("spark") or {}).get("conf") or {}
    plan = plan_signature(df, output_mode=output_mode, pinned_conf=pinned)
    verdict = restore_compat.check(
        snapshot_meta,
        plan,
        new_shuffle_partitions=shuffle_partitions,
        allow_non_restored_state=allow_non_restored_state,
    )
    if not verdict.ok:
        raise IncompatibleStateError(verdict, restore_compat.describe_snapshot(snapshot_meta))
    return list(verdict.drop_operators)


def plan_signature(
    df, *, output_mode: str | None = None, pinned_conf: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """See the module docstring. `output_mode` (the sink's) decides whether a limit keeps state
    (it does in append mode, the default when not given). `pinned_conf`: a checkpoint's pinned
    Spark options, which win over the session's for the state format versions."""
    if not df.isStreaming:
        return {
            "version": SIGNATURE_VERSION,
            "streaming": False,
            "output_mode": output_mode,
            "sources": [],
            "operators": [],
        }
    spark = df.sparkSession
    analyzed = df._jdf.queryExecution().analyzed()
    # The optimizer rewrites what the physical planner sees (distinct() becomes a Deduplicate,
    # columns a join keeps in its state are pruned), and IncrementalExecution uses this optimizer.
    plan = spark._jsparkSession.sessionState().optimizer().execute(analyzed)
    walker = _Walker(spark, output_mode, pinned_conf or {})
    operators: list[dict[str, Any]] = []
    for node in _preorder(plan):
        op = walker.operator(node, node.nodeName())
        if op is not None:
            operators.append({"id": len(operators), **op})
    # Spark gives every occurrence of a streaming relation in the analyzed plan, in pre-order, its
    # own source and offset (a DataFrame unioned with itself reads its source twice).
    sources = [_source(n) for n in _preorder(analyzed) if n.nodeName() in ("StreamingRelationV2", "StreamingRelation")]
    return {
        "version": SIGNATURE_VERSION,
        "streaming": True,
        "output_mode": output_mode,
        "sources": sources,
        "operators": operators,
    }


# ---------------------------------------------------------------- plan walking


def _seq(scala_seq) -> list:
    return [scala_seq.apply(i) for i in range(scala_seq.size())]


def _preorder(node) -> Iterator[Any]:
    stack = [node]
    while stack:
        n = stack.pop()
        yield n
        stack.extend(reversed(_seq(n.children())))


def _expr_text(expr) -> str:
    """An expression as the user wrote it, without the qualifiers of DataFrame aliases."""
    if expr.nodeName() == "AttributeReference":
        return str(expr.name())
    return str(expr.sql())


def _type(data_type) -> str:
    return restore_compat.type_string(json.loads(data_type.json()))


def _source(node) -> dict[str, Any]:
    fmt = str(node.sourceName())
    try:
        if node.nodeName() == "StreamingRelationV2":
            raw = node.extraOptions().asCaseSensitiveMap()
            opts = {str(k).lower(): str(raw[k]) for k in raw.keySet()}
        else:
            raw = node.dataSource().options()  # a Scala Map
            opts = {str(k).lower(): str(raw.apply(k)) for k in _seq(raw.keys().toSeq())}
    except Exception:  # noqa: BLE001 - options only refine the identity; the format stays
        opts = {}
    keep = IDENTIFYING_OPTIONS.get(fmt.lower(), ())
    return {"format": fmt, "options": {k: opts[k] for k in keep if k in opts}}


def _store(name: str, key: tuple[list[str], list[str]], value: tuple[list[str], list[str]] | None) -> dict:
    return {
        "name": name,
        "key_names": key[0],
        "key_types": key[1],
        "value_names": value[0] if value else None,
        "value_types": value[1] if value else None,
    }


class _Walker:
    def __init__(self, spark, output_mode: str | None, pinned: Mapping[str, str]):
        self.jvm = spark._jvm
        self.output_mode = (output_mode or "append").lower()

        def conf(key: str) -> int:
            return int(pinned.get(key) or spark.conf.get(key, "2"))

        self.agg_format = conf("spark.sql.streaming.aggregation.stateFormatVersion")
        self.join_format = conf("spark.sql.streaming.join.stateFormatVersion")

    def operator(self, node, name: str) -> dict[str, Any] | None:
        """The stateful operator `node` becomes, or None. One whose state we cannot read still
        counts (its kind and place are compared), with unknown schemas."""
        if not node.isStreaming():
            return None
        try:
            return self._operator(node, name)
        except Exception as exc:  # a plan shape we did not foresee must not stop a job
            kind = _KINDS_BY_NODE.get(name)
            if kind is None:
                raise
            return {
                "kind": kind,
                "spark_name": _SPARK_NAMES.get(kind),
                "key_names": None,
                "key_exprs": None,
                "key_types": None,
                "value_names": None,
                "value_types": None,
                "stores": [],
                "unreadable": f"{type(exc).__name__}: {str(exc)[:300]}",
            }

    def _operator(self, node, name: str) -> dict[str, Any] | None:
        if name == "Aggregate":
            return self._aggregate(node)
        if name == "Deduplicate":
            return self._dedupe(node, "deduplicate", (["__dummy__"], ["void"]))
        if name == "DeduplicateWithinWatermark":
            return self._dedupe(node, "deduplicateWithinWatermark", (["expiresAtMicros"], ["bigint"]))
        if name == "Join" and node.left().isStreaming() and node.right().isStreaming():
            return self._join(node)
        if name == "GlobalLimit" and self.output_mode == "append":
            return _op("limit", [], (["key"], ["void"]), (["value"], ["bigint"]))
        if name == "FlatMapGroupsInPandasWithState":
            return self._pandas_state(node)
        if name == "FlatMapGroupsWithState":
            return _op(
                "flatMapGroupsWithState",
                self._exprs(_seq(node.groupingAttributes()), node),
                self._fields(_seq(node.groupingAttributes())),
                None,
            )
        if name in ("TransformWithState", "TransformWithStateInPySpark"):
            keys = _seq(node.groupingAttributes())
            op = _op("transformWithState", self._exprs(keys, node), self._fields(keys), None)
            op["stores"] = []  # column families named by the user's processor: not compared
            return op
        return None

    # -- helpers

    @staticmethod
    def _fields(attrs: list) -> tuple[list[str], list[str]]:
        return [str(a.name()) for a in attrs], [_type(a.dataType()) for a in attrs]

    def _exprs(self, attrs: list, node) -> list[str]:
        """The keys as the user wrote them: a computed key's `_groupingexpression` column is
        named after the expression it was pulled out of (the optimizer moves it into a Project)."""
        out = []
        for a in attrs:
            name = str(a.name())
            if name.startswith("_groupingexpression"):
                name = self._alias_source(node, a) or name
            out.append(name)
        return out

    def _alias_source(self, node, attr) -> str | None:
        expr_id = attr.exprId()
        for n in _preorder(node):
            if n.nodeName() != "Project":
                continue
            for e in _seq(n.projectList()):
                if e.nodeName() == "Alias" and e.exprId().equals(expr_id):
                    return _expr_text(e.child())
        return None

    # -- operators

    def _aggregate(self, node) -> dict[str, Any]:
        matched = self.jvm.org.apache.spark.sql.catalyst.planning.PhysicalAggregation.unapply(node)
        if not matched.isDefined():
            raise ValueError("PhysicalAggregation does not match the streaming aggregate")
        grouping = [g.toAttribute() for g in _seq(matched.get()._1())]
        aggregates = _seq(matched.get()._2())
        # Not an AggregateExpression (e.g. a Python UDAF): its buffer is opaque to us.
        opaque = any(agg.nodeName() != "AggregateExpression" for agg in aggregates)
        buffers = (
            None if opaque else [b for agg in aggregates for b in _seq(agg.aggregateFunction().aggBufferAttributes())]
        )
        session = [g for g in grouping if g.metadata().contains("spark.sessionWindow")]
        exprs = self._exprs(grouping, node)
        if session:
            others = [g for g in grouping if not g.metadata().contains("spark.sessionWindow")]
            names, types = self._fields(others)
            key = (names + ["sessionStartTime"], types + ["timestamp"])
            value = self._fields(grouping + buffers) if buffers is not None else None
            return _op("sessionWindowAggregate", exprs, key, value)
        value = None
        if buffers is not None:
            value = self._fields(buffers if self.agg_format >= 2 else grouping + buffers)
        return _op("aggregate", exprs, self._fields(grouping), value)

    def _dedupe(self, node, kind: str, value: tuple[list[str], list[str]]) -> dict[str, Any]:
        keys = _seq(node.keys())
        return _op(kind, self._exprs(keys, node), self._fields(keys), value)

    def _join(self, node) -> dict[str, Any]:
        matched = self.jvm.org.apache.spark.sql.catalyst.planning.ExtractEquiJoinKeys.unapply(node)
        if not matched.isDefined():
            raise ValueError("a stream-stream join needs an equality condition between the two sides")
        left_keys = _seq(matched.get()._2())
        key_types = [_type(k.dataType()) for k in left_keys]
        key = ([f"field{i}" for i in range(len(left_keys))], key_types)
        stores = []
        for side, child in (("left", node.left()), ("right", node.right())):
            out_names, out_types = self._fields(_seq(child.output()))
            value: tuple[list[str], list[str]] | None = (out_names, out_types)
            if self.join_format == 2:
                value = (out_names + ["matched"], out_types + ["boolean"])
            elif self.join_format != 1:
                value = None  # a format we have not measured: compare keys only
            stores.append(_store(f"{side}-keyToNumValues", key, (["value"], ["bigint"])))
            stores.append(_store(f"{side}-keyWithIndexToValue", (key[0] + ["index"], key[1] + ["bigint"]), value))
        op = _op("join", [_expr_text(k) for k in left_keys], key, None)
        op["stores"] = stores
        return op

    def _pandas_state(self, node) -> dict[str, Any]:
        keys = _seq(node.groupingAttributes())
        state = _type(node.stateType())
        names, types = ["groupState"], [state]
        if str(node.timeout().toString()) != "NoTimeout":
            names, types = names + ["timeoutTimestamp"], types + ["bigint"]
        return _op("applyInPandasWithState", self._exprs(keys, node), self._fields(keys), (names, types))


def _op(
    kind: str, exprs: list[str], key: tuple[list[str], list[str]], value: tuple[list[str], list[str]] | None
) -> dict[str, Any]:
    return {
        "kind": kind,
        "spark_name": _SPARK_NAMES.get(kind),
        "key_names": key[0],
        "key_exprs": exprs,
        "key_types": key[1],
        "value_names": value[0] if value else None,
        "value_types": value[1] if value else None,
        "stores": [_store("default", key, value)],
    }
