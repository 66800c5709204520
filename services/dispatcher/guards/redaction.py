"""Secrets in what the REST API shows: masked for callers that may read but not run (issue 43.12).

A job's configuration, a deployment's spec and a schedule's arguments carry what a pipeline needs
to reach its systems: database URLs with passwords, Kafka's SASL settings, API keys. A `viewer`
token may read every job's page; it must not learn those. So for a viewer:

- a URL's password (`scheme://user:password@host`) and its secret query parameters
  (`?password=...`) become `******`, in any string;
- the whole value of a key that names a secret: one with password, passwd, secret, token,
  credential, jaas (Kafka's `kafka.sasl.jaas.config` holds the password inline), api_key or
  private in its name, or whose last word is `key` (`ssl.keystore.key`, `aws.access.key`; not
  `key.serializer`);
- in argument lists, `--password=x`, `password=x` and the argument after `--password` (by the
  same names).

Operators and admins see the values as stored: they run and change these jobs and deployments
(a deployment's spec is edited by reading it and putting it back, which a masked copy would break),
and with authentication off every caller is an admin. The cluster settings
(`GET /jobmanager/config`) are masked for everyone (routes/jobmanager.py).
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from starlette.requests import Request

from shared.catalog import tokens

MASK = "******"
# Names whose whole value is a secret, and query parameters of URLs that hold one.
SECRET_NAME = re.compile(r"(password|passwd|secret|token|credential|jaas|api_?key|private)", re.I)
_WORD = re.compile(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])")
_ARG_NAME = re.compile(r"^-{0,2}([A-Za-z0-9_.-]+)=(.*)$", re.S)
# user:password@ of a URL inside other text (`--db=postgresql://app:pw@db/x`, a JDBC string).
_EMBEDDED_CREDENTIALS = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://[^/\s:@]*):[^@\s/]*@")
# The role from which values are shown as stored.
SEES_SECRETS = "operator"


def names_a_secret(name: str) -> bool:
    if SECRET_NAME.search(name):
        return True
    words = _WORD.findall(name)
    return bool(words) and words[-1].lower() == "key"


def mask_url(value: str) -> str:
    """The URL with its password and secret query parameters replaced (other text unchanged)."""
    try:
        parts = urlsplit(value)
    except ValueError:
        return value
    if not parts.scheme or not parts.netloc:
        return value
    netloc = parts.netloc
    if "@" in netloc:
        creds, _, host = netloc.rpartition("@")
        user, sep, _password = creds.partition(":")
        netloc = f"{user}:{MASK}@{host}" if sep else netloc
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        query = urlencode([(k, MASK if names_a_secret(k) else v) for k, v in pairs], safe="*")
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def masked_value(key: str, value: Any) -> Any:
    """`value` (stored under `key`) with every secret in it masked, recursively."""
    if isinstance(value, dict):
        return {k: masked_value(str(k), v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return masked_args([masked_value(key, v) for v in value])
    if value is not None and names_a_secret(key):
        return MASK
    if isinstance(value, str) and "://" in value:
        return mask_text(value)
    return value


def mask_text(value: str) -> str:
    """A URL with its secrets masked (mask_url), or any other text with the passwords of the
    URLs inside it masked."""
    masked = mask_url(value)
    return masked if masked != value else _EMBEDDED_CREDENTIALS.sub(rf"\1:{MASK}@", value)


def masked_args(args: list[Any]) -> list[Any]:
    """Program arguments with the values of secret-named options masked."""
    out: list[Any] = []
    follows_secret = False
    for arg in args:
        if not isinstance(arg, str):
            out.append(arg)
            follows_secret = False
            continue
        if follows_secret and not arg.startswith("-"):
            out.append(MASK)
            follows_secret = False
            continue
        found = _ARG_NAME.match(arg)
        if found and names_a_secret(found.group(1)):
            out.append(arg[: len(arg) - len(found.group(2))] + MASK)
        else:
            out.append(mask_text(arg) if "://" in arg else arg)
        follows_secret = arg.startswith("-") and found is None and names_a_secret(arg.lstrip("-"))
    return out


def sees_secrets(request: Request) -> bool:
    """Whether this caller is shown secrets as stored: a token of role operator or higher, or no
    token at all (authentication is off, so every caller may do anything)."""
    token = getattr(request.state, "token", None)
    return token is None or tokens.role_at_least(token.role, SEES_SECRETS)


def for_caller(request: Request, key: str, value: Any) -> Any:
    return value if sees_secrets(request) else masked_value(key, value)
