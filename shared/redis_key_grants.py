"""The Redis data keys a job declares it reads and writes, and the ACL rules its lineage's user
gets from them (issue 43.5, second half; docs/runbooks/auth.md "Redis users").

A job that declares its keys is confined to them, as a Kafka principal is to the topics its ACLs
name:

    headrace.redis.keys.read   keys it only reads (XRANGE, XLEN, GET...)
    headrace.redis.keys.write  keys it reads and writes (a Redis sink's stream: XADD, XDEL)

Each a JSON list or one string separated by ';' (Flink's list separator) or ','. A pattern is a
key name, or a prefix ending in one '*' ("clicks", "tenant-a:*"); no other glob character, so
what a pattern reaches is plain to see and can be checked to stay outside the control plane's
keys and the sinks' bookkeeping.

A job that declares nothing gets what the cluster setting `pipeline_redis_keys` says:

    connectors (the default)  the streams its Redis sources read and its Redis sinks write, claimed
                              by the connectors as the pipeline builds them (ClaimRedisKeys, granted
                              by the JobManager: services/jobmanager/redis_key_claims.py); a stream
                              is written by one lineage at a time, as with declared keys
    shared                    every data key (shared/pipeline_redis.py): streams shared as Kafka
                              topics without ACLs are, so one pipeline may trim another's stream
    declared                  nothing: the job is refused at submission

Pure: the dispatcher checks the options with it, the JobManager makes the user's rules with it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from shared.option_values import RefusedValue
from shared.pipeline_redis import CONTROL_PLANE_PREFIXES, SINK_PREFIX

READ_OPTION = "headrace.redis.keys.read"
WRITE_OPTION = "headrace.redis.keys.write"
OPTIONS = (READ_OPTION, WRITE_OPTION)
# The cluster setting pipeline_redis_keys (the module's docstring).
CONNECTORS, SHARED, DECLARED = "connectors", "shared", "declared"
MODES = (CONNECTORS, SHARED, DECLARED)
FORBIDDEN_PREFIXES = (*CONTROL_PLANE_PREFIXES, SINK_PREFIX)
MAX_PATTERNS = 64
MAX_PATTERN_LENGTH = 256
GLOB_CHARACTERS = "*?[]\\"
EXPECTED = (
    "a list of Redis keys the job may use: key names, or prefixes ending in '*', outside "
    f"{', '.join(FORBIDDEN_PREFIXES)}"
)
EXAMPLE = ["clicks", "counts:*"]


@dataclass(frozen=True)
class KeyGrants:
    """What a lineage's user may reach of the data keys: `read` read-only, `write` both."""

    read: tuple[str, ...] = ()
    write: tuple[str, ...] = ()

    def acl_rules(self) -> list[str]:
        """ACL SETUSER key rules (Redis 7: `%R~` read-only, `~` read and write)."""
        return [*(f"%R~{p}" for p in self.read), *(f"~{p}" for p in self.write)]


def check_pattern(pattern: Any) -> str:
    """`pattern` if a job may be granted it; RefusedValue saying why not."""
    if not isinstance(pattern, str) or not pattern:
        raise RefusedValue("each key pattern must be a non-empty string")
    if len(pattern) > MAX_PATTERN_LENGTH or any(c.isspace() or not c.isprintable() for c in pattern):
        raise RefusedValue(f"a key pattern is at most {MAX_PATTERN_LENGTH} printable characters without spaces")
    literal, star, after = pattern.partition("*")
    if after or any(c in literal for c in GLOB_CHARACTERS):
        raise RefusedValue(
            f"key pattern {pattern!r} may use '*' only as its last character and no other glob character (?, [, ], \\)"
        )
    if not literal:
        raise RefusedValue(
            "'*' would reach the control plane's keys: name the keys, or leave the option out "
            "where the cluster lets a job reach every data key"
        )
    for forbidden in FORBIDDEN_PREFIXES:
        if literal.startswith(forbidden) or (star and forbidden.startswith(literal)):
            raise RefusedValue(
                f"key pattern {pattern!r} reaches keys under {forbidden!r}, which are Headrace's "
                "own; choose a name or prefix outside them"
            )
    return pattern


def parse_patterns(value: Any) -> tuple[str, ...]:
    """A key option's patterns, each checked; RefusedValue for one that cannot be granted."""
    if isinstance(value, str):
        items: list[Any] = [p.strip() for p in value.replace(",", ";").split(";") if p.strip()]
    elif isinstance(value, (list, tuple)):
        items = list(value)
    else:
        raise RefusedValue("expected a list of key patterns or one string of them separated by ';'")
    if len(items) > MAX_PATTERNS:
        raise RefusedValue(f"at most {MAX_PATTERNS} key patterns (a prefix ending in '*' covers many keys)")
    return tuple(dict.fromkeys(check_pattern(p) for p in items))


def declared(config: Mapping[str, Any] | None) -> bool:
    return any(option in (config or {}) for option in OPTIONS)


