"""Celery protocol-2 task messages and their task-sent events, written straight to kombu's
Redis transport: what `Celery.send_task` puts in Redis, without its per-message machinery.

Why: starting 2,000 tasks at once, `send_task` cost the JobManager ~0.5 ms per command (queue
declaration checks, the event dispatcher, kombu's producer and entity copies), a quarter of its
time. The bytes are the same: a TaskManager's Celery worker, `celery inspect`, `celery events`
and Flower see the messages and events they see from `send_task`
(tests/integration/test_command_batch.py compares both field by field). Only commands to an
anonymous-exchange queue are built here, the only kind the JobManager sends.

Wire format (kombu's virtual transport on Redis): a task is a JSON document LPUSHed to the list
named after the queue (priority 0 is the plain name); an event is a JSON document PUBLISHed on
"/<db>.celeryev/<routing key>" (kombu's fanout with patterns, as Celery configures it).
"""

from __future__ import annotations

import base64
import json
import os
import time
import uuid
from datetime import datetime, timedelta, timezone

from celery import Celery
from celery.utils.nodenames import anon_nodename
from celery.utils.time import utcoffset

# Celery's empty "embed" part of a protocol-2 body: no callbacks, errbacks, chain or chord.
_EMBED = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}


class CeleryWire:
    def __init__(self, app: Celery, *, db: int):
        self.app = app
        self.origin = anon_nodename()
        self.reply_to = app.thread_oid
        self.send_sent_event = bool(app.conf.task_send_sent_event)
        self.event_channel = f"/{db}.celeryev/task.sent"
        self.pid = os.getpid()

    def task(self, name: str, queue: str, args: list, *, argsrepr: str, expires_s: float) -> tuple[bytes, bytes | None]:
        """(the queue item, the task-sent event or None): what send_task would write."""
        task_id = str(uuid.uuid4())
        now = datetime.now(timezone.utc)
        expires = (now + timedelta(seconds=expires_s)).isoformat()
        body = json.dumps([args, {}, _EMBED]).encode()
        headers = {
            "lang": "py",
            "task": name,
            "id": task_id,
            "shadow": None,
            "eta": None,
            "expires": expires,
            "group": None,
            "group_index": None,
            "retries": 0,
            "timelimit": [None, None],
            "root_id": task_id,
            "parent_id": None,
            "argsrepr": argsrepr,
            "kwargsrepr": "{}",
            "origin": self.origin,
            "ignore_result": None,
            "replaced_task_nesting": 0,
            "stamped_headers": None,
            "stamps": {},
        }
        message = {
            "body": base64.b64encode(body).decode(),
            "content-encoding": "utf-8",
            "content-type": "application/json",
            "headers": headers,
            "properties": {
                "correlation_id": task_id,
                "reply_to": self.reply_to,
                "argsrepr": argsrepr,
                "delivery_mode": 2,
                "expiration": str(int(expires_s * 1000)),
                "delivery_info": {"exchange": "", "routing_key": queue},
                "priority": 0,
                "body_encoding": "base64",
                "delivery_tag": str(uuid.uuid4()),
            },
        }
        event = None
        if self.send_sent_event:
            event = self._event(
                {
                    "hostname": self.origin,
                    "utcoffset": utcoffset(),
                    "pid": self.pid,
                    "clock": self.app.clock.forward(),
                    "uuid": task_id,
                    "root_id": task_id,
                    "parent_id": None,
                    "name": name,
                    "args": argsrepr,
                    "kwargs": "{}",
                    "retries": 0,
                    "eta": None,
                    "expires": expires,
                    "queue": queue,
                    "exchange": "",
                    "routing_key": queue,
                    "timestamp": time.time(),
                    "type": "task-sent",
                }
            )
        return json.dumps(message).encode(), event

    def _event(self, fields: dict) -> bytes:
        return json.dumps(
            {
                "body": base64.b64encode(json.dumps(fields).encode()).decode(),
                "content-encoding": "utf-8",
                "content-type": "application/json",
                "headers": {"hostname": self.origin},
                "properties": {
                    "delivery_mode": 1,
                    "delivery_info": {"exchange": "celeryev", "routing_key": "task.sent"},
                    "priority": 0,
                    "body_encoding": "base64",
                    "delivery_tag": str(uuid.uuid4()),
                },
            }
        ).encode()
