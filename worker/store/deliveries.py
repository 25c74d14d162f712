"""Deliveries as stored: found, listed and paged (dead letters oldest first, as they are replayed),
replayed one at a time or in a batch, test events queued through the gate, retention run now; and
the demo's plain INSERT."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

import psycopg

from worker.rules.self_service import RefusedTestEvent, refusal_of
from worker.store.database import Conn, fetch_all, fetch_one

# The dead letters an operator's filter names, in webhooks.delivery_overview: the CLI's, the API's and
# the console's lists read the same rows (parameters webhook_id, event_type, category, since, until;
# each NULL matches all).
DEAD_LETTERS_MATCHING = (
    " WHERE status = 'dead_letter'"
    " AND (%(webhook_id)s::bigint IS NULL OR webhook_id = %(webhook_id)s)"
    " AND (%(event_type)s::text IS NULL OR event_type = %(event_type)s)"
    " AND (%(category)s::text IS NULL OR failure_category = %(category)s)"
    " AND (%(since)s::timestamptz IS NULL OR dead_lettered_at >= %(since)s)"
    " AND (%(until)s::timestamptz IS NULL OR dead_lettered_at < %(until)s)"
)
# Oldest first, the order they are replayed in: the CLI, the API and the console list them so.
DEAD_LETTER_ORDER = " ORDER BY dead_lettered_at, delivery_id"

# The columns of a delivery in the API's lists (the payload only on a delivery's own page).
DELIVERY_COLUMNS = (
    "delivery_id, webhook_id AS endpoint_id, endpoint_name, event_id, idempotency_key, event_type, status,"
    " attempts, max_attempts, replays, next_retry_at, last_http_status, failure_category, last_error,"
    " dead_letter_reason, priority, created_at, delivered_at, dead_lettered_at, endpoint_deleted_at"
)
# members only ever leave a digest: the rows it carried when it was first sent
_DIGEST_ROWS = (" (SELECT count(DISTINCT d.delivery_id) FROM webhooks.alert_delivery_log d"
                "  WHERE d.digest_id = h.digest_id) AS digest_rows")
ATTEMPT_COLUMNS = ("attempt, outcome, failure_category, http_status, latency_ms, error, response_excerpt,"
                   " worker_id, stale, logged_at, digest_id," + _DIGEST_ROWS)
# The CLI's `deliveries show` history: no response excerpt.
_CLI_ATTEMPT_COLUMNS = ("attempt, outcome, failure_category, http_status, latency_ms, error, worker_id,"
                        " stale, logged_at, digest_id," + _DIGEST_ROWS)


async def point_in_time(conn: Conn, value: str) -> datetime | None:
    """A timestamp as PostgreSQL reads one ('2026-11-26 12:00', 'today'), or a time that long ago
    ('1 hour ago', '90 minutes'), at the database's clock; None when it is neither."""
    ago = value.strip().removesuffix(" ago")
    for sql, given in (("SELECT %s::timestamptz", value), ("SELECT now() - %s::interval", ago)):
        try:
            async with conn.transaction():
                cur = await conn.execute(sql, (given,))
                row = await cur.fetchone()
        except psycopg.errors.DataError:
            continue
        if row is not None:
            return row[0]  # type: ignore[no-any-return]
    return None


async def now(conn: Conn) -> datetime:
    """The database's clock, which decides schedules, windows and expiries."""
    cur = await conn.execute("SELECT now()")
    row = await cur.fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


# --- finding and listing -------------------------------------------------------------------------------


async def page(conn: Conn, filters: dict[str, Any], before_id: int | None, limit: int
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


async def search(conn: Conn, found: dict[str, Any], endpoint_id: int | None, limit: int
                 ) -> list[dict[str, Any]]:
    """Deliveries matching the console's search (any status), newest first."""
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
        {**found, "webhook_id": endpoint_id, "limit": limit})


async def of_endpoint(conn: Conn, endpoint_id: int, limit: int) -> list[dict[str, Any]]:
    """An endpoint's latest deliveries, newest first (the console's endpoint page)."""
    return await fetch_all(
        conn, "SELECT delivery_id, event_type, status, attempts, last_http_status, failure_category,"
              " created_at FROM webhooks.delivery_overview WHERE webhook_id = %s"
              " ORDER BY delivery_id DESC LIMIT %s", (endpoint_id, limit))


