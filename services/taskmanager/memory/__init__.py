"""A task's memory: how much its processes hold (PSS, shared memory no process maps), the limit
it is held to and the watch that kills it past that, and the figures operators see."""
