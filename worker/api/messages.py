"""Routes for what was published, each declared once: messages (one per event a publish or a producer's
INSERT fanned out), newest first, each with its deliveries per endpoint and their status."""

from __future__ import annotations

from datetime import datetime

from aiohttp import web
from pydantic import Field, JsonValue

from worker.api import self_service
from worker.api.answers import Answer, DeliveryState
from worker.api.declare import Route, id_of, query_of
from worker.api.inputs import DEFAULT_PAGE, MAX_PAGE, Id, Query, Text, Timestamp
from worker.store import messages as message_store
from worker.web.context import READ, STATE, caller_of, json_response
from worker.web.problems import not_found

# --- what the routes answer ---------------------------------------------------------------------------


class MessageDelivery(DeliveryState):
    """One delivery of a message: its state at one endpoint."""


class Message(Answer):
    message_id: int
    event_id: str
    event_type: str
    created_at: datetime
    traceparent: str | None
    source_ref: str | None
    deliveries: list[MessageDelivery] = Field(description="one per endpoint it was sent to, by endpoint id")


class MessageDetail(Message):
    metadata: JsonValue
    payload: JsonValue


class MessagePage(Answer):
    items: list[Message]
    next_cursor: str | None = Field(description="pass as `cursor` for the next page; null on the last")


# --- the routes -----------------------------------------------------------------------------------------


class MessageQuery(Query):
    limit: int = Field(default=DEFAULT_PAGE, ge=1, le=MAX_PAGE, description="messages per page")
    tenant: Text | None = self_service.TENANT_FILTER
    event_type: Text | None = Field(default=None, description="exact event type")
    idempotency_key: Text | None = Field(
        default=None, description="the message of this event id, or whose delivery carries this key")
    since: Timestamp | None = Field(default=None, description="published at or after (inclusive)")
    until: Timestamp | None = Field(default=None, description="published before (exclusive)")
    cursor: Id | None = Field(default=None, description="next_cursor of the previous page")


async def list_messages(request: web.Request) -> web.Response:
    query = query_of(request, MessageQuery)
    filters = {"event_type": query.event_type, "idempotency_key": query.idempotency_key,
               "since": query.since, "until": query.until}
    async with request.app[STATE].db.transaction(caller_of(request)) as conn:
        await self_service.narrow_to_tenant(conn, query.tenant)
        rows = await message_store.page(conn, filters, query.cursor, query.limit + 1)
        more = len(rows) > query.limit
        rows = rows[:query.limit]
        deliveries = await message_store.deliveries(conn, [row["message_id"] for row in rows])
    for row in rows:
        row["deliveries"] = deliveries[row["message_id"]]
    cursor = str(rows[-1]["message_id"]) if more else None
    return json_response({"items": rows, "next_cursor": cursor})


async def get_message(request: web.Request) -> web.Response:
    message_id = id_of(request)
    async with request.app[STATE].db.transaction(caller_of(request)) as conn:
        row = await message_store.message(conn, message_id)
        if row is None:
            raise not_found(f"message {message_id}")
        row["deliveries"] = (await message_store.deliveries(conn, [message_id]))[message_id]
    return json_response(row)


ROUTES: list[Route] = [
    Route("GET", "/v1/messages", list_messages,
          "What was published, newest first (keyset pages): each message once, whether published here or"
          " inserted with SQL, with its deliveries per endpoint and their status", READ, {200: MessagePage},
          query=MessageQuery),
    Route("GET", "/v1/messages/{id}", get_message,
          "A message: its payload and metadata, and its deliveries per endpoint", READ, {200: MessageDetail},
          path_id="id", refusals=(404,)),
]
