"""The Redis users of the running lineages, made by the leading JobManager (issue 43.5; the rules
are shared/pipeline_redis.py).

When it deploys a task of lineage L, the JobManager makes sure `pipeline.<L>` exists with today's
rules, the data keys its job declared among them (shared/redis_key_grants.py): ACL SETUSER,
then ACL SAVE where the server has an ACL file, so a restarted Redis keeps it. It puts the user's
URL in the TaskSpec. Its password is derived from the cluster secret: made again the same, stored
nowhere. A sweep every SWEEP_S deletes the users of lineages with no live
job; Redis closes their connections, so a task that outlived its job loses Redis with them.

Only for the cluster's own Redis, when the pipelines' URL names the shared `pipeline` user: the
JobManager holds no administration of another Redis (a pipeline_redis_url of its own), and a
Redis without users (HEADRACE_REDIS_AUTH=false) has no boundary to draw. When the users cannot
be made (a jobmanager ACL user from before these rules: `headrace redis-auth deploy` again),
tasks get the shared user, whose Redis sinks are then refused with an error naming this; where
every job must declare its keys (pipeline_redis_keys: declared), they get no Redis URL instead, as
the shared user would reach every data key.
"""

from __future__ import annotations

import hashlib
import logging
import time
from typing import Iterable
from urllib.parse import quote, urlsplit, urlunsplit

import redis

from shared import pipeline_redis as pr
from shared import redis_key_grants
from shared.redis_key_grants import KeyGrants

log = logging.getLogger("headrace.jobmanager")
SWEEP_S = 60.0


def _server(url: str) -> tuple[str, int, str]:
    parts = urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or 6379, (parts.path or "/0").lstrip("/") or "0"


class PipelineRedisUsers:
    def __init__(self, client: redis.Redis, secret: bytes, pipeline_url: str):
        self.client, self.secret, self.pipeline_url = client, secret, pipeline_url
        self._made: dict[str, list[str]] = {}  # the rules this process last gave each lineage's user
        self._refused = False
        self._next_sweep = time.monotonic() + SWEEP_S

    @classmethod
    def for_cluster(
        cls, client: redis.Redis, secret: bytes, redis_url: str, pipeline_url: str | None
    ) -> "PipelineRedisUsers | None":
        """The users' maker when the pipelines use the cluster's Redis through the shared
        `pipeline` user; None otherwise."""
        if not pipeline_url or urlsplit(pipeline_url).username != pr.PIPELINE:
            return None
        if _server(pipeline_url) != _server(redis_url):
            return None
        return cls(client, secret, pipeline_url)

    def url_for(self, lineage: str, grants: KeyGrants | None = None, *, keep_claims: bool = False) -> str | None:
        """The URL of lineage's own user, made if missing, reaching the data keys `grants` names
        (None: every data key) and, with `keep_claims`, the keys its connectors were granted before
        (a running attempt of the lineage may be using them); None when it cannot be made (the
        caller decides what the task gets instead)."""
        user = pr.lineage_user(lineage)
        password = pr.lineage_password(self.secret, lineage)
        data = grants.acl_rules() if grants is not None else None
        try:
            if keep_claims and data is not None:
                data = [*data, *(r for r in self._claimed(user) if r not in data)]
            rules = pr.lineage_rules(lineage, data)
            if self._made.get(lineage) != rules or self.client.acl_getuser(user) is None:
                self.client.execute_command(
                    "ACL", "SETUSER", user, "reset", "on", f"#{hashlib.sha256(password.encode()).hexdigest()}", *rules
                )
                self._save()
                self._made[lineage] = rules
        except redis.exceptions.NoPermissionError as exc:
            if not self._refused:
                self._refused = True
                log.error(
                    "cannot make the Redis users of the pipelines' lineages (%s): tasks get the shared "
                    "`pipeline` user, whose Redis sinks are refused. Run `headrace redis-auth deploy` again "
                    "(or restart `headrace up`) so the jobmanager user may",
                    exc,
                )
            return None
        parts = urlsplit(self.pipeline_url)
        netloc = f"{quote(user, safe='')}:{password}@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
        return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))

    def _claimed(self, user: str) -> list[str]:
        found = self.client.acl_getuser(user)
        keys = found.get("keys") if isinstance(found, dict) else None
        return redis_key_grants.claimed_rules(str(k) for k in keys) if isinstance(keys, list) else []

    def grant(self, lineage: str, *, read: tuple[str, ...] = (), write: tuple[str, ...] = ()) -> None:
        """Add the keys a running attempt's connectors claimed to its lineage's user (made by
        url_for when the attempt was deployed). Redis applies it to the user's open connections
        at once. Raises redis.RedisError when it cannot (the user went: its job ended)."""
        user = pr.lineage_user(lineage)
        if self.client.acl_getuser(user) is None:
            raise redis.exceptions.ResponseError(f"the Redis user {user} is gone (its lineage has no live job)")
        rules = [*(f"%R~{k}" for k in read), *(f"~{k}" for k in write)]
        self.client.execute_command("ACL", "SETUSER", user, *rules)
        self._save()
        self._made.pop(lineage, None)  # compared again with the server's at the next deploy

    def writers(self, lineages: Iterable[str]) -> dict[str, tuple[str, ...]]:
        """What the users of `lineages` may write of the data keys (the server's word, whichever
        JobManager made them), lineages whose user writes none left out."""
        users = [u.decode() if isinstance(u, bytes) else str(u) for u in self.client.acl_users()]
        wanted = set(lineages)
        mine = [(lineage, u) for u in users if (lineage := pr.lineage_of_user(u)) is not None and lineage in wanted]
        pipe = self.client.pipeline(transaction=False)
        for _, user in mine:
            pipe.acl_getuser(user)
        found: dict[str, tuple[str, ...]] = {}
        for (lineage, _), rules in zip(mine, pipe.execute(), strict=True):
            keys = rules.get("keys") if isinstance(rules, dict) else None
            written = redis_key_grants.written_patterns(str(k) for k in keys) if isinstance(keys, list) else ()
            if written:
                found[lineage] = written
        return found

    def _save(self) -> None:
        try:
            self.client.execute_command("ACL", "SAVE")
        except redis.ResponseError as exc:  # no ACL file, or a read-only one: the user lives until a restart
            log.debug("ACL SAVE: %s", exc)

    def sweep_due(self) -> bool:
        return time.monotonic() >= self._next_sweep

    def sweep(self, live: Iterable[str]) -> int:
        """Delete the users of lineages not in `live`; how many went."""
        self._next_sweep = time.monotonic() + SWEEP_S
        keep = set(live)
        try:
            users = [u.decode() if isinstance(u, bytes) else str(u) for u in self.client.acl_users()]
            lineages = {u: pr.lineage_of_user(u) for u in users}
            gone = [u for u, lineage in lineages.items() if lineage is not None and lineage not in keep]
            if gone:
                self.client.execute_command("ACL", "DELUSER", *gone)
                self._save()
                for u in gone:
                    self._made.pop(lineages[u] or "", None)
                log.info("deleted the Redis users of %d lineages without a live job", len(gone))
            return len(gone)
        except redis.exceptions.NoPermissionError:
            return 0  # logged by url_for already
