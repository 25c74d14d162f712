"""API tokens: generated with a recognisable prefix, stored only as a SHA-256 hash, checked by hash."""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import psycopg

# Secret scanners (GitHub's, gitleaks) find a leaked token by a fixed prefix and a known shape.
TOKEN_PREFIX = "whk_"
# 32 random bytes: far beyond guessing, so a plain SHA-256 (no salt, no stretching) is the right hash:
# the hash only has to keep a read of the table from being usable as a token.
TOKEN_BYTES = 32
_TOKEN_SHAPE = re.compile(r"^whk_[A-Za-z0-9_-]{43}$")
# tenant_admin: an admin kept to one tenant by PostgreSQL (webhooks_tenant_admin; always scoped).
ROLES = ("producer", "reader", "admin", "tenant_admin")
Role = Literal["producer", "reader", "admin", "tenant_admin"]
MAX_NAME_LENGTH = 200
# a token's lifetime in days, when it has one: the CLI's --expires-in and the API's expires_in_days
MAX_EXPIRES_DAYS = 3650


def generate_token() -> str:
    """A new token: the prefix and 32 random bytes, URL-safe base64 without padding."""
    return TOKEN_PREFIX + secrets.token_urlsafe(TOKEN_BYTES)


def token_hash(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8")).digest()


def well_formed(token: str) -> bool:
    """Whether a string has a token's shape; anything else is refused without a database call."""
    return _TOKEN_SHAPE.fullmatch(token) is not None


def name_problem(name: str) -> str | None:
    """What is wrong with a token name, or None."""
    if not name.strip():
        return "must not be empty"
    if len(name) > MAX_NAME_LENGTH:
        return f"at most {MAX_NAME_LENGTH} characters"
    if not name.isprintable():
        return "must be printable (no control characters)"
    return None


def scope_problem(role: str, tenant: str | None) -> str | None:
    """What is wrong with a token's tenant for its role, or None: a tenant_admin token needs one, an
    admin token cannot have one (its functions keep to no tenant). The database holds the same rule
    (constraints api_token_tenant_role and api_token_tenant_admin_scoped)."""
    if role == "tenant_admin" and tenant is None:
        return "a tenant_admin token administers one tenant: name it"
    if role == "admin" and tenant is not None:
        return "an admin token is every tenant's; a tenant's administrator is role tenant_admin"
    return None


@dataclass(frozen=True)
class Caller:
    """Who a request comes from: the token's name and its role."""

    name: str
    role: Role
    tenant_id: int | None = None  # a scoped token's tenant; None: every tenant


def create(conn: psycopg.Connection, name: str, role: str, expires_at: datetime | None,
           tenant: str | None = None) -> str:
    """Store a new token's hash under its name and return the token (shown once, never stored);
    with a tenant (its name), the token sees and changes only that tenant's rows. A role and tenant
    that do not go together (scope_problem()) raise ValueError naming the tenant."""
    problem = scope_problem(role, tenant)
    if problem is not None:
        raise ValueError(f"tenant: {problem}")
    token = generate_token()
    conn.execute("SELECT webhooks.api_create_token(%s, %s, %s, %s, %s)",
                 (name, role, token_hash(token), expires_at, tenant))
    return token


def revoke(conn: psycopg.Connection, name: str) -> bool:
    row = conn.execute("SELECT webhooks.api_revoke_token(%s)", (name,)).fetchone()
    return bool(row and row[0])


def listing(conn: psycopg.Connection) -> list[dict[str, Any]]:
    cur = conn.cursor(row_factory=psycopg.rows.dict_row)
    cur.execute("SELECT * FROM webhooks.api_token_list()")
    return cur.fetchall()


async def verify(conn: psycopg.AsyncConnection[Any], token: str) -> Caller | None:
    """The caller a token stands for, or None for a malformed, unknown, revoked or expired one. The
    database answers every time, so a revocation takes effect on the next request."""
    if not well_formed(token):
        return None
    cur = await conn.execute("SELECT name, role, tenant_id FROM webhooks.api_token_role(%s)",
                             (token_hash(token),))
    row = await cur.fetchone()
    if row is None:
        return None
    name, role, tenant_id = row
    assert role in ROLES
    return Caller(str(name), role, None if tenant_id is None else int(tenant_id))
