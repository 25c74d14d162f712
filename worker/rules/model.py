"""The rows the worker passes between its parts: a claimed delivery, its attempt, and its outcome."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID

from worker.rules.classification import AttemptResult, Outcome, RetryPolicy, RetrySchedule
from worker.rules.destinations import Network


@dataclass(frozen=True)
class Claimed:
    """A delivery claimed under a lease, with what the request needs from its endpoint."""

    delivery_id: int
    endpoint_id: int  # the queue's webhook_id
    event_id: str
    idempotency_key: str
    event_type: str
    body: bytes
    attempt: int
    max_attempts: int
    lease_token: UUID
    locked_until: datetime
    url: str = field(repr=False)
    signing_secrets: tuple[str, ...] = field(repr=False)
    headers: dict[str, str]
    timeout_seconds: float | None  # the endpoint's own; None means the worker's default
    schedule: RetrySchedule
    traceparent: str | None = None
    # Set when the row's endpoint settings could not be read: the attempt fails as `internal`
    # without a request, and the rest of the batch is unaffected.
    problem: str | None = None
    body_format: str = "raw"
    secret_settings: dict[str, Any] = field(default_factory=dict, repr=False)
    created_at: datetime | None = None
    retry_policy: RetryPolicy = field(default_factory=RetryPolicy)
    # Changes whenever the endpoint's URL does, and opens nothing (a digest of the URL as stored,
    # usually sealed): what the HTTP side keys its per-URL checks by. Empty: check every time.
    url_version: str = ""
    # The digest (one request for several rows) this row goes in; None: its own request.
    digest_id: int | None = None
    # The row's tenant and its place among the tenants by id (1: the first): its metrics label.
    tenant: str = "default"
    tenant_rank: int = 1
    # The networks granted to the row's tenant, where its endpoint may deliver besides public
    # destinations (worker.rules.destinations.tenant_destinations); None: the claim carries none (a schema
    # that predates them), and the operator's rules apply, as they did then.
    tenant_networks: tuple[Network, ...] | None = None


@dataclass(frozen=True)
class Sent:
    """What one POST produced, as the HTTP side saw it."""

    result: AttemptResult
    latency_ms: int
    excerpt: str | None


@dataclass(frozen=True)
class Finished:
    """One attempt's outcome, as webhooks.finish() takes it."""

    delivery_id: int
    lease_token: UUID
    attempt: int
    outcome: Outcome
    retry_after_s: float | None = None
    http_status: int | None = None
    failure_category: str | None = None
    error: str | None = None
    response_excerpt: str | None = None
    latency_ms: int | None = None
    reason: str | None = None
    disable_endpoint: bool = False
    # False for the members of a digest but one: one request counts once in the endpoint's health.
    reports_request: bool = True
    # The claimed row's tenant and rank, for the delivery counter's `tenant` label (finish()
    # ignores them).
    tenant: str = "default"
    tenant_rank: int = 1


@dataclass(frozen=True)
class FinishResult:
    """One row of webhooks.finish()'s answer."""

    delivery_id: int
    applied: bool
    status: str
    endpoint_change: str | None  # e.g. "circuit_opened: 12 of 20 attempts failed in the last 60 s"
