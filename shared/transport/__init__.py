"""Event transport between services: Redis streams in production, an in-memory twin in tests.

Both honour the same contract:
- `publish(stream, body)` wraps the body in an envelope and appends it (stream capped in length);
- `poll(stream, group, consumer, handler)` delivers entries to `handler(envelope)`; an entry is
  acknowledged only after the handler returned, and a message id already handled by the group
  is acknowledged without running the handler again;
- an entry that does not decode is moved to the dead-letter stream and acknowledged, so one bad
  producer never stops a consumer (`dead_letters.py`: every dead letter, capped in size);
- a consumer group that vanished (Redis restarted empty) is created again by the next poll.

`kombu_redis.py` is the Celery broker transport of a TaskManager's command queue: kombu's Redis
transport, but an item whose delivery fails is dead-lettered instead of ending the worker.
"""

from shared.transport.base import Handler, Transport
from shared.transport.memory import InMemoryTransport
from shared.transport.redis_streams import RedisStreamsTransport

__all__ = ["Handler", "Transport", "InMemoryTransport", "RedisStreamsTransport"]
