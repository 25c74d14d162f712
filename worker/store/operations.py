"""Bulk operations (dead-letter replays started over the API or the console, table-trigger backfills) as
stored: started, listed, read, cancelled, and stepped by every API process until done."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from psycopg.types.json import Jsonb

from worker.rules.tokens import database_role
from worker.store.database import Conn, fetch_all, fetch_one, set_local_role

# Operations are admin requests carried on: each step runs as webhooks_admin, which is granted the
# operation functions; the API's login itself is not.
RUNS_AS = database_role("admin")


async def start_replay(conn: Conn, filters: dict[str, Any], rate: float | None, max_rows: int | None,
                       requested_by: str) -> int:
    """A bulk replay of the dead letters matching `filters`: its operation's id."""
    stored = {key: (value.isoformat() if isinstance(value, datetime) else value)
              for key, value in filters.items() if value is not None}
    row = await fetch_one(conn, "SELECT webhooks.api_start_replay(%s, %s, %s, %s) AS id",
                          (Jsonb(stored), rate, max_rows, requested_by))
    assert row is not None
    return int(row["id"])


async def cancel(conn: Conn, operation_id: int, cancelled_by: str) -> str | None:
    """Stop a running operation; its status after ('cancelled' once stopped), None if there is none."""
    cur = await conn.execute("SELECT webhooks.api_cancel_operation(%s, %s)", (operation_id, cancelled_by))
    row = await cur.fetchone()
    return None if row is None else row[0]


async def operation(conn: Conn, operation_id: int) -> dict[str, Any] | None:
    return await fetch_one(
        conn, "SELECT id, kind, filter, rate, max_rows AS max, status, processed, requested_by, cancelled_by,"
              " error, created_at, updated_at, finished_at FROM webhooks.api_operations WHERE id = %s",
        (operation_id,))


async def latest(conn: Conn, limit: int) -> list[dict[str, Any]]:
    """The latest operations, newest first (`dlq operations`)."""
    return await fetch_all(
        conn, "SELECT id, kind, status, processed, max_rows, rate, requested_by, cancelled_by, created_at,"
              " finished_at FROM webhooks.api_operations ORDER BY id DESC LIMIT %s", (limit,))


async def latest_with_endpoints(conn: Conn, limit: int) -> list[dict[str, Any]]:
    """The latest operations, newest first (row-level security keeps a scoped caller to its tenant's),
    each with the name of the endpoint its filter names, when the caller sees it."""
    return await fetch_all(
        conn, "SELECT o.id, o.kind, o.status, o.processed, o.max_rows, o.rate, o.filter, o.requested_by,"
              " o.cancelled_by, o.error, o.created_at, o.finished_at, e.name AS endpoint_name"
              " FROM webhooks.api_operations o"
              " LEFT JOIN webhooks.endpoint_summary e ON e.id = CASE"
              "     WHEN jsonb_typeof(o.filter -> 'webhook_id') = 'number'"
              "     THEN (o.filter ->> 'webhook_id')::bigint END"
              " ORDER BY o.id DESC LIMIT %s", (limit,))


# --- stepping: each statement in a transaction of its own under webhooks_admin -----------------------


async def _as_admin(conn: Conn, statement: str, params: Any = None) -> list[tuple[Any, ...]]:
    async with conn.transaction():
        await set_local_role(conn, RUNS_AS)
        cur = await conn.execute(statement, params)
        return await cur.fetchall()


async def running(conn: Conn) -> list[tuple[Any, ...]]:
    """The operations still running: (id, rate) each."""
    return await _as_admin(conn, "SELECT id, rate FROM webhooks.api_running_operations()")


async def step(conn: Conn, operation_id: int, rows: int) -> tuple[Any, ...] | None:
    """One step of up to `rows` rows: (status, processed), or None while another session steps it."""
    stepped = await _as_admin(conn, "SELECT status, processed FROM webhooks.api_replay_step(%s, %s)",
                              (operation_id, rows))
    return stepped[0] if stepped else None


async def fail(conn: Conn, operation_id: int, error: str) -> None:
    """End an operation that cannot go on as failed, with why."""
    await _as_admin(conn, "SELECT webhooks.api_fail_operation(%s, %s)", (operation_id, error))
