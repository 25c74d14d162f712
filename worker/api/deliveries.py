"""/v1/deliveries and /v1/dead-letters: deliveries newest first and dead letters oldest first (keyset
pages), a delivery with every attempt, a replay of one, and a bulk replay of those a filter names."""

from __future__ import annotations

from typing import Any

import psycopg
from aiohttp import web
from pydantic import Field

from worker.api import answers
from worker.api import endpoints as endpoint_rules
from worker.api.common import TENANT_FILTER, Category, Page, decided_by, narrow_to_tenant, state_of
from worker.api.declare import Route, body_of, id_of, query_of
from worker.api.inputs import (
    DEAD_LETTER_CURSOR,
    INTEGER_MAX,
    Body,
    Id,
    Ref,
    Text,
    Timestamp,
    dead_letter_cursor,
    encode_dead_letter_cursor,
)
from worker.observability import get_logger
from worker.rules import coalescing
from worker.rules.pacing import RATE_MAX, RATE_MIN
from worker.store import deliveries as delivery_store
from worker.store import operations as operation_store
from worker.web.context import (
    ADMIN,
    READ,
    caller_of,
    json_response,
)
from worker.web.problems import conflict, invalid, not_found


async def _endpoint_filter(conn: psycopg.AsyncConnection[Any], value: str | None, field: str) -> int | None:
    if value is None:
        return None
    found = await endpoint_rules.endpoint_id(conn, value, field)
    if found is None:
        raise invalid(field, "no endpoint with this name or id")
    return found


class Filters(Page):
    tenant: Text | None = TENANT_FILTER
    endpoint: Ref | None = Field(default=None, description="endpoint name or id")
    event_type: Text | None = Field(default=None, description="exact event type")
    category: Category | None = Field(default=None, description="failure category")
    since: Timestamp | None = Field(default=None, description="inclusive")
    until: Timestamp | None = Field(default=None, description="exclusive")


class DeliveryQuery(Filters):
    status: answers.Status | None = None
    idempotency_key: Text | None = Field(default=None, description="every endpoint's delivery of this key")
    cursor: Id | None = Field(default=None, description="next_cursor of the previous page")


def _filters(query: Filters) -> dict[str, Any]:
    return {"event_type": query.event_type, "category": query.category, "since": query.since,
            "until": query.until}


async def list_deliveries(request: web.Request) -> web.Response:
    query = query_of(request, DeliveryQuery)
    filters = {**_filters(query), "status": query.status, "idempotency_key": query.idempotency_key}
    async with state_of(request).db.transaction(caller_of(request)) as conn:
        await narrow_to_tenant(conn, query.tenant)
        filters["webhook_id"] = await _endpoint_filter(conn, _ref(query.endpoint), "endpoint")
        rows = await delivery_store.page(conn, filters, query.cursor, query.limit + 1)
    more = len(rows) > query.limit
    rows = rows[:query.limit]
    cursor = str(rows[-1]["delivery_id"]) if more else None
    return json_response({"items": rows, "next_cursor": cursor})


def _ref(value: int | str | None) -> str | None:
    return None if value is None else str(value)


async def get_delivery(request: web.Request) -> web.Response:
    delivery_id = id_of(request)
    async with state_of(request).db.transaction(caller_of(request)) as conn:
        row = await delivery_store.delivery(conn, delivery_id)
    if row is None:
        raise not_found(f"delivery {delivery_id}")
    for attempt in row["attempts_history"]:
        digest_id = attempt["digest_id"]
        attempt["digest"] = None if digest_id is None else coalescing.digest_label(digest_id)
        if digest_id is None:
            attempt["digest_rows"] = None
    row["attempts_history"] = row.pop("attempts_history")
    return json_response(row)


