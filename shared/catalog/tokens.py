"""REST API bearer tokens in the catalog: created, listed, revoked, and checked on each request.

A token is 32 random bytes (URL-safe base64 after a `hr_` prefix, so a leaked one is easy to
grep for). Only its SHA-256 is stored: the token is random and long, so a slow password hash
would add nothing. The request's token is looked up by its hash and the stored hash compared
again in constant time, so neither the lookup nor the comparison tells a caller how close a
guess came.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from shared.catalog.models import ApiToken, utcnow
from shared.errors import ConfigError

# Lowest first: each role may do everything the roles before it may.
ROLES = ("viewer", "operator", "admin")
TOKEN_PREFIX = "hr_"
MAX_NAME_LENGTH = 255


class TokenError(ConfigError, ValueError):
    """A request to create or revoke a token that cannot be carried out; the message says why."""


@dataclass(frozen=True)
class TokenInfo:
    """What may be shown about a token: never the token itself."""

    id: str
    name: str
    role: str
    created_at: datetime
    revoked_at: datetime | None

    @classmethod
    def of(cls, row: ApiToken) -> "TokenInfo":
        return cls(row.id, row.name, row.role, row.created_at, row.revoked_at)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def role_at_least(role: str, required: str) -> bool:
    return ROLES.index(role) >= ROLES.index(required)


def create(session: Session, role: str, name: str | None = None) -> tuple[TokenInfo, str]:
    """A new token with `role`; returns its description and the token, which is shown once and
    never stored."""
    if role not in ROLES:
        raise TokenError(f"unknown role {role!r}: must be one of {', '.join(ROLES)}")
    token_id = secrets.token_hex(4)
    name = (name or "").strip() or f"{role}-{token_id}"
    if len(name) > MAX_NAME_LENGTH:
        raise TokenError(f"the name is {len(name)} characters long; at most {MAX_NAME_LENGTH} are allowed")
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    row = ApiToken(id=token_id, name=name, role=role, token_hash=hash_token(token), created_at=utcnow())
    session.add(row)
    session.flush()
    return TokenInfo.of(row), token


def list_all(session: Session) -> list[TokenInfo]:
    rows = session.scalars(select(ApiToken).order_by(ApiToken.created_at, ApiToken.id)).all()
    return [TokenInfo.of(r) for r in rows]


def revoke(session: Session, token_id: str) -> TokenInfo:
    """Revoke a token by its id; effective with the next request (nothing caches tokens)."""
    row = session.get(ApiToken, token_id)
    if row is None:
        raise TokenError(f"no token with id {token_id!r} (the ids are listed by `headrace token list`)")
    if row.revoked_at is None:
        row.revoked_at = utcnow()
    return TokenInfo.of(row)


def verify(session: Session, token: str) -> TokenInfo | None:
    """The live token matching `token`, or None (unknown, malformed or revoked)."""
    if not token.startswith(TOKEN_PREFIX) or len(token) > 200:
        return None
    digest = hash_token(token)
    row = session.scalars(select(ApiToken).where(ApiToken.token_hash == digest)).first()
    if row is None or row.revoked_at is not None or not hmac.compare_digest(row.token_hash, digest):
        return None
    return TokenInfo.of(row)
