"""Messages as stored: published over the API in one statement each (the token checked in it, the
catalogue's version named), listed newest first, read with their deliveries."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from worker.rules.event_types import EventType, from_row
from worker.rules.tokens import ROLES, Caller
from worker.store.database import Conn, fetch_all, fetch_one

# The publish's statement refused it: the catalogue changed since the version it was checked at
# (api_publish_begin(), sql/functions/api.sql).
CATALOGUE_CHANGED = "WHC01"


async def publish_check(conn: Conn, token_hash: bytes, names: Sequence[str]
                        ) -> tuple[Caller | None, int, dict[str, EventType]]:
    """What a publish reads first, in one round trip: the caller its token stands for (None:
    unknown, revoked or expired), the catalogue's version and its entries of the event types `names`
    (api_publish_check()); a token not usable reads no entry."""
    cur = await conn.execute(
        "SELECT name, role, tenant_id, catalogue_version, event_types"
        " FROM webhooks.api_publish_check(%s, %s)", (token_hash, list(names)))
    row = await cur.fetchone()
    assert row is not None
    name, role, tenant_id, version, found = row
    known = {str(entry["name"]): from_row(entry) for entry in found or []}
    if name is None:
        return None, int(version), known
    assert role in ROLES
    return Caller(str(name), role, None if tenant_id is None else int(tenant_id)), int(version), known


async def publish_as(conn: Conn, token_hash: bytes, roles: Sequence[str], catalogue_version: int,
                     event_type: str, payload: str, endpoint: str | None, idempotency_key: str | None,
                     ordering_key: str | None, priority: int, expires_at: datetime | None,
                     traceparent: str | None) -> list[dict[str, Any]]:
    """Publish one message in one statement, its token checked in it (SQLSTATE 28000 when it is not
    usable), its type checked at `catalogue_version` (CATALOGUE_CHANGED when the catalogue has
    changed since): the deliveries it queued, or the existing ones for a key used before."""
    return await fetch_all(
        conn, "SELECT delivery_id, webhook_id AS endpoint_id, endpoint_name, created, idempotency_key"
              " FROM webhooks.api_publish_as(%s, %s, %s, %s, %s::jsonb, %s, %s, %s, %s, %s, %s)",
        (token_hash, list(roles), catalogue_version, event_type, payload, endpoint, idempotency_key,
         ordering_key, priority, expires_at, traceparent))


async def publish_batch_as(conn: Conn, token_hash: bytes, roles: Sequence[str], catalogue_version: int,
                           messages: str, traceparent: str | None) -> list[dict[str, Any]]:
    """Publish many messages (`messages`: api_publish_batch()'s JSON array) in one statement, as
    publish_as(): a row per delivery, or per message refused, by the message's ordinal (from 1)."""
    return await fetch_all(
        conn, "SELECT ordinal, delivery_id, webhook_id AS endpoint_id, endpoint_name, created,"
              " idempotency_key, refused_sqlstate, refused_constraint, refused_message"
              " FROM webhooks.api_publish_batch_as(%s, %s, %s, %s::jsonb, %s)",
        (token_hash, list(roles), catalogue_version, messages, traceparent))


# The columns of a message in lists (its payload and metadata only on its own page).
MESSAGE_COLUMNS = "message_id, event_id, event_type, created_at, traceparent, source_ref"
MESSAGE_DELIVERY_COLUMNS = (
    "message_id, delivery_id, endpoint_id, endpoint_name, idempotency_key, status, attempts, max_attempts,"
    " replays, next_retry_at, last_http_status, failure_category, dead_letter_reason, delivered_at,"
    " dead_lettered_at, endpoint_deleted_at"
)


async def page(conn: Conn, filters: dict[str, Any], before_id: int | None, limit: int
               ) -> list[dict[str, Any]]:
    """Newest first, after a cursor (sql/functions/messages.sql). A key names a message by its event id
    (what the API's publish makes every delivery's key) or by a key one of its deliveries carries (a
    producer's INSERT may give each row its own)."""
    return await fetch_all(
        conn,
        f"SELECT {MESSAGE_COLUMNS} FROM webhooks.message_overview"
        " WHERE (%(event_type)s::text IS NULL OR event_type = %(event_type)s)"
        " AND (%(idempotency_key)s::text IS NULL OR event_id = %(idempotency_key)s"
        "      OR message_id IN (SELECT d.message_id FROM webhooks.message_deliveries d"
        "                        WHERE d.idempotency_key = %(idempotency_key)s))"
        " AND (%(since)s::timestamptz IS NULL OR created_at >= %(since)s)"
        " AND (%(until)s::timestamptz IS NULL OR created_at < %(until)s)"
        " AND (%(before)s::bigint IS NULL OR message_id < %(before)s)"
        " ORDER BY message_id DESC LIMIT %(limit)s",
        {**filters, "before": before_id, "limit": limit})


async def message(conn: Conn, message_id: int) -> dict[str, Any] | None:
    return await fetch_one(conn, f"SELECT {MESSAGE_COLUMNS}, metadata, payload FROM webhooks.message_overview"
                                 " WHERE message_id = %s", (message_id,))


async def deliveries(conn: Conn, message_ids: list[int]) -> dict[int, list[dict[str, Any]]]:
    """The deliveries of these messages, by message, each by endpoint: one statement for them all
    (webhooks.message_deliveries finds them through its indexes)."""
    found: dict[int, list[dict[str, Any]]] = {message_id: [] for message_id in message_ids}
    if not message_ids:
        return found
    for row in await fetch_all(
            conn, f"SELECT {MESSAGE_DELIVERY_COLUMNS} FROM webhooks.message_deliveries"
                  " WHERE message_id = ANY (%s) ORDER BY message_id, endpoint_id, delivery_id",
            (message_ids,)):
        found[row.pop("message_id")].append(row)
    return found