async def endpoint_rows(conn: Conn, endpoint_id: int) -> dict[str, int]:
    """An endpoint's rows by what deleting it does with them: waiting (refused, or dropped as dead
    letters), being sent (refused), finished (kept as history)."""
    row = await fetch_one(
        conn, "SELECT count(*) FILTER (WHERE status IN ('pending', 'retrying')) AS waiting,"
              "       count(*) FILTER (WHERE status = 'delivering') AS sending,"
              "       count(*) FILTER (WHERE status IN ('delivered', 'dead_letter')) AS finished"
              " FROM webhooks.delivery_overview WHERE webhook_id = %s", (endpoint_id,))
    assert row is not None
    return {key: int(value) for key, value in row.items()}


async def dead_letter_page(conn: Conn, filters: dict[str, Any], after: tuple[datetime, int] | None,
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


async def dead_letters(conn: Conn, filters: dict[str, Any], limit: int) -> list[dict[str, Any]]:
    """The dead letters a filter names, oldest first (`dlq list`)."""
    return await fetch_all(
        conn,
        "SELECT delivery_id, webhook_id AS endpoint_id, endpoint_name, endpoint_deleted_at, event_type,"
        " attempts, failure_category, last_http_status, dead_letter_reason, dead_lettered_at"
        " FROM webhooks.delivery_overview"
        + DEAD_LETTERS_MATCHING + DEAD_LETTER_ORDER +
        " LIMIT %(limit)s",
        {**filters, "limit": limit})


async def dead_letters_shown(conn: Conn, filters: dict[str, Any], limit: int) -> list[dict[str, Any]]:
    """The dead letters a filter names, oldest first, as the console's page shows them."""
    return await fetch_all(
        conn,
        "SELECT delivery_id, webhook_id, endpoint_name, endpoint_deleted_at, event_type, attempts, replays,"
        "       failure_category, last_http_status, dead_letter_reason, dead_lettered_at"
        " FROM webhooks.delivery_overview"
        + DEAD_LETTERS_MATCHING + DEAD_LETTER_ORDER +
        " LIMIT %(limit)s",
        {"since": None, "until": None, "webhook_id": None, **filters, "limit": limit})


async def delivery(conn: Conn, delivery_id: int) -> dict[str, Any] | None:
    """A delivery with its payload and its attempts (`attempts_history`), as the API answers it."""
    row = await fetch_one(conn, f"SELECT {DELIVERY_COLUMNS}, payload, source_ref"
                                " FROM webhooks.delivery(%s)", (delivery_id,))
    if row is not None:
        row["attempts_history"] = await fetch_all(
            conn, f"SELECT {ATTEMPT_COLUMNS} FROM webhooks.delivery_history(%s) h", (delivery_id,))
    return row


async def delivery_with_history(conn: Conn, delivery_id: int) -> dict[str, Any] | None:
    """Every column of a delivery, and its attempts (`history`), as the console shows it."""
    row = await fetch_one(conn, "SELECT * FROM webhooks.delivery(%s)", (delivery_id,))
    if row is None:
        return None
    row["history"] = await fetch_all(
        conn, f"SELECT {ATTEMPT_COLUMNS} FROM webhooks.delivery_history(%s) h", (delivery_id,))
    return row


async def find(conn: Conn, delivery_id: int | None, key: str | None) -> list[dict[str, Any]]:
    """The deliveries an id or an idempotency key names, each with its attempts (`deliveries show`)."""
    if delivery_id is not None:
        rows = await fetch_all(conn, "SELECT * FROM webhooks.delivery(%s)", (delivery_id,))
    else:
        rows = await fetch_all(conn, "SELECT * FROM webhooks.delivery_by_key(%s)", (key,))
    for row in rows:
        row["history"] = await fetch_all(
            conn, f"SELECT {_CLI_ATTEMPT_COLUMNS} FROM webhooks.delivery_history(%s) h",
            (row["delivery_id"],))
    return rows


async def status(conn: Conn, delivery_id: int) -> str | None:
    row = await fetch_one(conn, "SELECT status FROM webhooks.delivery(%s)", (delivery_id,))
    return None if row is None else str(row["status"])


async def recent_attempts(conn: Conn, endpoint_id: int, limit: int) -> list[dict[str, Any]]:
    """An endpoint's latest attempts, newest first."""
    return await fetch_all(
        conn, "SELECT delivery_id, attempt, outcome, failure_category, http_status, latency_ms, error,"
              " logged_at FROM webhooks.alert_delivery_log WHERE webhook_id = %s"
              " ORDER BY logged_at DESC LIMIT %s", (endpoint_id, limit))


async def attempt_counts(conn: Conn, bucket: timedelta, failed: Sequence[str], window: timedelta
                         ) -> tuple[datetime, dict[datetime, tuple[int, int]]]:
    """The database's now, and the attempts delivered and failed (outcomes `failed`) in each bucket of
    `bucket` over the `window` before it, of the caller's tenant when it is kept to one."""
    at = await now(conn)
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
        {"bucket": bucket, "failed": list(failed), "now": at, "window": window})
    return at, {r["bucket"]: (int(r["delivered"]), int(r["failed"])) for r in rows}


