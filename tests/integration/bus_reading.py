"""Reading the bus the way a hostile-message test checks it: the streams of a kind (the control
plane's and each TaskManager's own), what arrived after a mark, the dead letters, and a Celery
message as kombu stores it in a queue."""

from __future__ import annotations

import base64
import json
import uuid

from shared import streams
from shared.messages import decode
from tests.waiting import wait_for


def kombu_item(
    task: str,
    args,
    *,
    body: str | None = None,
    content_type: str = "application/json",
    queue: str = streams.tm_queue("tm-1"),
) -> bytes:
    """A Celery protocol-2 message as kombu's Redis transport stores it in a queue list."""
    if body is None:
        body = base64.b64encode(
            json.dumps([args, {}, {"callbacks": None, "errbacks": None, "chain": None, "chord": None}]).encode()
        ).decode()
    task_id = str(uuid.uuid4())
    return json.dumps(
        {
            "body": body,
            "content-encoding": "utf-8",
            "content-type": content_type,
            "headers": {
                "lang": "py",
                "task": task,
                "id": task_id,
                "root_id": task_id,
                "retries": 0,
                "timelimit": [None, None],
                "argsrepr": "",
                "kwargsrepr": "{}",
            },
            "properties": {
                "correlation_id": task_id,
                "delivery_mode": 2,
                "priority": 0,
                "body_encoding": "base64",
                "delivery_info": {"exchange": "", "routing_key": queue},
                "delivery_tag": str(uuid.uuid4()),
            },
        }
    ).encode()


def family(client, stream: str) -> list[str]:
    """`stream` and every TaskManager's stream of its kind (`<stream>:tm:<id>`: what the
    TaskManagers write instead, shared/streams.py)."""
    return [stream, *sorted(k.decode() for k in client.scan_iter(match=f"{stream}:tm:*", count=1000))]


def tails(client, stream: str) -> dict[str, str]:
    """The newest entry id of each stream of the family: a mark to read what comes after."""
    out = {}
    for name in family(client, stream):
        newest = client.xrevrange(name, count=1)
        out[name] = newest[0][0].decode() if newest else "0-0"
    return out


def entries_since(client, stream: str, mark: dict[str, str]) -> list[dict]:
    found = []
    for name in family(client, stream):
        found += client.xrange(name, min=f"({mark.get(name, '0-0')}")
    found.sort(key=lambda e: tuple(int(x) for x in e[0].decode().split("-")))
    return [{k.decode(): v for k, v in fields.items()} for _, fields in found]


def dead_letters_since(client, mark: dict[str, str]) -> list[dict]:
    """Dead letters of the control plane and of every TaskManager written after `mark` (dlq_tail)."""
    return entries_since(client, streams.DLQ_STREAM, mark)


def dlq_tail(client) -> dict[str, str]:
    return tails(client, streams.DLQ_STREAM)


def wait_for_at_least(what: str, fetch, n: int, timeout_s: float = 10) -> list:
    """`fetch()`'s list once it holds `n` entries or more (a timeout shows the last list fetched)."""
    return wait_for(f"at least {n} x {what}", fetch, timeout_s, until=lambda found: len(found) >= n)


def reports_since(client, mark: dict[str, str], kind: str) -> list:
    """Bodies of type `kind` on the JobManager's stream and the TaskManagers' report streams
    written after `mark` (tails(client, streams.JM_STREAM))."""
    out = []
    for fields in entries_since(client, streams.JM_STREAM, mark):
        try:
            body = decode(fields["m"]).body
        except Exception:  # noqa: BLE001 - only our own reports matter here
            continue
        if body.type == kind:
            out.append(body)
    return out
