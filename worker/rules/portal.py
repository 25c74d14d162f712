"""Portal links: one-time URLs that open a console session as one tenant's administrator."""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from urllib.parse import urlsplit

# The console path a link opens; the secret follows it.
PATH = "/console/portal/"
LINK_BYTES = 32
DEFAULT_LIFETIME = timedelta(hours=1)
# A link is for sending a customer to the console now, not a standing credential (a tenant_admin
# token is that); the session it opens ends when the link would have expired.
MAX_LIFETIME = timedelta(days=1)
_SHAPE = re.compile(rf"^[A-Za-z0-9_-]{{{-(-LINK_BYTES * 4 // 3)}}}$")
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")
_UNITS = {"s": 1, "": 1, "m": 60, "h": 3600, "d": 86400}


@dataclass(frozen=True)
class PortalLink:
    url: str
    tenant: str
    token_name: str  # the tenant_admin token behind it: `tokens revoke NAME` ends its session
    expires_at: datetime


def new_secret() -> str:
    return secrets.token_urlsafe(LINK_BYTES)


def link_hash(secret: str) -> bytes:
    return hashlib.sha256(secret.encode("utf-8")).digest()


def well_formed(secret: str) -> bool:
    """Whether a string has a link secret's shape; anything else is refused without a database call."""
    return _SHAPE.fullmatch(secret) is not None


def lifetime_problem(lifetime: timedelta) -> str | None:
    """What is wrong with a link's lifetime, or None (the database checks the same bound)."""
    if not timedelta(0) < lifetime <= MAX_LIFETIME:
        return f"must be more than 0 and at most {MAX_LIFETIME.total_seconds() / 3600:g} hours"
    return None


def parse_lifetime(text: str) -> timedelta:
    """A duration such as 90s, 30m, 1h or 1d (a bare number: seconds); ValueError saying what is wrong."""
    found = _DURATION.match(text)
    if found is None:
        raise ValueError(f"expected a duration such as 30m, 1h or 1d, not {text[:40]!r}")
    lifetime = timedelta(seconds=float(found[1]) * _UNITS[found[2]])
    problem = lifetime_problem(lifetime)
    if problem is not None:
        raise ValueError(problem)
    return lifetime


def url(base: str, secret: str) -> str:
    return base.rstrip("/") + PATH + secret


def base_url_problem(base: str) -> str | None:
    """What is wrong with where people reach the API (api.public_url, --base-url), or None: an http
    or https URL of a host, without a path (the console is served at /console/), a query or
    credentials."""
    if any(c.isspace() or not c.isprintable() for c in base):
        return "must not contain spaces or control characters"
    try:
        parts = urlsplit(base)
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError:
        return "not a valid URL"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        # the value is not repeated: a URL given in the wrong place may carry credentials
        return "expected http:// or https:// and the API's host"
    if parts.username is not None or parts.password is not None:
        return "must not carry credentials"
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        return "only the scheme, host and port: the console is served at /console/ of that origin"
    return None


def origin(base: str) -> str:
    """A base URL checked by base_url_problem, as links start with it."""
    return base.rstrip("/")


def hashes(secret: str) -> tuple[bytes, bytes]:
    """What the database keeps of a new link: its secret's hash, and the hash of the token behind it
    (random bytes nobody keeps, so only the link opens its session)."""
    return link_hash(secret), hashlib.sha256(secrets.token_bytes(LINK_BYTES)).digest()