# --- the queue as a whole ----------------------------------------------------------------------------


async def statistics(conn: Conn) -> dict[str, Any]:
    """The queue by status, and the rows held back by reason (the API's GET /v1/stats)."""
    return {
        "queue": await fetch_all(conn, "SELECT * FROM webhooks.queue_statistics ORDER BY status"),
        "held_back": await held_back(conn),
    }


async def held_back(conn: Conn) -> list[dict[str, Any]]:
    return await fetch_all(conn, "SELECT reason, sum(rows)::bigint AS rows FROM webhooks.held_back"
                                 " WHERE reason IS NOT NULL GROUP BY reason ORDER BY reason")


async def queue_overview(conn: Conn) -> list[dict[str, Any]]:
    """Each status's deliveries and its oldest due row's age (the console's overview)."""
    return await fetch_all(
        conn, "SELECT status, deliveries, oldest_due_age_seconds FROM webhooks.queue_statistics")


async def queue_status(conn: Conn) -> dict[str, Any]:
    """The queue, what is held back, and every endpoint's health (`status`)."""
    return {
        **await statistics(conn),
        "endpoints": await fetch_all(
            conn,
            "SELECT id, name, active, health_status, circuit_state,"
            " consecutive_failures, last_success_at, last_failure_at"
            " FROM webhooks.endpoint_summary ORDER BY id",
        ),
    }


# --- changes ------------------------------------------------------------------------------------------


async def enqueue(conn: Conn, endpoint_id: int, event_type: str, payload: str, key: str | None) -> int:
    cur = await conn.execute("SELECT webhooks.enqueue(%s, %s, %s::jsonb, %s)",
                             (endpoint_id, event_type, payload, key))
    row = await cur.fetchone()
    assert row is not None
    return int(row[0])


async def send_test_event(conn: Conn, endpoint: str | int) -> int:
    """A webhook.test event to this endpoint alone, by id or name (sql/functions/event_types.sql): its
    delivery id. The gate's refusals are raised as the database raises them (NoDataFound: no such
    endpoint for the caller)."""
    cur = await conn.execute("SELECT webhooks.send_test_event(%s)", (str(endpoint),))
    row = await cur.fetchone()
    assert row is not None
    return int(row[0])


async def test_event(conn: Conn, endpoint: str) -> int | None:
    """Queue a 'webhook.test' event to this endpoint alone (its id or name) and return the delivery
    id; None when there is no such endpoint, or it is another tenant's to a session kept to one.
    Raises RefusedTestEvent when the gate refuses it."""
    try:
        async with conn.transaction():
            return await send_test_event(conn, endpoint)
    except psycopg.errors.NoDataFound:
        return None
    except psycopg.Error as exc:
        refusal = refusal_of(exc)
        if refusal is None:
            raise
        raise RefusedTestEvent(refusal) from None


async def replay(conn: Conn, delivery_id: int) -> bool:
    """webhooks.replay(): whether the dead letter was put back."""
    cur = await conn.execute("SELECT webhooks.replay(%s)", (delivery_id,))
    row = await cur.fetchone()
    return bool(row and row[0])


async def replay_many(conn: Conn, delivery_ids: list[int]) -> tuple[int, int]:
    """Replay each delivery with webhooks.replay(), as `dlq replay` does: how many were put back, and
    how many of the others are rows of a deleted endpoint (never sent again). A row another operator
    replayed a moment earlier is no longer a dead letter and is left alone."""
    replayed = of_deleted = 0
    for delivery_id in delivery_ids:
        if await replay(conn, delivery_id):
            replayed += 1
            continue
        cur = await conn.execute("SELECT endpoint_deleted_at IS NOT NULL FROM webhooks.delivery_overview"
                                 " WHERE delivery_id = %s", (delivery_id,))
        row = await cur.fetchone()
        of_deleted += bool(row and row[0])
    return replayed, of_deleted


async def replay_refusal(conn: Conn, delivery_id: int) -> str | None:
    """Why a delivery is not replayed, in words (None: it can be, or the caller does not see it)."""
    cur = await conn.execute("SELECT webhooks.replay_refusal(%s)", (delivery_id,))
    row = await cur.fetchone()
    return None if row is None else row[0]


