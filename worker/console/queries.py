"""What the console reads and changes: the SQL views and functions the CLI uses, called by name."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import psycopg

from worker import endpoints as endpoint_service
from worker import event_types
from worker.api.database import fetch_all, fetch_one
from worker.api.queries import cancel_operation as cancel_operation  # the API's: one call for both
from worker.api.queries import delete_endpoint as delete_endpoint  # the API's: one call for both
from worker.api.queries import start_replay as api_start_replay
from worker.coalescing import digest_label
from worker.console import chart
from worker.operator_sql import DEAD_LETTER_ORDER, DEAD_LETTERS_MATCHING

CHART_HOURS = 6
CHART_BUCKET = timedelta(minutes=10)
# Pages list at most this many rows: the console is for looking, bulk work has the API and CLI.
PAGE_ROWS = 200
# An endpoint's page shows its latest deliveries, attempts and changes, this many of each.
RECENT_ROWS = 20
# Failed attempts: what the chart draws in red (deferrals and state changes are neither).
FAILED_OUTCOMES = ("retry", "dead_letter", "lease_expired")
# A payload shown whole up to this size; a larger one is cut, saying so.
PAYLOAD_SHOWN_CHARS = 64 * 1024
# The event-type list names this many of the subscriptions matching each type; its page names them all.
SHOWN_SUBSCRIPTIONS = 5


async def overview(conn: psycopg.AsyncConnection[Any]) -> dict[str, Any]:
    queue = await fetch_all(
        conn, "SELECT status, deliveries, oldest_due_age_seconds FROM webhooks.queue_statistics")
    held_back = await fetch_all(
        conn, "SELECT reason, sum(rows)::bigint AS rows FROM webhooks.held_back"
              " WHERE reason IS NOT NULL GROUP BY reason ORDER BY reason")
    return {
        "queue": queue,
        "oldest_due_seconds": max((r["oldest_due_age_seconds"] or 0.0 for r in queue), default=0.0),
        "held_back": held_back,
        "endpoints": await endpoints(conn),
        "chart": await attempts_chart(conn),
    }


async def endpoints(conn: psycopg.AsyncConnection[Any]) -> list[dict[str, Any]]:
    # The last failure's category comes from the audit log, read only from the last failure's time on.
    return await fetch_all(
        conn,
        "SELECT s.id, s.name, s.description, s.url_display, s.active, s.disabled_reason, s.health_status,"
        "       s.circuit_state,"
        "       s.circuit_open_until, s.consecutive_failures, s.last_success_at, s.last_failure_at,"
        "       f.failure_category AS last_failure_category"
        " FROM webhooks.endpoint_summary s"
        " LEFT JOIN LATERAL ("
        "     SELECT l.failure_category FROM webhooks.alert_delivery_log l"
        "     WHERE l.webhook_id = s.id AND l.failure_category IS NOT NULL"
        "       AND l.logged_at >= s.last_failure_at - interval '1 minute'"
        "     ORDER BY l.logged_at DESC LIMIT 1) f ON true"
        " ORDER BY s.id LIMIT %s",
        (PAGE_ROWS,))


async def endpoint_page(conn: psycopg.AsyncConnection[Any], endpoint_id: int) -> dict[str, Any] | None:
    """An endpoint's page: its settings in the service's one shape, its subscriptions that match no
    current event type, health and circuit, its latest deliveries and attempts, its changes; None when
    the caller does not see it."""
    endpoint = await fetch_one(conn, f"SELECT {endpoint_service.COLUMNS} FROM webhooks.endpoint_summary"
                                     " WHERE id = %s", (endpoint_id,))
    if endpoint is None:
        return None
    deliveries = await fetch_all(
        conn, "SELECT delivery_id, event_type, status, attempts, last_http_status, failure_category,"
              " created_at FROM webhooks.delivery_overview WHERE webhook_id = %s"
              " ORDER BY delivery_id DESC LIMIT %s",
        (endpoint_id, RECENT_ROWS))
    attempts = await fetch_all(
        conn, "SELECT delivery_id, attempt, outcome, failure_category, http_status, latency_ms, error,"
              " logged_at FROM webhooks.alert_delivery_log WHERE webhook_id = %s"
              " ORDER BY logged_at DESC LIMIT %s",
        (endpoint_id, RECENT_ROWS))
    events = await fetch_all(
        conn, "SELECT at, change, reason, decided_by FROM webhooks.endpoint_events WHERE webhook_id = %s"
              " ORDER BY at DESC LIMIT %s", (endpoint_id, RECENT_ROWS))
    # its subscriptions no current catalogued type matches, as `endpoints show` finds them
    unmatched = event_types.unmatched_of_endpoint(await event_types.unmatched_subscriptions_async(conn),
                                                  endpoint_id)
    return {"endpoint": endpoint, "deliveries": deliveries, "attempts": attempts, "events": events,
            "unmatched": unmatched}


async def attempts_chart(conn: psycopg.AsyncConnection[Any]) -> chart.Chart:
    row = await fetch_one(conn, "SELECT now() AS now")
    assert row is not None
    now: datetime = row["now"]
    rows = await fetch_all(
        conn,
        "SELECT date_bin(%(bucket)s, l.logged_at, timestamptz 'epoch') AS bucket,"
        "       count(*) FILTER (WHERE l.outcome = 'delivered') AS delivered,"
        "       count(*) FILTER (WHERE l.outcome = ANY(%(failed)s)) AS failed"
        " FROM webhooks.alert_delivery_log l"
        " WHERE l.logged_at >= %(now)s - %(window)s"
        # a tenant filter on an admin's page even for a login row-level security does not bind (an
        # API still logging in as the owner)
        "   AND (nullif(current_setting('webhooks.tenant', true), '') IS NULL"
        "        OR l.tenant_id = nullif(current_setting('webhooks.tenant', true), '')::bigint)"
        " GROUP BY 1",
        {"bucket": CHART_BUCKET, "failed": list(FAILED_OUTCOMES), "now": now,
         "window": timedelta(hours=CHART_HOURS) + CHART_BUCKET})
    counts = {r["bucket"]: (int(r["delivered"]), int(r["failed"])) for r in rows}
    return chart.build(counts, now, CHART_HOURS, CHART_BUCKET)


async def dead_letters(conn: psycopg.AsyncConnection[Any], filters: dict[str, Any]) -> list[dict[str, Any]]:
    return await fetch_all(
        conn,
        "SELECT delivery_id, webhook_id, endpoint_name, endpoint_deleted_at, event_type, attempts, replays,"
        "       failure_category, last_http_status, dead_letter_reason, dead_lettered_at"
        " FROM webhooks.delivery_overview"
        + DEAD_LETTERS_MATCHING + DEAD_LETTER_ORDER +
        " LIMIT %(limit)s",
        {"since": None, "until": None, "webhook_id": None, **filters, "limit": PAGE_ROWS})


async def search_deliveries(conn: psycopg.AsyncConnection[Any], found: dict[str, Any],
                            webhook_id: int | None) -> list[dict[str, Any]]:
    """Deliveries matching the search (any status), newest first."""
    return await fetch_all(
        conn,
        "SELECT delivery_id, webhook_id, endpoint_name, endpoint_deleted_at, event_type, idempotency_key,"
        "       status, attempts, last_http_status, failure_category, next_retry_at, created_at"
        " FROM webhooks.delivery_overview"
        " WHERE (%(id)s::bigint IS NULL OR delivery_id = %(id)s)"
        "   AND (%(key)s::text IS NULL OR idempotency_key = %(key)s)"
        "   AND (%(event_type)s::text IS NULL OR event_type = %(event_type)s)"
        "   AND (%(status)s::text IS NULL OR status = %(status)s)"
        "   AND (%(webhook_id)s::bigint IS NULL OR webhook_id = %(webhook_id)s)"
        "   AND (%(since)s::timestamptz IS NULL OR created_at >= %(since)s)"
        "   AND (%(until)s::timestamptz IS NULL OR created_at < %(until)s)"
        " ORDER BY delivery_id DESC LIMIT %(limit)s",
        {**found, "webhook_id": webhook_id, "limit": PAGE_ROWS})


async def filter_choices(conn: psycopg.AsyncConnection[Any]) -> dict[str, list[Any]]:
    names = await fetch_all(conn, "SELECT id, name FROM webhooks.endpoint_summary ORDER BY name LIMIT %s",
                            (PAGE_ROWS,))
    tenants = await fetch_all(conn, "SELECT id, name FROM webhooks.tenant_summary ORDER BY name LIMIT %s",
                              (PAGE_ROWS,))
    return {"endpoints": names, "tenants": tenants}


async def endpoint_ref(conn: psycopg.AsyncConnection[Any], ref: str) -> int | str | None:
    """The endpoint a name, an id or tenant/name names, as the CLI reads ENDPOINT (None: none the
    caller sees); for a name held in more than one tenant, why it names none (asking for the id or
    tenant/name)."""
    try:
        row = await fetch_one(conn, "SELECT webhooks.endpoint_ref(%s) AS id", (ref,))
    except psycopg.errors.TooManyRows as exc:
        return str(exc.diag.message_primary)
    return None if row is None or row["id"] is None else int(row["id"])


async def tenant_id(conn: psycopg.AsyncConnection[Any], name: str) -> int | None:
    """A tenant the caller may see, by name (None: no such tenant, or not the caller's)."""
    row = await fetch_one(conn, "SELECT id FROM webhooks.tenant_summary WHERE name = %s", (name,))
    return None if row is None else int(row["id"])


async def tenant_name(conn: psycopg.AsyncConnection[Any], tenant: int) -> str:
    """The name of the tenant a session is kept to (its id when the tenant cannot be read)."""
    row = await fetch_one(conn, "SELECT name FROM webhooks.tenant_summary WHERE id = %s", (tenant,))
    return str(tenant) if row is None else str(row["name"])


async def delivery(conn: psycopg.AsyncConnection[Any], delivery_id: int) -> dict[str, Any] | None:
    row = await fetch_one(conn, "SELECT * FROM webhooks.delivery(%s)", (delivery_id,))
    if row is None:
        return None
    row["history"] = await fetch_all(
        conn,
        "SELECT attempt, outcome, failure_category, http_status, latency_ms, error, response_excerpt,"
        "       worker_id, stale, logged_at, digest_id,"
        # members only ever leave a digest: the rows it carried when it was first sent
        "       (SELECT count(DISTINCT d.delivery_id) FROM webhooks.alert_delivery_log d"
        "        WHERE d.digest_id = h.digest_id) AS digest_rows"
        "  FROM webhooks.delivery_history(%s) h",
        (delivery_id,))
    for attempt in row["history"]:
        attempt["digest"] = None if attempt["digest_id"] is None else digest_label(attempt["digest_id"])
    return row


async def replay(conn: psycopg.AsyncConnection[Any], delivery_ids: list[int]) -> tuple[int, int]:
    """Replay each delivery with webhooks.replay(), as `dlq replay` does: how many were put back, and
    how many of the others are rows of a deleted endpoint (never sent again). A row another operator
    replayed a moment earlier is no longer a dead letter and is left alone."""
    replayed = of_deleted = 0
    for delivery_id in delivery_ids:
        cur = await conn.execute("SELECT webhooks.replay(%s)", (delivery_id,))
        row = await cur.fetchone()
        if row and row[0]:
            replayed += 1
            continue
        cur = await conn.execute("SELECT endpoint_deleted_at IS NOT NULL FROM webhooks.delivery_overview"
                                 " WHERE delivery_id = %s", (delivery_id,))
        row = await cur.fetchone()
        of_deleted += bool(row and row[0])
    return replayed, of_deleted


async def endpoint_rows(conn: psycopg.AsyncConnection[Any], endpoint_id: int) -> dict[str, int]:
    """An endpoint's rows by what deleting it does with them: waiting (refused, or dropped as dead
    letters), being sent (refused), finished (kept as history)."""
    row = await fetch_one(
        conn, "SELECT count(*) FILTER (WHERE status IN ('pending', 'retrying')) AS waiting,"
              "       count(*) FILTER (WHERE status = 'delivering') AS sending,"
              "       count(*) FILTER (WHERE status IN ('delivered', 'dead_letter')) AS finished"
              " FROM webhooks.delivery_overview WHERE webhook_id = %s", (endpoint_id,))
    assert row is not None
    return {key: int(value) for key, value in row.items()}


async def start_replay(conn: psycopg.AsyncConnection[Any], filters: dict[str, Any], requested_by: str) -> int:
    """A bulk replay of the dead letters matching `filters`, started as the API starts one."""
    return await api_start_replay(conn, filters, None, None, requested_by)


ENDPOINT_ACTIONS = ("enable", "disable", "reset", "open")


async def endpoint_action(conn: psycopg.AsyncConnection[Any], endpoint_id: int, action: str, reason: str,
                          decided_by: str) -> str | None:
    """An endpoint change through the function the CLI calls; the change made, or None when there was
    nothing to do (enabling an enabled endpoint). The reason is recorded in the endpoint's events,
    apart from who decided."""
    if action == "disable":
        cur = await conn.execute("SELECT webhooks.disable_endpoint(%s, %s, %s)",
                                 (endpoint_id, reason, decided_by))
    elif action == "enable":
        cur = await conn.execute("SELECT webhooks.enable_endpoint(%s, %s, %s)",
                                 (endpoint_id, decided_by, reason))
    elif action in ("reset", "open"):
        cur = await conn.execute("SELECT webhooks.set_circuit(%s, %s, NULL, %s, %s)",
                                 (endpoint_id, action, decided_by, reason))
    else:
        raise ValueError(f"action: must be one of {', '.join(ENDPOINT_ACTIONS)}")
    row = await cur.fetchone()
    return None if row is None or row[0] is None else str(row[0])


async def endpoint_events(conn: psycopg.AsyncConnection[Any]) -> list[dict[str, Any]]:
    return await fetch_all(
        conn,
        "SELECT v.at, v.webhook_id, e.name AS endpoint_name, v.change, v.reason, v.decided_by"
        " FROM webhooks.endpoint_events v JOIN webhooks.endpoint_summary e ON e.id = v.webhook_id"
        " ORDER BY v.at DESC LIMIT 20")


def payload_text(payload: Any) -> tuple[str, bool]:
    """The payload as indented JSON, and whether it was cut to PAYLOAD_SHOWN_CHARS."""
    import json

    text = json.dumps(payload, indent=2, ensure_ascii=False, sort_keys=True)
    if len(text) > PAYLOAD_SHOWN_CHARS:
        return text[:PAYLOAD_SHOWN_CHARS], True
    return text, False


async def operations(conn: psycopg.AsyncConnection[Any]) -> list[dict[str, Any]]:
    """The bulk replays started over the API, newest first (row-level security keeps a scoped
    caller to its tenant's), each with the name of the endpoint its filter names, when the caller
    sees it."""
    return await fetch_all(
        conn, "SELECT o.id, o.status, o.processed, o.max_rows, o.rate, o.filter, o.requested_by,"
              " o.cancelled_by, o.error, o.created_at, o.finished_at, e.name AS endpoint_name"
              " FROM webhooks.api_operations o"
              " LEFT JOIN webhooks.endpoint_summary e ON e.id = CASE"
              "     WHEN jsonb_typeof(o.filter -> 'webhook_id') = 'number'"
              "     THEN (o.filter ->> 'webhook_id')::bigint END"
              " ORDER BY o.id DESC LIMIT %s", (PAGE_ROWS,))



async def event_type_subscriptions(conn: psycopg.AsyncConnection[Any],
                                   event_type: str) -> list[dict[str, Any]]:
    """The endpoint subscriptions that match a type (sql/functions/event_types.sql), by endpoint name."""
    return await fetch_all(
        conn, "SELECT webhook_id, endpoint_name, pattern FROM webhooks.event_type_subscriptions(%s) LIMIT %s",
        (event_type, PAGE_ROWS))


async def event_type_subscriptions_by_type(conn: psycopg.AsyncConnection[Any]) -> dict[str, dict[str, Any]]:
    """For each type some subscription matches: how many do, and the first SHOWN_SUBSCRIPTIONS."""
    rows = await fetch_all(
        conn,
        "SELECT event_type, count(*) AS total,"
        "       jsonb_agg(jsonb_build_object('webhook_id', webhook_id, 'endpoint_name', endpoint_name,"
        "                                    'pattern', pattern) ORDER BY n) FILTER (WHERE n <= %s) AS shown"
        " FROM (SELECT s.*, row_number() OVER (PARTITION BY s.event_type ORDER BY s.endpoint_name, s.pattern)"
        "       AS n FROM webhooks.event_type_subscriptions() s) s"
        " GROUP BY event_type", (SHOWN_SUBSCRIPTIONS,))
    return {row["event_type"]: row for row in rows}
