"""Console sessions: a random id in an HttpOnly cookie, its hash stored beside the token's hash."""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
from datetime import timedelta
from typing import Any

COOKIE = "webhook_console"
# The login form's double-submit cookie: a cross-site page cannot read it, so it cannot forge the
# matching form field (login CSRF would otherwise log a victim into an attacker's session).
LOGIN_COOKIE = "webhook_console_login"
COOKIE_PATH = "/console"
# Set when a portal link opens a session: once that session ends (logout, expiry, revocation) the
# browser is shown the page for customers (ask for a new link) rather than the operators' login.
# It holds no secret and chooses only which of two public pages is shown; a token login clears it.
PORTAL_COOKIE = "webhook_console_portal"
PORTAL_COOKIE_AGE = timedelta(days=30)
# A session ends this long after login whatever happens; its token's revocation ends it sooner.
LIFETIME = timedelta(hours=12)
SESSION_BYTES = 32
# What new_secret() makes: the bytes in URL-safe base64 without padding.
_SESSION_SHAPE = re.compile(rf"^[A-Za-z0-9_-]{{{-(-SESSION_BYTES * 4 // 3)}}}$")


def new_secret() -> str:
    return secrets.token_urlsafe(SESSION_BYTES)


def well_formed(session_id: str) -> bool:
    """Whether a cookie has a session id's shape; anything else is refused without a database call."""
    return _SESSION_SHAPE.fullmatch(session_id) is not None


def session_hash(session_id: str) -> bytes:
    return hashlib.sha256(session_id.encode("utf-8")).digest()


def csrf_token(session_id: str) -> str:
    """The CSRF token of a session's forms: derived from the secret id, so nothing more is stored and
    only the cookie's holder can compute it."""
    digest = hmac.new(session_id.encode("utf-8"), b"webhook-console csrf", hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).decode("ascii").rstrip("=")


def same_secret(expected: str | None, given: str | None) -> bool:
    return bool(expected) and bool(given) and hmac.compare_digest(str(expected), str(given))


def cookie_is_secure(scheme: str, forwarded_proto: str | None) -> bool:
    """Secure cookies behind TLS: served over https, or behind a proxy that says the client used it.
    A forged header can only make the cookie stricter."""
    return scheme == "https" or (forwarded_proto or "").split(",")[0].strip().lower() == "https"


def cookie_options(secure: bool, max_age: int | None) -> dict[str, Any]:
    options: dict[str, Any] = {"path": COOKIE_PATH, "httponly": True, "samesite": "Strict", "secure": secure}
    if max_age is not None:
        options["max_age"] = max_age
    return options
