"""Headrace's common package: what two or more services use.

Ids, message contracts and their envelopes, the Redis-streams transport (plus an in-memory
twin), the catalog, the state machines, restart strategies, heartbeats and settings.
Nothing here imports from `services/`.
"""
