"""Standard Webhooks signatures: secrets, signing and verification. No I/O."""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac
import secrets
import time
from collections.abc import Iterable, Mapping

SECRET_PREFIX = "whsec_"
SECRET_BYTES = 32
# Standard Webhooks: a secret is 24 to 64 random bytes. Repeated in SQL for what it can see
# (webhooks.signing_secret_problem() in sql/functions/endpoints.sql).
MIN_SECRET_BYTES = 24
MAX_SECRET_BYTES = 64
SECRET_RULE = f"'{SECRET_PREFIX}' followed by the base64 of {MIN_SECRET_BYTES} to {MAX_SECRET_BYTES} bytes"
TIMESTAMP_TOLERANCE_SECONDS = 300


class VerificationError(Exception):
    """The request's signature headers do not prove it came from the holder of the secret."""


def generate_secret() -> str:
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode()


def secret_problem(secret: str) -> str | None:
    """Why this cannot be registered as a signing secret, or None: the one rule of the CLI and the
    API. The message never contains the secret. (Signing itself accepts any base64 key, so secrets
    stored before this rule keep signing.)"""
    if not secret.startswith(SECRET_PREFIX):
        return f"a signing secret is {SECRET_RULE}; this one does not start with '{SECRET_PREFIX}'"
    try:
        key = base64.b64decode(secret.removeprefix(SECRET_PREFIX), validate=True)
    except ValueError:
        return f"a signing secret is {SECRET_RULE}; what follows '{SECRET_PREFIX}' is not base64"
    if not MIN_SECRET_BYTES <= len(key) <= MAX_SECRET_BYTES:
        return f"a signing secret is {SECRET_RULE}; this one is {len(key)} byte{'s' * (len(key) != 1)}"
    return None


@functools.lru_cache(maxsize=1024)  # decoded once per secret, not on every request
def _key(secret: str) -> bytes:
    encoded = secret.removeprefix(SECRET_PREFIX)
    try:
        return base64.b64decode(encoded, validate=True)
    except ValueError:
        raise ValueError("a signing secret is 'whsec_' followed by base64") from None


def sign(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """One `v1,<base64>` signature over `id.timestamp.body`."""
    message = f"{msg_id}.{timestamp}.".encode() + body
    digest = hmac.new(_key(secret), message, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def signature_header(secrets_: Iterable[str], msg_id: str, timestamp: int, body: bytes) -> str:
    """The `webhook-signature` value: one signature per active secret, space-separated (rotation)."""
    return " ".join(sign(secret, msg_id, timestamp, body) for secret in secrets_)


def verify(
    secret: str, headers: Mapping[str, str], body: bytes, now: float | None = None
) -> None:
    """For receivers: raise VerificationError unless a v1 signature matches and the time is fresh."""
    lowered = {k.lower(): v for k, v in headers.items()}
    try:
        msg_id = lowered["webhook-id"]
        timestamp_text = lowered["webhook-timestamp"]
        signatures = lowered["webhook-signature"]
    except KeyError as exc:
        raise VerificationError(f"missing header {exc.args[0]}") from None
    try:
        timestamp = int(timestamp_text)
    except ValueError:
        raise VerificationError("webhook-timestamp is not an integer") from None
    current = time.time() if now is None else now
    if abs(current - timestamp) > TIMESTAMP_TOLERANCE_SECONDS:
        raise VerificationError("webhook-timestamp is outside the tolerance")
    expected = sign(secret, msg_id, timestamp, body).encode()
    for candidate in signatures.split():
        if hmac.compare_digest(candidate.encode(), expected):
            return
    raise VerificationError("no matching signature")
