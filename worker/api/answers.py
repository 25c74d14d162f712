"""What the /v1 routes answer: one model per answer body, from which the OpenAPI document is written."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, create_model

from worker.rules import endpoints as endpoint_service
from worker.rules.tokens import Role

Status = Literal["pending", "delivering", "retrying", "delivered", "dead_letter"]


class Answer(BaseModel):
    """An answer body: every field listed, none other."""

    model_config = ConfigDict(extra="forbid")


class ProblemDocument(Answer):
    """A problem document (RFC 9457): every error the API answers."""

    type: str
    title: str
    status: int
    detail: str | None = None
    field: str | None = Field(default=None, description="the field, parameter or header at fault")
    instance: str | None = None
    index: int | None = Field(default=None, description="in a batch's results: the message's place in "
                                                        "`messages`, from 0")


class Caller(Answer):
    name: str
    role: Role


class PublishedDelivery(Answer):
    delivery_id: int
    endpoint_id: int
    endpoint_name: str


class Published(Answer):
    idempotency_key: str | None
    created: bool
    deliveries: list[PublishedDelivery]


class BatchPublished(Answer):
    results: list[Published | ProblemDocument] = Field(
        description="one per message, in request order: its publish answer, or the problem refusing it")


class DeliveryState(Answer):
    """A delivery's state: what a message's delivery to one endpoint reads as, and the start of a
    delivery's own answer."""

    delivery_id: int
    endpoint_id: int
    endpoint_name: str
    idempotency_key: str = Field(description="its webhook-id, the same on every attempt and replay")
    status: Status
    attempts: int
    max_attempts: int
    replays: int
    next_retry_at: datetime | None
    last_http_status: int | None
    failure_category: str | None
    dead_letter_reason: str | None
    delivered_at: datetime | None
    dead_lettered_at: datetime | None
    endpoint_deleted_at: datetime | None = Field(
        description="when its endpoint was deleted (its id and name stay); such rows are not replayed")


class Delivery(DeliveryState):
    event_id: str
    event_type: str
    last_error: str | None
    priority: int
    created_at: datetime


class Attempt(Answer):
    attempt: int
    outcome: str
    failure_category: str | None
    http_status: int | None
    latency_ms: int | None
    error: str | None
    response_excerpt: str | None
    worker_id: str | None
    stale: bool
    logged_at: datetime
    digest_id: int | None = Field(description="the digest that carried this attempt")
    digest: str | None = Field(description="the digest as people name it: d-17")
    digest_rows: int | None = Field(description="how many rows the digest carried")


class DeliveryDetail(Delivery):
    payload: JsonValue
    source_ref: str | None
    attempts_history: list[Attempt]


class DeliveryPage(Answer):
    items: list[Delivery]
    next_cursor: str | None = Field(description="pass as `cursor` for the next page; null on the last")


class ReplayAccepted(Answer):
    delivery_id: int
    status: Literal["pending"]


class Operation(Answer):
    id: int
    kind: Literal["replay_dead_letters", "trigger_backfill"] = Field(
        description="replay_dead_letters: a bulk replay; trigger_backfill: a table trigger's backfill")
    filter: dict[str, JsonValue]
    rate: float | None
    max: int | None
    status: Literal["running", "done", "failed", "cancelled"]
    processed: int
    requested_by: str
    cancelled_by: str | None
    error: str | None
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None


def _as_read(name: str) -> tuple[Any, Any]:
    """A field of the endpoint service as an answer carries it: its type and description (the
    bounds are for input; a stored value may come from SQL, which has its own CHECKs)."""
    info = endpoint_service.EndpointFields.model_fields[name]
    return (info.annotation, Field(description=info.description))


# An endpoint as it is read: id and name, the service's fields as they are written (so what GET
# answers can be sent back), then what only the database knows (worker/rules/endpoints.py, COLUMNS).
_ENDPOINT_FIELDS: dict[str, Any] = {
    "id": (int, ...),
    "name": (str, ...),
    **{name: _as_read(name) for name in endpoint_service.READABLE},
    "url_display": (str, Field(description="scheme, host and port only")),
    "active": (bool, ...),
    "disabled_reason": (str | None, ...),
    "secrets": (int, ...),
    "tenant": (str, ...),
    "health_status": (str | None, ...),
    "circuit_state": (str | None, ...),
    "circuit_open_until": (datetime | None, ...),
    "consecutive_failures": (int | None, ...),
    "last_success_at": (datetime | None, ...),
    "last_failure_at": (datetime | None, ...),
    "created_at": (datetime, ...),
}
Endpoint = create_model("Endpoint", __base__=Answer, **_ENDPOINT_FIELDS)
# every column the service reads has its field here, and no other
assert set(Endpoint.model_fields) == {"id", "name", *endpoint_service.READABLE,
                                      *endpoint_service.READ_ONLY_COLUMNS}


class EndpointChange(Answer):
    change: str
    reason: str | None
    decided_by: str | None
    delivery_id: int | None
    at: datetime


class EndpointDetail(Endpoint):  # type: ignore[misc,valid-type]
    queued: dict[str, int]
    recent_changes: list[EndpointChange]


class EndpointCreated(EndpointDetail):
    signing_secret: str = Field(description="shown once")


class EndpointPage(Answer):
    items: list[Endpoint]  # type: ignore[valid-type]
    next_cursor: str | None = Field(description="pass as `cursor` for the next page; null on the last")


class HealthRecent(Answer):
    outcome: str
    category: str
    attempts: int


class EndpointHealth(Answer):
    id: int
    name: str
    active: bool
    health_status: str | None
    circuit_state: str | None
    circuit_open_until: datetime | None
    consecutive_failures: int | None
    successes: int | None
    failures: int | None
    last_success_at: datetime | None
    last_failure_at: datetime | None
    window_hours: int
    last_failure_category: str | None
    recent: list[HealthRecent]


class CircuitChanged(Answer):
    endpoint_id: int
    change: str
    circuit_state: str | None


class ActiveChanged(Answer):
    endpoint_id: int
    active: bool
    changed: bool


class SecretRotated(Answer):
    endpoint_id: int
    signing_secret: str = Field(description="shown once")
    active_secrets: int
    old_expire_at: datetime | None


class QueueCount(Answer):
    model_config = ConfigDict(extra="allow")

    status: Status
    deliveries: int
    oldest_due_age_seconds: float | None


class HeldBack(Answer):
    reason: str
    rows: int


class Stats(Answer):
    queue: list[QueueCount]
    held_back: list[HeldBack]


class Tenant(Answer):
    id: int
    name: str
    rate_limit_per_second: float | str | None
    rate_limit_burst: int | None
    max_in_flight: int | None
    max_endpoints: int | None
    max_queued: int | None
    endpoints: int
    waiting: int
    in_flight: int
    dead_letters: int
    created_at: datetime
    allow_networks: list[str] = Field(description="the private networks its endpoints may reach besides "
                                                  "public destinations, granted by the operator")


class TenantList(Answer):
    items: list[Tenant]


class Settings(Answer):
    """webhooks.delivery_config: every fleet-wide default."""

    model_config = ConfigDict(extra="allow")

    max_attempts: int
    timeout_ms: int
    lease_seconds: int


class Document(BaseModel):
    """An OpenAPI 3.1 document."""

    model_config = ConfigDict(extra="allow")

    openapi: str