async def started_before(conn: Conn, until: datetime | None) -> datetime:
    """The bound of a bulk replay starting now: the given `until`, or now (database time) if sooner."""
    cur = await conn.execute("SELECT least(%s::timestamptz, statement_timestamp())", (until,))
    row = await cur.fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


async def replay_batch(conn: Conn, filters: dict[str, Any], limit: int) -> int:
    cur = await conn.execute(
        "SELECT webhooks.replay_dead_letters(%(webhook_id)s, %(event_type)s, %(category)s, %(since)s,"
        " %(until)s, %(limit)s)",
        {**filters, "limit": limit})
    row = await cur.fetchone()
    return 0 if row is None else int(row[0])


PURGE_BATCH_ROWS = 10_000


async def purge(conn: Conn, dead_letters_older_than: str | None, endpoint_id: int | None) -> dict[str, int]:
    """Retention now, in batches of PURGE_BATCH_ROWS (each its own transaction: the connection is in
    autocommit) until a batch finds less than a full one of each kind; then dead letters if asked."""
    row = {"delivered_rows": 0, "log_partitions": 0, "log_rows": 0}
    while True:
        [batch] = await fetch_all(conn, "SELECT * FROM webhooks.purge(%s)", (PURGE_BATCH_ROWS,))
        row = {key: row[key] + int(batch[key]) for key in row}
        if batch["delivered_rows"] < PURGE_BATCH_ROWS and batch["log_rows"] < PURGE_BATCH_ROWS:
            break
    if dead_letters_older_than is not None:
        cur = await conn.execute("SELECT webhooks.purge_dead_letters(%s::interval, %s)",
                                 (dead_letters_older_than, endpoint_id))
        dead = await cur.fetchone()
        row["dead_letters"] = 0 if dead is None else int(dead[0])
    return row


# --- the demo ------------------------------------------------------------------------------------------


async def insert_sample_alerts(conn: Conn, endpoint_id: int, count: int, severities: Sequence[str]
                               ) -> list[int]:
    """Queue sample alerts with a plain INSERT, as any application may (three severities in turn);
    their delivery ids."""
    cur = await conn.execute(
        "INSERT INTO webhooks.alert_delivery_queue (webhook_id, event_type, payload, source_ref)"
        " SELECT %s, 'alert.created',"
        "        jsonb_build_object('alert_id', n, 'title', 'Disk almost full on db-' || n,"
        "                           'severity', (%s::text[])[1 + n %% 3]),"
        "        'alerts:' || n"
        " FROM generate_series(1, %s) AS n RETURNING delivery_id",
        (endpoint_id, list(severities), count))
    return [int(row[0]) for row in await cur.fetchall()]


async def final_counts(conn: Conn, delivery_ids: Sequence[int]) -> dict[str, int]:
    """How many of these deliveries ended ('final': delivered or dead letter), and were delivered."""
    [row] = await fetch_all(
        conn,
        "SELECT count(*) FILTER (WHERE status IN ('delivered', 'dead_letter')) AS final,"
        " count(*) FILTER (WHERE status = 'delivered') AS delivered"
        " FROM webhooks.alert_delivery_queue WHERE delivery_id = ANY(%s)",
        (list(delivery_ids),))
    return {name: int(value) for name, value in row.items()}


async def demo_report(conn: Conn, delivery_ids: Sequence[int], endpoint_id: int
                      ) -> list[tuple[str, list[str], list[tuple[Any, ...]]]]:
    """The demo's deliveries as the tables hold them: queue rows, audit rows, the endpoint's health."""
    ids = list(delivery_ids)
    queries = (
        ("webhooks.alert_delivery_queue",
         "SELECT delivery_id, status, attempts, event_type, idempotency_key, delivered_at"
         " FROM webhooks.alert_delivery_queue WHERE delivery_id = ANY(%s) ORDER BY 1", ids),
        ("webhooks.alert_delivery_log (the audit log)",
         "SELECT delivery_id, attempt, outcome, failure_category, http_status, latency_ms,"
         " worker_id FROM webhooks.alert_delivery_log WHERE delivery_id = ANY(%s)"
         " ORDER BY log_id", ids),
        ("webhooks.webhook_health_metrics",
         "SELECT webhook_id, total_attempts, successes, failures, health_status,"
         " round(avg_latency_ms::numeric, 1) AS avg_latency_ms"
         " FROM webhooks.webhook_health_metrics WHERE webhook_id = %s", endpoint_id),
    )
    report = []
    for title, query, param in queries:
        cur = await conn.execute(query, (param,))
        report.append((title, [d.name for d in cur.description or []], await cur.fetchall()))
    return report
