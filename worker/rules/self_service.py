"""What a tenant's administrator does for itself besides the admin's calls: a test event's refusal, as
every adapter answers it; a signing secret as it is read."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING

from worker.rules import tenants

if TYPE_CHECKING:
    import psycopg


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
