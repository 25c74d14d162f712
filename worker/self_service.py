"""What a tenant's administrator does for itself besides the admin's calls: test events, reading a secret."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psycopg

from worker import encryption, tenants
from worker.encryption import Keyring


@dataclass(frozen=True)
class SigningSecret:
    """One secret an endpoint's requests are signed with now; expires_at: when a rotated-out one stops."""

    secret: str = field(repr=False)
    expires_at: datetime | None


@dataclass(frozen=True)
class Refusal:
    """Why the database's gate refused a test event, as the API, the console and the CLI answer it:
    409 for a disabled endpoint; 429 past the endpoint's test events a minute or its tenant's
    max_queued, `retry_after` the seconds to wait (None: it never fits). The limits themselves are
    the gate's (webhooks.queue_deliveries(), sql/functions/enqueue.sql)."""

    status: int
    kind: str
    title: str
    detail: str
    retry_after: int | None = None


class RefusedTestEvent(Exception):
    """A test event the gate refused (`refusal` says why)."""

    def __init__(self, refusal: Refusal) -> None:
        super().__init__(refusal.detail)
        self.refusal = refusal


def refusal_of(exc: psycopg.Error) -> Refusal | None:
    """What a refused test event is answered, or None for an error that is no refusal."""
    message = exc.diag.message_primary or str(exc)
    if exc.sqlstate == "55000":  # object_not_in_prerequisite_state: a disabled endpoint
        return Refusal(409, "endpoint-disabled", "The endpoint is disabled", message)
    if exc.sqlstate == "WHT29":  # the endpoint's test events a minute; DETAIL: the seconds to wait
        detail = exc.diag.message_detail or ""
        wait = int(detail) if detail.isdigit() else 60
        return Refusal(429, "test-event-rate", "Too many test events", f"{message}; try again in {wait} s",
                       wait)
    if exc.sqlstate == "53400":  # configuration_limit_exceeded: the tenant's max_queued
        return Refusal(429, "tenant-quota", "The tenant's queue is full", message,
                       tenants.quota_retry_after(exc.diag.constraint_name))
    return None


def send_test_event(conn: psycopg.Connection, endpoint: str) -> int | None:
    """Queue a 'webhook.test' event to this endpoint alone (its id or name) and return the delivery
    id; None when there is no such endpoint, or it is another tenant's to a session kept to one.
    Raises RefusedTestEvent when the gate refuses it."""
    try:
        with conn.transaction():
            row = conn.execute("SELECT webhooks.send_test_event(%s)", (endpoint,)).fetchone()
    except psycopg.errors.NoDataFound:
        return None
    except psycopg.Error as exc:
        refusal = refusal_of(exc)
        if refusal is None:
            raise
        raise RefusedTestEvent(refusal) from None
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