async def replay_delivery(request: web.Request) -> web.Response:
    delivery_id = id_of(request)
    async with state_of(request).db.transaction(caller_of(request)) as conn:
        replayed = await delivery_store.replay(conn, delivery_id)
        status = None if replayed else await delivery_store.status(conn, delivery_id)
    if replayed:
        get_logger().info("api replayed a delivery", delivery_id=delivery_id, by=caller_of(request).name)
        return json_response({"delivery_id": delivery_id, "status": "pending"}, status=202,
                             location=f"/v1/deliveries/{delivery_id}")
    if status is None:
        raise not_found(f"delivery {delivery_id}")
    async with state_of(request).db.transaction(caller_of(request)) as conn:
        refusal = await delivery_store.replay_refusal(conn, delivery_id)
    raise conflict(refusal or f"delivery {delivery_id} was not replayed: try again")


class DeadLetterQuery(Filters):
    cursor: str | None = Field(default=None, pattern=DEAD_LETTER_CURSOR,
                               description="next_cursor of the previous page")


async def list_dead_letters(request: web.Request) -> web.Response:
    query = query_of(request, DeadLetterQuery)
    after = None if query.cursor is None else dead_letter_cursor(query.cursor)
    filters = _filters(query)
    async with state_of(request).db.transaction(caller_of(request)) as conn:
        await narrow_to_tenant(conn, query.tenant)
        filters["webhook_id"] = await _endpoint_filter(conn, _ref(query.endpoint), "endpoint")
        rows = await delivery_store.dead_letter_page(conn, filters, after, query.limit + 1)
    more = len(rows) > query.limit
    rows = rows[:query.limit]
    last = rows[-1] if more else None
    cursor = None if last is None else encode_dead_letter_cursor(last["dead_lettered_at"],
                                                                  last["delivery_id"])
    return json_response({"items": rows, "next_cursor": cursor})


class ReplayFilter(Body):
    endpoint: Ref | None = None
    event_type: Text | None = Field(default=None, min_length=1)
    category: Category | None = None
    since: Timestamp | None = None
    until: Timestamp | None = None


class BulkReplayBody(Body):
    filter: ReplayFilter = Field(default_factory=ReplayFilter)
    rate: float | None = Field(default=None, ge=RATE_MIN, le=RATE_MAX)  # rows a second
    max: int | None = Field(default=None, ge=1, le=INTEGER_MAX)


async def replay_dead_letters(request: web.Request) -> web.Response:
    body = body_of(request, BulkReplayBody)
    state, caller = state_of(request), caller_of(request)
    given = body.filter
    filters: dict[str, Any] = {"event_type": given.event_type, "category": given.category,
                               "since": given.since, "until": given.until}
    async with state.db.transaction(caller) as conn:
        filters["webhook_id"] = await _endpoint_filter(conn, _ref(given.endpoint), "filter.endpoint")
        operation_id = await operation_store.start_replay(conn, filters, body.rate, body.max,
                                                          decided_by(caller))
        operation = await operation_store.operation(conn, operation_id)
    state.operations_wakeup.set()
    get_logger().info("api bulk replay started", operation_id=operation_id, by=caller.name)
    return json_response(operation, status=202, location=f"/v1/operations/{operation_id}")


ROUTES: list[Route] = [
    Route("GET", "/v1/deliveries", list_deliveries, "Deliveries, newest first (keyset pages)", READ,
          {200: answers.DeliveryPage}, query=DeliveryQuery, refusals=(409,)),
    Route("GET", "/v1/deliveries/{id}", get_delivery, "A delivery with every attempt", READ,
          {200: answers.DeliveryDetail}, path_id="id", refusals=(404,)),
    Route("POST", "/v1/deliveries/{id}/replay", replay_delivery,
          "Send a dead letter or delivered row again (same webhook-id); 409 when it is neither", ADMIN,
          {202: answers.ReplayAccepted}, path_id="id", refusals=(404, 409)),
    Route("GET", "/v1/dead-letters", list_dead_letters, "Dead letters, oldest first (keyset pages)", READ,
          {200: answers.DeliveryPage}, query=DeadLetterQuery, refusals=(409,)),
    Route("POST", "/v1/dead-letters/replay", replay_dead_letters,
          "Replay every dead letter matching the filter, in resumable steps: 202 with the operation", ADMIN,
          {202: answers.Operation}, body=BulkReplayBody, refusals=(409,)),
]
