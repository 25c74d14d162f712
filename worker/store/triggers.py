"""Table triggers as stored (sql/functions/triggers.sql): added, listed, shown, disabled, enabled,
dropped, backfilled (a bulk operation, stepped as the API's runner steps one) and invoked."""

from __future__ import annotations

from typing import Any

from worker.store.database import Conn, fetch_all, fetch_one

# What `triggers list`, GET /v1/triggers and the console show of each (webhooks.table_trigger_summary).
SUMMARY_COLUMNS = ("name, table_name, ops, event_type, columns, exclude_columns, when_condition, tenant,"
                   " tenant_column, enabled, state, deliveries_last_hour, backfill_id, backfill_status,"
                   " backfill_processed, backfill_scanned, backfill_total_estimate, created_by, created_at,"
                   " updated_at")
# The ops a trigger fires on, in the order they are shown.
OPS = ("insert", "update", "delete")


async def add(conn: Conn, name: str, table: str, on: list[str], event_type: str, *,
              columns: list[str] | None = None, exclude_columns: list[str] | None = None,
              when: str | None = None, tenant: str | None = None,
              tenant_column: str | None = None) -> tuple[int, list[str]]:
    """Register a table trigger and install its PostgreSQL triggers with the caller's own rights
    (the table's owner, or its TRIGGER privilege): the registration's id, and the notices PostgreSQL
    sent (a partitioned table's: a statement naming a partition fires nothing)."""
    notices: list[str] = []

    def keep(diagnostic: Any) -> None:
        notices.append(str(diagnostic.message_primary))

    conn.add_notice_handler(keep)
    try:
        row = await fetch_one(
            conn, "SELECT webhooks.table_trigger_add(%s, %s, %s, %s, %s, %s, %s, %s, %s) AS id",
            (name, table, on, event_type, columns, exclude_columns, when, tenant, tenant_column))
    finally:
        conn.remove_notice_handler(keep)
    assert row is not None
    return int(row["id"]), notices


def _in_order(row: dict[str, Any]) -> dict[str, Any]:
    """A summary with its ops as OPS orders them (stored, they are sorted by name)."""
    return {**row, "ops": sorted(row["ops"], key=OPS.index)}


async def listing(conn: Conn) -> list[dict[str, Any]]:
    """Every table trigger the caller sees (a session kept to a tenant: its tenant's), by name."""
    return [_in_order(row) for row in await fetch_all(
        conn, f"SELECT {SUMMARY_COLUMNS} FROM webhooks.table_trigger_list()")]


async def show(conn: Conn, name: str) -> dict[str, Any]:
    """One table trigger; psycopg.errors.NoDataFound when the caller sees none of that name."""
    row = await fetch_one(conn, f"SELECT {SUMMARY_COLUMNS} FROM webhooks.table_trigger_show(%s)", (name,))
    assert row is not None  # table_trigger_show() raises rather than answer nothing
    return _in_order(row)


async def set_enabled(conn: Conn, name: str, enabled: bool) -> bool:
    """Enable or disable a trigger: whether that changed anything (NoDataFound: no such trigger)."""
    function = "table_trigger_enable" if enabled else "table_trigger_disable"
    row = await fetch_one(conn, f"SELECT webhooks.{function}(%s) AS changed", (name,))
    return bool(row and row["changed"])


async def drop(conn: Conn, name: str) -> tuple[bool, list[str]]:
    """Drop the registration (and its PostgreSQL triggers when the caller owns the table): whether the
    PostgreSQL triggers went, and the notices PostgreSQL sent (what the table's owner should run when
    they stayed)."""
    notices: list[str] = []

    def keep(diagnostic: Any) -> None:
        notices.append(str(diagnostic.message_primary))

    conn.add_notice_handler(keep)
    try:
        row = await fetch_one(conn, "SELECT webhooks.table_trigger_drop(%s) AS gone", (name,))
    finally:
        conn.remove_notice_handler(keep)
    return bool(row and row["gone"]), notices


async def start_backfill(conn: Conn, name: str, where: str | None, rate: float | None) -> int:
    """A backfill of the trigger's table (rows meeting `where` too, when given), `rate` rows a second:
    its operation's id. psycopg.errors.ObjectInUse when one of this trigger is running."""
    row = await fetch_one(conn, "SELECT webhooks.table_trigger_backfill(%s, %s, %s) AS id",
                          (name, where, rate))
    assert row is not None
    return int(row["id"])


async def running_backfill(conn: Conn, name: str) -> dict[str, Any] | None:
    """The trigger's backfill that is still running (id, rate, where), if there is one."""
    return await fetch_one(
        conn, "SELECT o.id, o.rate, o.filter ->> 'where' AS where FROM webhooks.api_operations o"
              " WHERE o.kind = 'trigger_backfill' AND o.status = 'running' AND o.filter ->> 'trigger' = %s"
              " ORDER BY o.id DESC LIMIT 1", (name,))


async def backfill_progress(conn: Conn, operation_id: int) -> dict[str, Any] | None:
    """A backfill's state: status, rows queued (processed) and read (scanned) so far, the table's
    estimated rows, who cancelled it or why it failed, and how long until its next step is due."""
    return await fetch_one(
        conn, "SELECT id, status, processed, scanned, total_estimate, rate, cancelled_by, error,"
              " greatest(0, extract(epoch FROM next_step_at - now()))::float8 AS due_in_seconds"
              " FROM webhooks.api_operations WHERE id = %s AND kind = 'trigger_backfill'", (operation_id,))


async def invoke(conn: Conn, name: str, key: str) -> int:
    """Queue the row of that primary key now, as op manual: the deliveries it made."""
    row = await fetch_one(conn, "SELECT webhooks.table_trigger_invoke(%s, %s) AS made", (name, key))
    assert row is not None
    return int(row["made"])


async def step_backfill(conn: Conn, operation_id: int, rows: int) -> tuple[str, int] | None:
    """One step of up to `rows` rows of a running backfill, with the caller's own rights, as the API's
    runner steps it (the two may step the same one: a step locks it): (status, rows queued so far),
    or None when it is not running, another session is stepping it, or its next step is not due."""
    row = await fetch_one(conn, "SELECT status, processed FROM webhooks.api_replay_step(%s, %s)",
                          (operation_id, rows))
    return None if row is None else (str(row["status"]), int(row["processed"]))


async def fail_backfill(conn: Conn, operation_id: int, error: str) -> None:
    """End a backfill that cannot go on as failed, with why (as the API's runner ends one)."""
    await conn.execute("SELECT webhooks.api_fail_operation(%s, %s)", (operation_id, error))
