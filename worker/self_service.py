"""What a tenant's administrator does for itself besides the admin's calls: test events, reading a secret."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psycopg

from worker import encryption
from worker.encryption import Keyring


@dataclass(frozen=True)
class SigningSecret:
    """One secret an endpoint's requests are signed with now; expires_at: when a rotated-out one stops."""

    secret: str = field(repr=False)
    expires_at: datetime | None


def send_test_event(conn: psycopg.Connection, endpoint: str) -> int | None:
    """Queue a 'webhook.test' event to this endpoint alone (its id or name) and return the delivery
    id; None when there is no such endpoint, or it is another tenant's to a session kept to one."""
    try:
        with conn.transaction():
            row = conn.execute("SELECT webhooks.send_test_event(%s)", (endpoint,)).fetchone()
    except psycopg.errors.NoDataFound:
        return None
    assert row is not None
    return int(row[0])


def signing_secrets(conn: psycopg.Connection, keyring: Keyring, endpoint_id: int,
                    allow_plaintext: bool = False) -> list[SigningSecret] | None:
    """The secrets the endpoint's requests are signed with now, newest first, opened with the keys
    (what its receiver needs to verify); None when there is no such endpoint, or it is another
    tenant's to a session kept to one. A value that does not open raises DecryptionError; one
    stored in plaintext UnsealedValue unless allow_plaintext (security.require_sealed)."""
    with conn.transaction():
        row = conn.execute("SELECT id, signing_secrets FROM webhooks.endpoint_credentials(%s, 1)",
                           (endpoint_id - 1,)).fetchone()
    if row is None or row[0] != endpoint_id:
        return None
    clock = conn.execute("SELECT now()").fetchone()  # the database's clock decides, as for signing
    assert clock is not None
    now: datetime = clock[0]
    opened = []
    for stored in row[1]:
        expires_at = _timestamp(stored.get("expires_at"))
        if expires_at is None or expires_at > now:
            secret = keyring.open(stored["secret"], encryption.SIGNING_SECRET, endpoint_id, allow_plaintext)
            opened.append(SigningSecret(secret, expires_at))
    return opened


def _timestamp(value: Any) -> datetime | None:
    return None if value is None else datetime.fromisoformat(value)
