"""Task state reports of one TaskManager process, sent together when a burst of commands arrives.

A no-op task reports INITIALIZING and RUNNING while its deploy is being handled, and a TaskManager
process that takes fifty queued deploys in one read (shared/transport/kombu_redis.py) would make
a hundred round trips to Redis for them. While `hold()` is open on a thread, that thread's
reports wait in order and go out in one pipeline when the outermost hold closes; reports of
other threads (driver readers, the no-op timer, the ResourceManager link) are never held.
Nothing is reordered: a report is either sent at once or after every report held before it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import Iterator

log = logging.getLogger("headrace.taskmanager.reports")


class HeldReports:
    def __init__(self, transport):
        self.transport = transport
        self._local = threading.local()

    @contextlib.contextmanager
    def hold(self, *, raise_errors: bool = True) -> Iterator[None]:
        """Hold this thread's reports until the block ends. With `raise_errors=False` a failed
        send is logged instead of raised (the caller is Celery's event loop, which must go on;
        the JobManager's acknowledgement timer covers a deploy whose reports were lost)."""
        if getattr(self._local, "items", None) is not None:
            yield  # nested: the outermost hold sends
            return
        self._local.items = []
        try:
            yield
        finally:
            items, self._local.items = self._local.items, None
            if items:
                try:
                    self.transport.publish_many(items)
                except Exception:
                    if raise_errors:
                        raise
                    log.exception("could not send %d task reports to the JobManager", len(items))

    def publish(self, stream: str, body) -> None:
        held = getattr(self._local, "items", None)
        if held is None:
            self.transport.publish(stream, body)
        else:
            held.append((stream, body))
