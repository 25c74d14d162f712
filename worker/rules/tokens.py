"""API tokens and roles: generated with a recognisable prefix, stored only as a SHA-256 hash, checked by
hash; the roles a token may have and the database group role each runs as."""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass
from typing import Literal, get_args

# Secret scanners (GitHub's, gitleaks) find a leaked token by a fixed prefix and a known shape.
TOKEN_PREFIX = "whk_"
# 32 random bytes: far beyond guessing, so a plain SHA-256 (no salt, no stretching) is the right hash:
# the hash only has to keep a read of the table from being usable as a token.
TOKEN_BYTES = 32
_TOKEN_SHAPE = re.compile(r"^whk_[A-Za-z0-9_-]{43}$")
# tenant_admin: an admin kept to one tenant by PostgreSQL (webhooks_tenant_admin; always scoped).
Role = Literal["producer", "reader", "admin", "tenant_admin"]
ROLES: tuple[Role, ...] = get_args(Role)
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


def database_role(role: Role) -> str:
    """The group role a token's role runs as, so the grants enforce what the API checks
    (sql/functions/roles.sql; api_authorize() in sql/functions/api.sql takes the same name): webhooks_<role>.
    A tenant_admin always runs with webhooks.tenant set (its token has a tenant)."""
    return f"webhooks_{role}"