def grants_of(config: Mapping[str, Any] | None) -> KeyGrants | None:
    """The keys a job's configuration grants it, or None if it declares none. Call it on a
    configuration the dispatcher accepted; an option it could not read grants nothing."""
    config = config or {}
    if not declared(config):
        return None
    found = {}
    for option in OPTIONS:
        try:
            found[option] = parse_patterns(config.get(option, ()))
        except ValueError:
            found[option] = ()
    return KeyGrants(read=found[READ_OPTION], write=found[WRITE_OPTION])


def undeclared_problem(config: Mapping[str, Any] | None, mode: str) -> str | None:
    """Why a cluster in `mode` refuses a job's configuration, or None."""
    if mode == DECLARED and not declared(config):
        return (
            f"this cluster confines every pipeline to the Redis keys it declares (pipeline_redis_keys: "
            f"{DECLARED}): set {WRITE_OPTION} to the streams its Redis sinks write and {READ_OPTION} to those "
            "it reads (an empty list if it uses none)"
        )
    return None


def overlap(a: str, b: str) -> bool:
    """Whether some key matches both patterns (each a key name or a prefix ending in '*')."""
    a_prefix, b_prefix = a.endswith("*"), b.endswith("*")
    a_text, b_text = a.rstrip("*"), b.rstrip("*")
    if a_prefix and b_prefix:
        return a_text.startswith(b_text) or b_text.startswith(a_text)
    if a_prefix:
        return b_text.startswith(a_text)
    if b_prefix:
        return a_text.startswith(b_text)
    return a == b


def write_clash(mine: KeyGrants, theirs: KeyGrants) -> tuple[str, str] | None:
    """A pattern `mine` writes and one `theirs` writes that reach a common key, or None.

    A key is written by one lineage at a time: the writer's sinks decide what they may undo
    (a Redis sink deletes its uncommitted entries on restore), and a second writer could trim or
    delete the first one's output, which declaring keys is meant to rule out."""
    for own in mine.write:
        for other in theirs.write:
            if overlap(own, other):
                return own, other
    return None


def check_claimed_key(key: Any) -> str:
    """A key a connector claims: a whole key name (no '*'), outside Headrace's own keys."""
    if isinstance(key, str) and key.endswith("*"):
        raise RefusedValue(f"a connector claims whole keys, not the prefix {key!r}")
    return check_pattern(key)


def claim_problem(
    read: tuple[str, ...], write: tuple[str, ...], other_writers: Mapping[str, tuple[str, ...]]
) -> str | None:
    """Why the keys a lineage's connectors claim cannot be granted, or None. `other_writers`: the
    patterns each other live lineage may write (its declared keys and its claims)."""
    for key in (*read, *write):
        try:
            check_claimed_key(key)
        except RefusedValue as exc:
            return str(exc)
    found = other_writer(write, other_writers)
    if found is not None:
        key, lineage, theirs = found
        return (
            f"the Redis stream {key!r} is written by lineage {lineage} (its pattern {theirs!r}): a stream "
            "is written by one lineage at a time. Stop that job, or write another stream"
        )
    return None


def other_writer(mine: Iterable[str], other_writers: Mapping[str, tuple[str, ...]]) -> tuple[str, str, str] | None:
    """A pattern of `mine`, and another lineage with its pattern, that reach a common key; None."""
    for own in mine:
        for lineage, patterns in other_writers.items():
            theirs = next((p for p in patterns if overlap(own, p)), None)
            if theirs is not None:
                return own, lineage, theirs
    return None


def _key_rules(tokens: Iterable[str]) -> Iterable[tuple[bool, str]]:
    """ACL key rules as Redis lists them ('~k', '%R~k', '%W~k', '%RW~k'): (may write, pattern)."""
    for token in tokens:
        if token.startswith("~"):
            yield True, token[1:]
        elif token.startswith("%") and "~" in token:
            access, _, pattern = token[1:].partition("~")
            yield "W" in access.upper(), pattern


def _data_key(pattern: str) -> bool:
    """A key or a prefix ending in '*', outside Headrace's own: what a job may be granted."""
    literal = pattern[:-1] if pattern.endswith("*") else pattern
    plain = not any(c in literal for c in GLOB_CHARACTERS)
    return bool(literal) and plain and not literal.startswith(FORBIDDEN_PREFIXES)


def claimed_rules(tokens: Iterable[str]) -> list[str]:
    """The whole-key rules among a lineage user's key rules (what its connectors were granted), as
    ACL SETUSER arguments."""
    rules = list(_key_rules(tokens))
    if _every_data_key(rules):
        return []
    return [f"~{p}" if write else f"%R~{p}" for write, p in rules if _data_key(p) and not p.endswith("*")]


def _every_data_key(rules: list[tuple[bool, str]]) -> bool:
    """A user made to reach every data key (shared/pipeline_redis.py data_patterns: globs with
    `[^...]`, and the few whole keys between them, which are no claims)."""
    return any("[^" in p for _, p in rules)


def written_patterns(tokens: Iterable[str]) -> tuple[str, ...]:
    """What a lineage user's key rules let it write of the data keys: its declared and claimed
    keys. A user that reaches every data key (pipeline_redis_keys: shared) writes no key alone."""
    rules = list(_key_rules(tokens))
    if _every_data_key(rules):
        return ()
    return tuple(p for write, p in rules if write and _data_key(p))
