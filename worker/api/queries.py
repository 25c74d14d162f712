"""What the /v1 routes (and the console) ask the database: SQL functions and views, by name."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from worker import endpoints as endpoint_service
from worker import event_types as catalogue
from worker import tenants as tenant_rules
from worker.api import tokens
from worker.api.database import fetch_all, fetch_one
from worker.api.problems import conflict, invalid, not_found
from worker.api.tokens import Caller
from worker.operator_sql import DEAD_LETTER_ORDER, DEAD_LETTERS_MATCHING, SETTABLE

Conn = psycopg.AsyncConnection[Any]

# The columns of a delivery in lists (the payload only on a delivery's own page).
DELIVERY_COLUMNS = (
    "delivery_id, webhook_id AS endpoint_id, endpoint_name, event_id, idempotency_key, event_type, status,"
    " attempts, max_attempts, replays, next_retry_at, last_http_status, failure_category, last_error,"
    " dead_letter_reason, priority, created_at, delivered_at, dead_lettered_at, endpoint_deleted_at"
)
ATTEMPT_COLUMNS = ("attempt, outcome, failure_category, http_status, latency_ms, error, response_excerpt,"
                   " worker_id, stale, logged_at, digest_id,"
                   # members only ever leave a digest: the rows it carried when it was first sent
                   " (SELECT count(DISTINCT d.delivery_id) FROM webhooks.alert_delivery_log d"
                   "  WHERE d.digest_id = h.digest_id) AS digest_rows")


async def endpoint_id(conn: Conn, name_or_id: str, field: str | None = None) -> int | None:
    """The endpoint an id, a name or `tenant/name` names (webhooks.endpoint_ref()); a name several
    tenants hold, to a caller that is no tenant's, is a conflict (409) asking for the id or
    `tenant/name`, naming `field` if the name came in one."""
    try:
        row = await fetch_one(conn, "SELECT webhooks.endpoint_ref(%s) AS id", (name_or_id,))
    except psycopg.errors.TooManyRows as exc:
        raise conflict(str(exc.diag.message_primary), field=field) from None
    return None if row is None or row["id"] is None else int(row["id"])


async def endpoint_named(conn: Conn, name_or_id: str) -> int:
    """The endpoint a path names, by id, by name or as `tenant/name` (as the CLI's ENDPOINT
    arguments); one the caller cannot see (another tenant's) is a missing one: 404."""
    found = await endpoint_id(conn, name_or_id)
    if found is None:
        raise not_found(f"endpoint {name_or_id}")
    return found


async def destination_scope(conn: Conn, tenant: str | None = None, endpoint_id: int | None = None
                            ) -> endpoint_service.DestinationScope | None:
    """Where an endpoint registered in `tenant`, or the endpoint `endpoint_id`, may deliver
    (worker.endpoints.destination_scope, on the request's connection)."""
    try:
        cur = await conn.execute(endpoint_service.DESTINATION_SCOPE, (tenant, endpoint_id))
        return endpoint_service.scope_of(await cur.fetchone())
    except psycopg.errors.NoDataFound:
        raise invalid("tenant", f"no tenant named {tenant!r} (tenants list shows them)") from None


# The publish's statement refused it: the catalogue changed since the version it was checked at
# (api_publish_begin(), sql/functions/api.sql).
CATALOGUE_CHANGED = "WHC01"


async def publish_check(conn: Conn, token_hash: bytes, names: Sequence[str]
                        ) -> tuple[Caller | None, int, dict[str, catalogue.EventType]]:
    """What a publish reads first, in one round trip: the caller its token stands for (None:
    unknown, revoked or expired), the catalogue's version and its entries of the event types `names`
    (api_publish_check()); a token not usable reads no entry."""
    cur = await conn.execute(
        "SELECT name, role, tenant_id, catalogue_version, event_types"
        " FROM webhooks.api_publish_check(%s, %s)", (token_hash, list(names)))
    row = await cur.fetchone()
    assert row is not None
    name, role, tenant_id, version, found = row
    known = {str(entry["name"]): catalogue.from_row(entry) for entry in found or []}
    if name is None:
        return None, int(version), known
    assert role in tokens.ROLES
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


async def deliveries(
    conn: Conn, filters: dict[str, Any], before_id: int | None, limit: int
) -> list[dict[str, Any]]:
    """Newest first, after a cursor: rows inserted meanwhile have larger ids, so pages do not shift."""
    return await fetch_all(
        conn,
        f"SELECT {DELIVERY_COLUMNS} FROM webhooks.delivery_overview"
        " WHERE (%(status)s::text IS NULL OR status = %(status)s)"
        " AND (%(webhook_id)s::bigint IS NULL OR webhook_id = %(webhook_id)s)"
        " AND (%(event_type)s::text IS NULL OR event_type = %(event_type)s)"
        " AND (%(category)s::text IS NULL OR failure_category = %(category)s)"
        " AND (%(idempotency_key)s::text IS NULL OR idempotency_key = %(idempotency_key)s)"
        " AND (%(since)s::timestamptz IS NULL OR created_at >= %(since)s)"
        " AND (%(until)s::timestamptz IS NULL OR created_at < %(until)s)"
        " AND (%(before)s::bigint IS NULL OR delivery_id < %(before)s)"
        " ORDER BY delivery_id DESC LIMIT %(limit)s",
        {**filters, "before": before_id, "limit": limit})


async def dead_letters(conn: Conn, filters: dict[str, Any], after: tuple[datetime, int] | None,
                       limit: int) -> list[dict[str, Any]]:
    """Oldest dead letter first, as the CLI lists them and replays them; new ones sort last."""
    after_at, after_id = after if after is not None else (None, None)
    return await fetch_all(
        conn,
        f"SELECT {DELIVERY_COLUMNS} FROM webhooks.delivery_overview"
        + DEAD_LETTERS_MATCHING +
        " AND (%(after_at)s::timestamptz IS NULL"
        "      OR (dead_lettered_at, delivery_id) > (%(after_at)s, %(after_id)s))"
        + DEAD_LETTER_ORDER + " LIMIT %(limit)s",
        {**filters, "after_at": after_at, "after_id": after_id, "limit": limit})


async def delivery(conn: Conn, delivery_id: int) -> dict[str, Any] | None:
    row = await fetch_one(conn, f"SELECT {DELIVERY_COLUMNS}, payload, source_ref"
                                " FROM webhooks.delivery(%s)", (delivery_id,))
    if row is not None:
        row["attempts_history"] = await fetch_all(
            conn, f"SELECT {ATTEMPT_COLUMNS} FROM webhooks.delivery_history(%s) h", (delivery_id,))
    return row


async def replay(conn: Conn, delivery_id: int) -> bool:
    row = await fetch_one(conn, "SELECT webhooks.replay(%s) AS replayed", (delivery_id,))
    return bool(row and row["replayed"])


async def delivery_status(conn: Conn, delivery_id: int) -> str | None:
    row = await fetch_one(conn, "SELECT status FROM webhooks.delivery(%s)", (delivery_id,))
    return None if row is None else str(row["status"])


async def start_replay(conn: Conn, filters: dict[str, Any], rate: float | None, max_rows: int | None,
                       requested_by: str) -> int:
    stored = {key: (value.isoformat() if isinstance(value, datetime) else value)
              for key, value in filters.items() if value is not None}
    row = await fetch_one(conn, "SELECT webhooks.api_start_replay(%s, %s, %s, %s) AS id",
                          (Jsonb(stored), rate, max_rows, requested_by))
    assert row is not None
    return int(row["id"])


async def cancel_operation(conn: Conn, operation_id: int, cancelled_by: str) -> str | None:
    row = await fetch_one(conn, "SELECT webhooks.api_cancel_operation(%s, %s) AS status",
                          (operation_id, cancelled_by))
    return None if row is None else row["status"]


async def operation(conn: Conn, operation_id: int) -> dict[str, Any] | None:
    return await fetch_one(
        conn, "SELECT id, kind, filter, rate, max_rows AS max, status, processed, requested_by, cancelled_by,"
              " error, created_at, updated_at, finished_at FROM webhooks.api_operations WHERE id = %s",
        (operation_id,))


ENDPOINT_COLUMNS = endpoint_service.COLUMNS  # one shape, read and written (worker/endpoints.py)


async def endpoints(conn: Conn, after_id: int | None, limit: int) -> list[dict[str, Any]]:
    return await fetch_all(
        conn, f"SELECT {ENDPOINT_COLUMNS} FROM webhooks.endpoint_summary"
              " WHERE (%(after)s::bigint IS NULL OR id > %(after)s) ORDER BY id LIMIT %(limit)s",
        {"after": after_id, "limit": limit})


async def endpoint(conn: Conn, endpoint_id: int) -> dict[str, Any] | None:
    row = await fetch_one(conn, f"SELECT {ENDPOINT_COLUMNS} FROM webhooks.endpoint_summary WHERE id = %s",
                          (endpoint_id,))
    if row is None:
        return None
    row["queued"] = {r["status"]: r["n"] for r in await fetch_all(
        conn, "SELECT status, count(*) AS n FROM webhooks.alert_delivery_queue WHERE webhook_id = %s"
              " GROUP BY status ORDER BY status", (endpoint_id,))}
    row["recent_changes"] = await fetch_all(
        conn, "SELECT change, reason, decided_by, delivery_id, at FROM webhooks.endpoint_events"
              " WHERE webhook_id = %s ORDER BY at DESC, id DESC LIMIT 10", (endpoint_id,))
    return row


async def endpoint_health(conn: Conn, endpoint_id: int, hours: int) -> dict[str, Any] | None:
    row = await fetch_one(
        conn, "SELECT id, name, active, health_status, circuit_state, circuit_open_until,"
              " consecutive_failures, successes, failures, last_success_at, last_failure_at"
              " FROM webhooks.endpoint_summary WHERE id = %s", (endpoint_id,))
    if row is None:
        return None
    row["window_hours"] = hours
    row["recent"] = await fetch_all(
        conn, "SELECT outcome, coalesce(failure_category, 'none') AS category, count(*) AS attempts"
              " FROM webhooks.alert_delivery_log WHERE webhook_id = %s"
              " AND logged_at >= now() - make_interval(hours => %s)"
              " GROUP BY 1, 2 ORDER BY 1, 2", (endpoint_id, hours))
    last = await fetch_one(
        conn, "SELECT failure_category FROM webhooks.alert_delivery_log WHERE webhook_id = %s"
              " AND failure_category IS NOT NULL ORDER BY logged_at DESC LIMIT 1", (endpoint_id,))
    row["last_failure_category"] = None if last is None else last["failure_category"]
    return row


async def set_active(conn: Conn, endpoint_id: int, active: bool, reason: str, decided_by: str) -> str | None:
    if active:
        row = await fetch_one(conn, "SELECT webhooks.enable_endpoint(%s, %s) AS change",
                              (endpoint_id, decided_by))
    else:
        row = await fetch_one(conn, "SELECT webhooks.disable_endpoint(%s, %s, %s) AS change",
                              (endpoint_id, reason, decided_by))
    return None if row is None else row["change"]


async def set_circuit(conn: Conn, endpoint_id: int, action: str, until: datetime | None,
                      decided_by: str) -> str:
    row = await fetch_one(conn, "SELECT webhooks.set_circuit(%s, %s, %s, %s) AS change",
                          (endpoint_id, action, until, decided_by))
    assert row is not None
    return str(row["change"])


async def delete_endpoint(conn: Conn, endpoint_id: int, drop_pending: bool, decided_by: str) -> int | None:
    """The rows dropped (made dead letters) with it, or None: no such endpoint."""
    row = await fetch_one(conn, "SELECT webhooks.api_delete_endpoint(%s, %s, %s) AS dropped",
                          (endpoint_id, drop_pending, decided_by))
    return None if row is None or row["dropped"] is None else int(row["dropped"])


async def replay_refusal(conn: Conn, delivery_id: int) -> str | None:
    """Why a delivery is not replayed, in words (None: it can be, or the caller does not see it)."""
    row = await fetch_one(conn, "SELECT webhooks.replay_refusal(%s) AS refusal", (delivery_id,))
    return None if row is None else row["refusal"]


async def stats(conn: Conn) -> dict[str, Any]:
    return {
        "queue": await fetch_all(conn, "SELECT * FROM webhooks.queue_statistics ORDER BY status"),
        "held_back": await fetch_all(
            conn, "SELECT reason, sum(rows)::bigint AS rows FROM webhooks.held_back"
                  " WHERE reason IS NOT NULL GROUP BY reason ORDER BY reason"),
    }


async def config(conn: Conn) -> dict[str, Any]:
    row = await fetch_one(conn, "SELECT * FROM webhooks.delivery_config")
    assert row is not None
    row.pop("singleton", None)
    return row


async def set_config(conn: Conn, changes: dict[str, str | None]) -> None:
    """The operator CLI's `config set`, for several keys in the caller's one transaction."""
    for key, value in changes.items():
        statement = sql.SQL(
            "UPDATE webhooks.delivery_config SET {key} = %s::{type}, updated_at = now()"
        ).format(key=sql.Identifier(key), type=sql.SQL(SETTABLE[key]))
        await conn.execute(statement, (value,))


TENANT_COLUMNS = ", ".join(tenant_rules.SUMMARY_COLUMNS)  # the CLI's `tenants show` too


async def tenants(conn: Conn) -> list[dict[str, Any]]:
    return await fetch_all(conn, f"SELECT {TENANT_COLUMNS} FROM webhooks.tenant_summary ORDER BY id")


async def tenant(conn: Conn, name_or_id: str) -> dict[str, Any] | None:
    """A tenant by id (all digits) or by name (anything else: names cannot be all digits)."""
    if name_or_id.isascii() and name_or_id.isdigit():
        if len(name_or_id.lstrip("0")) > 18:
            return None  # beyond bigint: no such id
        return await fetch_one(conn, f"SELECT {TENANT_COLUMNS} FROM webhooks.tenant_summary WHERE id = %s",
                               (int(name_or_id),))
    return await fetch_one(conn, f"SELECT {TENANT_COLUMNS} FROM webhooks.tenant_summary WHERE name = %s",
                           (name_or_id,))


async def add_tenant(conn: Conn, name: str, limits: dict[str, Any]) -> None:
    await conn.execute("SELECT webhooks.register_tenant(%s, %s)", (name, Jsonb(tenant_rules.stored(limits))))


async def update_tenant(conn: Conn, name: str, limits: dict[str, Any]) -> None:
    await conn.execute("SELECT webhooks.update_tenant(%s, %s)", (name, Jsonb(tenant_rules.stored(limits))))


async def tenant_id(conn: Conn, name: str) -> int | None:
    """A tenant's id by its name, as the caller sees the tenants (a scoped caller: its own only)."""
    row = await fetch_one(conn, "SELECT id FROM webhooks.tenants WHERE name = %s", (name,))
    return None if row is None else int(row["id"])


async def send_test_event(conn: Conn, endpoint_id: int) -> int:
    """A webhook.test event to this endpoint alone (sql/functions/event_types.sql): its delivery id."""
    row = await fetch_one(conn, "SELECT webhooks.send_test_event(%s) AS delivery_id", (str(endpoint_id),))
    assert row is not None
    return int(row["delivery_id"])


async def event_types(conn: Conn) -> list[dict[str, Any]]:
    return await fetch_all(conn, "SELECT name, description, schema, deprecated, created_at, updated_at"
                                 " FROM webhooks.event_type_list()")


async def unmatched_subscriptions(conn: Conn) -> list[dict[str, Any]]:
    return await fetch_all(conn, "SELECT webhook_id AS endpoint_id, endpoint_name, pattern, problem"
                                 " FROM webhooks.unmatched_subscriptions()")


# The columns of a message in lists (its payload and metadata only on its own page).
MESSAGE_COLUMNS = "message_id, event_id, event_type, created_at, traceparent, source_ref"
MESSAGE_DELIVERY_COLUMNS = (
    "message_id, delivery_id, endpoint_id, endpoint_name, idempotency_key, status, attempts, max_attempts,"
    " replays, next_retry_at, last_http_status, failure_category, dead_letter_reason, delivered_at,"
    " dead_lettered_at, endpoint_deleted_at"
)


async def messages(conn: Conn, filters: dict[str, Any], before_id: int | None,
                   limit: int) -> list[dict[str, Any]]:
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


async def message_deliveries(conn: Conn, message_ids: list[int]) -> dict[int, list[dict[str, Any]]]:
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
