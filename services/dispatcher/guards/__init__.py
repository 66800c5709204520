"""What stands between a request and the API: bearer tokens and roles, browser-side protections,
body size limits and slow clients, strict field types, the bounds of an upload, the storage roots
a path must lie in, and the secrets masked for callers who may only read."""
