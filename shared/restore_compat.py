"""Can a job start from this checkpoint or savepoint? The rules, without Spark.

Spark restores a streaming query from a checkpoint only when (measured on 4.3):
  * the sources are the same, position by position (the offset log holds one offset per source);
  * the stateful operators are exactly the same list: Spark numbers them in pre-order from the
    sink (operator 0 is the one nearest the sink) and refuses any added, removed or renamed one
    (STREAMING_STATEFUL_OPERATOR_NOT_MATCH_IN_STATE_METADATA), unless the state directory of a
    removed operator is deleted first, which is what allowNonRestoredState does here;
  * each state store's key and value schemas have the same types, position by position (its
    StateSchemaCompatibilityChecker ignores field names).
And it silently keeps the checkpoint's `spark.sql.shuffle.partitions` (the state partition
count), whatever the new job sets.

Beyond Spark, key names are compared too: a grouping key changed from `url` to `user_id` has
the same types, so Spark would restore it and mix counts per url into counts per user.

Both sides are given as plan signatures (services/taskmanager/runtime/plan_signature.py); the
snapshot side falls back to the state schema files it recorded when it has no signature (older
snapshots). Types are Spark type strings (`bigint`, `struct<start:timestamp,end:timestamp>`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

# Operator names Spark writes into state/<id>/_metadata/metadata -> our operator kinds.
SPARK_OPERATOR_KINDS = {
    "stateStoreSave": "aggregate",
    "sessionWindowStateStoreSaveExec": "sessionWindowAggregate",
    "dedupe": "deduplicate",
    "dedupeWithinWatermark": "deduplicateWithinWatermark",
    "symmetricHashJoin": "join",
    "globalLimit": "limit",
    "flatMapGroupsWithState": "flatMapGroupsWithState",
    "applyInPandasWithState": "applyInPandasWithState",
    "transformWithStateExec": "transformWithState",
    "transformWithStateInPySparkExec": "transformWithState",
}
_AGGREGATES = ("aggregate", "sessionWindowAggregate")
UNKNOWN_KIND = "stateful operator"  # the snapshot does not say which kind
# Names Spark makes up for state columns: they say nothing about what the column holds.
_SYNTHETIC_NAME = re.compile(
    r"^(_groupingexpression.*|field\d+|index|value|key|matched|__dummy__|"
    r"expiresAtMicros|sessionStartTime|groupState|timeoutTimestamp)$"
)

HINT_FRESH_SOURCE = (
    "the snapshot's offsets belong to the old source and cannot be used for another one: "
    "keep the source as it was, or start the new pipeline as a fresh job (without a savepoint)"
)
HINT_NO_NEW_STATE = (
    "Spark cannot add a stateful operator to an existing checkpoint: keep the stateful "
    "operators as they were, or start the new pipeline as a fresh job (without a savepoint)"
)
HINT_CHANGED_STATE = (
    "the state in the snapshot was built by the old operator and cannot be read by the new "
    "one: keep the operator (its keys and aggregates) as it was, or start the new pipeline "
    "as a fresh job (without a savepoint)"
)
HINT_ALLOW_DROP = (
    "to start without the state of removed operators, submit with allowNonRestoredState=true "
    "(CLI: --allow-non-restored-state)"
)
HINT_DROP_ONLY_TRAILING = (
    "allowNonRestoredState can only drop the state of operators numbered after every remaining one: Spark "
    "numbers stateful operators from the sink towards the sources (0 first), so removing or changing an "
    "operator nearer the sink renumbers the others and Spark would read one operator's state as another's"
)
HINT_RENAMED_KEY = (
    "if only the column's name changed and it holds the same values, give it its old name "
    '(e.g. .alias("url")) before the stateful operator'
)


def partition_hint(n: int) -> str:
    return (
        f"the state partition count is fixed when a job first starts (like Flink's max parallelism): "
        f"drop the option or set it to {n}; parallelism can still change"
    )


# ---------------------------------------------------------------- types

_SIMPLE = {"long": "bigint", "integer": "int", "short": "smallint", "byte": "tinyint"}
_PLAIN_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def type_string(t: Any) -> str:
    """A Spark DataType in its JSON form (`DataType.json()`, or a schema file's field type) as a
    type string: `bigint`, `struct<start:timestamp,end:timestamp>`, `array<string>`."""
    if isinstance(t, str):
        return _SIMPLE.get(t, t)
    kind = t.get("type")
    if kind == "struct":
        return "struct<" + ",".join(f"{_quote(f['name'])}:{type_string(f['type'])}" for f in t["fields"]) + ">"
    if kind == "array":
        return f"array<{type_string(t['elementType'])}>"
    if kind == "map":
        return f"map<{type_string(t['keyType'])},{type_string(t['valueType'])}>"
    if kind == "udt":
        return type_string(t["sqlType"])
    raise ValueError(f"unknown Spark type {t!r}")


def _quote(name: str) -> str:
    return name if _PLAIN_NAME.match(name) else "`" + name.replace("`", "``") + "`"


def type_shape(s: str) -> str:
    """`s` without its struct field names: what Spark compares (positionally) on restore."""
    shape, end = _parse_type(s, 0)
    if end != len(s):
        raise ValueError(f"cannot parse type {s!r} at {end}")
    return shape


def _parse_type(s: str, i: int) -> tuple[str, int]:
    for head in ("struct<", "array<", "map<"):
        if s.startswith(head, i):
            i += len(head)
            break
    else:
        j, depth = i, 0
        while j < len(s) and (depth or s[j] not in ",<>"):
            depth += {"(": 1, ")": -1}.get(s[j], 0)
            j += 1
        return s[i:j], j
    parts: list[str] = []
    while s[i] != ">":
        if head == "struct<":
            i = _skip_name(s, i)
        part, i = _parse_type(s, i)
        parts.append(part)
        if s[i] == ",":
            i += 1
    return f"{head}{','.join(parts)}>", i + 1


def _skip_name(s: str, i: int) -> int:
    if s[i] == "`":
        i += 1
        while not (s[i] == "`" and s[i + 1 : i + 2] != "`"):
            i += 2 if s[i] == "`" else 1
        i += 1
    else:
        i = s.index(":", i)
    assert s[i] == ":", s
    return i + 1


def _shapes(types: Sequence[str]) -> list[str]:
    return [type_shape(t) for t in types]


def _fmt(types: Sequence[str] | None, names: Sequence[str] | None = None) -> str:
    if types is None:
        return "(unknown)"
    if names and len(names) == len(types):
        return "(" + ", ".join(f"{n}: {t}" for n, t in zip(names, types, strict=True)) + ")"
    return "(" + ", ".join(types) + ")"


def schema_fields(schema: Mapping[str, Any] | None) -> tuple[list[str], list[str]] | None:
    """(names, type strings) of a StructType JSON dict, e.g. a state schema file's key schema."""
    if not schema:
        return None
    fields = schema.get("fields", [])
    return [f["name"] for f in fields], [type_string(f["type"]) for f in fields]


# ---------------------------------------------------------------- normalised operators


@dataclass(frozen=True)
class _Store:
    name: str
    key_names: tuple[str, ...] | None
    key_types: tuple[str, ...] | None
    value_names: tuple[str, ...] | None
    value_types: tuple[str, ...] | None


@dataclass(frozen=True)
class _Op:
    id: int
    kind: str
    spark_name: str | None
    keys: tuple[str, ...] | None  # what the operator is keyed by, for messages
    stores: dict[str, _Store]
    # The keys as the user wrote them (`upper(url)`, not Spark's `_groupingexpression`): only a
    # plan signature knows them, state schema files do not.
    key_exprs: tuple[str, ...] | None = None

    @property
    def label(self) -> str:
        by = {"join": " on ", "limit": ""}.get(self.kind, " by ")
        keys = ", ".join(self.keys) if self.keys else ""
        return f"operator {self.id} ({self.kind}{by + keys if keys and by else ''})"


def _tuple(v: Any) -> tuple[str, ...] | None:
    return None if v is None else tuple(str(x) for x in v)


def _ops_from_plan(plan: Mapping[str, Any]) -> list[_Op]:
    ops = []
    for o in plan.get("operators") or []:
        stores = {}
        for s in o.get("stores") or []:
            stores[s["name"]] = _Store(
                s["name"],
                _tuple(s.get("key_names")),
                _tuple(s.get("key_types")),
                _tuple(s.get("value_names")),
                _tuple(s.get("value_types")),
            )
        exprs = _tuple(o.get("key_exprs"))
        ops.append(
            _Op(int(o["id"]), o["kind"], o.get("spark_name"), exprs or _tuple(o.get("key_names")), stores, exprs)
        )
    return sorted(ops, key=lambda op: op.id)


def _ops_from_state_files(spark: Mapping[str, Any]) -> list[_Op]:
    """The snapshot's operators as its state metadata and schema files describe them."""
    ops = []
    for o in spark.get("operators") or []:
        stores = {}
        for s in o.get("stores") or []:
            key, value = schema_fields(s.get("key_schema")), schema_fields(s.get("value_schema"))
            stores[s["name"]] = _Store(
                s["name"],
                _tuple(key and key[0]),
                _tuple(key and key[1]),
                _tuple(value and value[0]),
                _tuple(value and value[1]),
            )
        name = o.get("name")  # None: Spark wrote no operator metadata (before 4.0)
        default = stores.get("default")
        keys = None
        if default is not None and default.key_names is not None:
            keys = tuple(n for n in default.key_names if not _SYNTHETIC_NAME.match(n))
        kind = SPARK_OPERATOR_KINDS.get(name, name) if name else UNKNOWN_KIND
        ops.append(_Op(int(o["id"]), kind, name, keys, stores))
    return sorted(ops, key=lambda op: op.id)


# ---------------------------------------------------------------- the verdict


@dataclass
class Verdict:
    problems: list[str] = field(default_factory=list)
    hints: list[str] = field(default_factory=list)
    drop_operators: list[int] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def refuse(self, problem: str, *hints: str) -> None:
        self.problems.append(problem)
        for h in hints:
            if h not in self.hints:
                self.hints.append(h)

    def message(self, what: str = "this snapshot") -> str:
        """Every problem, then what to do: the text a user reads."""
        lines = [f"The job cannot start from {what}:"]
        lines += [f"  - {p}" for p in self.problems]
        if self.hints:
            lines.append("What to do:")
            lines += [f"  - {h}" for h in self.hints]
        return "\n".join(lines)


def describe_snapshot(meta: Mapping[str, Any]) -> str:
    kind = meta.get("kind") or "snapshot"
    cid = meta.get("checkpoint_id")
    job = meta.get("job_id")
    out = kind if cid is None else f"{kind} {cid}"
    return f"{out} of job {job}" if job else out


def check(
    snapshot_meta: Mapping[str, Any],
    new_plan: Mapping[str, Any] | None,
    *,
    new_shuffle_partitions: int | None,
    allow_non_restored_state: bool,
) -> Verdict:
    """What stops a job with `new_plan` (a plan signature; None: the pipeline is unchanged, check
    the configuration only) and an explicit `spark.sql.shuffle.partitions` of
    `new_shuffle_partitions` (None: not set) from starting from the snapshot `snapshot_meta`."""
    v = Verdict()
    spark = snapshot_meta.get("spark") or {}
    if int(spark.get("batch_id", -1)) < 0:
        return v  # taken before the first batch: no offsets, no state, nothing pinned
    _check_partitions(v, spark, new_shuffle_partitions)
    if new_plan is None:
        return v
    if new_plan.get("streaming") is False:
        v.refuse(
            "the new pipeline is a batch job: only a streaming query can continue from a checkpoint or savepoint",
            "submit it without a savepoint",
        )
        return v
    old_plan = (snapshot_meta.get("pipeline") or {}).get("plan")
    _check_sources(v, old_plan, spark, new_plan.get("sources") or [])
    old_ops = _ops_from_plan(old_plan) if old_plan else _ops_from_state_files(spark)
    _check_operators(v, old_ops, _ops_from_plan(new_plan), allow_non_restored_state)
    return v


def state_partitions(spark: Mapping[str, Any]) -> int | None:
    """The snapshot's state partition count (fixed at the job's first start)."""
    if spark.get("state_partitions"):
        return int(spark["state_partitions"])
    for o in spark.get("operators") or []:
        for s in o.get("stores") or []:
            if s.get("partitions"):
                return int(s["partitions"])
    conf = (spark.get("conf") or {}).get("spark.sql.shuffle.partitions")
    return int(conf) if conf else None


def _check_partitions(v: Verdict, spark: Mapping[str, Any], new: int | None) -> None:
    old = state_partitions(spark)
    if new is None or old is None or int(new) == old:
        return
    v.refuse(
        f"spark.sql.shuffle.partitions is set to {new}, but the snapshot's state has {old} partitions "
        f"(Spark would keep {old} and ignore the option)",
        partition_hint(old),
    )


# ---------------------------------------------------------------- sources


def _source_text(s: Mapping[str, Any]) -> str:
    opts = ", ".join(f"{k}={v}" for k, v in sorted((s.get("options") or {}).items()))
    return f"{s.get('format')}({opts})" if opts else str(s.get("format"))


def _check_sources(
    v: Verdict, old_plan: Mapping[str, Any] | None, spark: Mapping[str, Any], new: Sequence[Mapping[str, Any]]
) -> None:
    if old_plan and old_plan.get("sources") is not None:
        old = old_plan["sources"]
        for i, (a, b) in enumerate(zip(old, new, strict=False)):
            oa, ob = a.get("options") or {}, b.get("options") or {}
            # Only options both signatures recorded: a newer signature may identify sources by more.
            # Kafka's subscribe, subscribePattern and assign are alternatives: one replaced by
            # another is a changed subscription, whatever the two name.
            differs = (
                a.get("format") != b.get("format")
                or any(oa[k] != ob[k] for k in oa.keys() & ob.keys())
                or (a.get("format") == "kafka" and oa.keys() != ob.keys())
            )
            if differs:
                v.refuse(f"source {i} changed: was {_source_text(a)}, now {_source_text(b)}", HINT_FRESH_SOURCE)
        if len(old) != len(new):
            v.refuse(
                f"the pipeline reads {len(new)} source(s), the snapshot has offsets for {len(old)}: "
                f"{', '.join(map(_source_text, old)) or 'none'}",
                HINT_FRESH_SOURCE,
            )
        return
    offsets = spark.get("source_offsets")
    if isinstance(offsets, list) and offsets and len(offsets) != len(new):
        v.refuse(
            f"the pipeline reads {len(new)} source(s), the snapshot has offsets for {len(offsets)}", HINT_FRESH_SOURCE
        )


# ---------------------------------------------------------------- operators


def _check_operators(v: Verdict, old: list[_Op], new: list[_Op], allow_drop: bool) -> None:
    old_by_id = {o.id: o for o in old}
    new_by_id = {o.id: o for o in new}
    changed = False
    for op_id in sorted(old_by_id.keys() & new_by_id.keys()):
        changes = _op_changes(old_by_id[op_id], new_by_id[op_id])
        if changes:
            changed = True
            problem, hints = changes
            v.refuse(problem, *hints)
    for op_id in sorted(new_by_id.keys() - old_by_id.keys()):
        v.refuse(f"{new_by_id[op_id].label} is new: the snapshot has no state for it", HINT_NO_NEW_STATE)
    removed = sorted(old_by_id.keys() - new_by_id.keys())
    if not removed:
        return
    labels = ", ".join(old_by_id[i].label for i in removed)
    droppable = not changed and removed[0] == len(new)
    if not allow_drop:
        v.refuse(
            f"{labels} {'is' if len(removed) == 1 else 'are'} not in the new pipeline: "
            f"{'its' if len(removed) == 1 else 'their'} state would not be restored",
            HINT_ALLOW_DROP if droppable else HINT_DROP_ONLY_TRAILING,
        )
    elif not droppable:
        v.refuse(
            f"{labels} cannot be dropped with allowNonRestoredState, because the remaining operators "
            f"do not match the snapshot's operators 0..{len(new) - 1}",
            HINT_DROP_ONLY_TRAILING,
        )
    else:
        v.drop_operators = removed


def _op_changes(old: _Op, new: _Op) -> tuple[str, list[str]] | None:
    if old.spark_name and new.spark_name:
        same_kind = old.spark_name == new.spark_name
    else:
        same_kind = UNKNOWN_KIND in (old.kind, new.kind) or old.kind == new.kind
    if not same_kind:
        hints = [HINT_CHANGED_STATE]
        return f"{old.label} in the snapshot is {new.label} in the new pipeline", hints
    what: list[str] = []
    hints = [HINT_CHANGED_STATE]
    if old.key_exprs is not None and new.key_exprs is not None and old.key_exprs != new.key_exprs:
        what.append(f"its key changed from ({', '.join(old.key_exprs)}) to ({', '.join(new.key_exprs)})")
        hints.append(HINT_RENAMED_KEY)
    for name in sorted(old.stores.keys() & new.stores.keys()):
        a, b = old.stores[name], new.stores[name]
        where = "" if name == "default" else f" in state store {name}"
        if _types_differ(a.key_types, b.key_types):
            what.append(
                f"its key types{where} changed: was {_fmt(a.key_types, a.key_names)}, "
                f"now {_fmt(b.key_types, b.key_names)}"
            )
        elif not what and _names_differ(a.key_names, b.key_names):
            what.append(
                f"its key changed{where}: was {_fmt(a.key_types, a.key_names)}, now {_fmt(b.key_types, b.key_names)}"
            )
            hints.append(HINT_RENAMED_KEY)
        if _types_differ(a.value_types, b.value_types):
            what.append(
                f"its state values{where} changed: was {_fmt(a.value_types, a.value_names)}, "
                f"now {_fmt(b.value_types, b.value_names)}"
            )
        elif new.kind in _AGGREGATES and _names_differ(a.value_names, b.value_names):
            what.append(
                f"its aggregates{where} changed: the state holds {_fmt(a.value_types, a.value_names)}, "
                f"the new pipeline keeps {_fmt(b.value_types, b.value_names)}"
            )
    if old.stores and new.stores and old.stores.keys() != new.stores.keys():
        what.append(f"its state stores changed: was {sorted(old.stores)}, now {sorted(new.stores)}")
    if not what:
        return None
    return f"{old.label}: " + "; ".join(what), hints


def _synthetic(name: str) -> bool:
    return bool(_SYNTHETIC_NAME.match(name))


def _types_differ(a: Sequence[str] | None, b: Sequence[str] | None) -> bool:
    if a is None or b is None:  # unknown on one side (an old snapshot, an operator we cannot read)
        return False
    return len(a) != len(b) or _shapes(a) != _shapes(b)


def _names_differ(a: Iterable[str] | None, b: Iterable[str] | None) -> bool:
    if a is None or b is None:
        return False
    a, b = list(a), list(b)
    return len(a) == len(b) and any(
        x != y and not _synthetic(x) and not _synthetic(y) for x, y in zip(a, b, strict=True)
    )
