"""The event-type catalogue as stored: its entries read and written (checked first by the
catalogue's rules, worker.rules.event_types), the subscriptions matching each type, and the subscriptions
no current type matches."""

from __future__ import annotations

import json
from typing import Any

from worker.rules.event_types import (
    MAX_DESCRIPTION_CHARS,
    EventType,
    EventTypeError,
    from_row,
    name_problem,
    reserved_problem,
    schema_problem,
)
from worker.store.database import Conn, fetch_all, fetch_one

_COLUMNS = "name, description, schema, deprecated"


async def get(conn: Conn, name: str) -> EventType | None:
    row = await fetch_one(conn, f"SELECT {_COLUMNS} FROM webhooks.event_type(%s)", (name,))
    return None if row is None else from_row(row)


async def listing(conn: Conn, include_deprecated: bool = True) -> list[EventType]:
    rows = await fetch_all(conn, f"SELECT {_COLUMNS} FROM webhooks.event_type_list(%s)",
                           (include_deprecated,))
    return [from_row(row) for row in rows]


async def rows(conn: Conn) -> list[dict[str, Any]]:
    """The catalogue as the API lists it, with when each entry was made and changed."""
    return await fetch_all(conn, "SELECT name, description, schema, deprecated, created_at, updated_at"
                                 " FROM webhooks.event_type_list()")


async def upsert(conn: Conn, name: str, description: str = "", schema: Any | None = None,
                 deprecated: bool | None = None) -> bool:
    """Add a type or replace its description and schema; whether it is new. A name, description
    or schema that breaks a rule raises EventTypeError naming the field, and nothing is written."""
    problem = name_problem(name)
    if problem is not None:
        raise EventTypeError(f"name: {problem}")
    if len(description) > MAX_DESCRIPTION_CHARS:
        raise EventTypeError(f"description: at most {MAX_DESCRIPTION_CHARS} characters")
    if schema is not None:
        problem = schema_problem(schema)
        if problem is not None:
            raise EventTypeError(f"schema: {problem}")
    cur = await conn.execute("SELECT webhooks.upsert_event_type(%s, %s, %s::jsonb, %s)",
                             (name, description, None if schema is None else json.dumps(schema), deprecated))
    row = await cur.fetchone()
    assert row is not None
    return bool(row[0])


async def deprecate(conn: Conn, name: str, deprecated: bool = True) -> bool:
    """Mark a type deprecated (or current again); whether it exists."""
    if (problem := reserved_problem(name)) is not None:
        raise EventTypeError(f"name: {problem}")
    cur = await conn.execute("SELECT webhooks.deprecate_event_type(%s, %s)", (name, deprecated))
    row = await cur.fetchone()
    return bool(row and row[0])


async def unmatched_subscriptions(conn: Conn) -> list[dict[str, Any]]:
    """Each endpoint's subscription pattern that no catalogued type matches ('unknown') or only
    deprecated ones do ('deprecated'), for the caller's tenant if it is kept to one."""
    return await fetch_all(conn, "SELECT webhook_id, endpoint_name, pattern, problem"
                                 " FROM webhooks.unmatched_subscriptions()")


async def subscriptions(conn: Conn, event_type: str, limit: int) -> list[dict[str, Any]]:
    """The endpoint subscriptions that match a type (sql/functions/event_types.sql), by endpoint name."""
    return await fetch_all(
        conn, "SELECT webhook_id, endpoint_name, pattern FROM webhooks.event_type_subscriptions(%s) LIMIT %s",
        (event_type, limit))


async def subscriptions_by_type(conn: Conn, shown: int) -> dict[str, dict[str, Any]]:
    """For each type some subscription matches: how many do, and the first `shown`."""
    found = await fetch_all(
        conn,
        "SELECT event_type, count(*) AS total,"
        "       jsonb_agg(jsonb_build_object('webhook_id', webhook_id, 'endpoint_name', endpoint_name,"
        "                                    'pattern', pattern) ORDER BY n) FILTER (WHERE n <= %s) AS shown"
        " FROM (SELECT s.*, row_number() OVER (PARTITION BY s.event_type ORDER BY s.endpoint_name, s.pattern)"
        "       AS n FROM webhooks.event_type_subscriptions() s) s"
        " GROUP BY event_type", (shown,))
    return {row["event_type"]: row for row in found}
