"""Tenants as stored: added, changed, listed and shown with their limits and granted networks; a
session or a transaction kept to one; portal links made for a tenant's administrator."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from psycopg.types.json import Jsonb

from worker.rules import portal
from worker.rules.tenants import SUMMARY_COLUMNS, stored
from worker.store.database import TENANT_SETTING, Conn, fetch_all, fetch_one

TENANT_COLUMNS = ", ".join(SUMMARY_COLUMNS)


async def add(conn: Conn, name: str, limits: dict[str, Any]) -> int:
    """A new tenant with these limits (checked first: worker.rules.tenants); its id."""
    cur = await conn.execute("SELECT webhooks.register_tenant(%s, %s)", (name, Jsonb(stored(limits))))
    row = await cur.fetchone()
    assert row is not None
    return int(row[0])


async def update(conn: Conn, name: str, limits: dict[str, Any]) -> int:
    """Change a tenant's limits (NoDataFound: no such tenant); its id."""
    cur = await conn.execute("SELECT webhooks.update_tenant(%s, %s)", (name, Jsonb(stored(limits))))
    row = await cur.fetchone()
    assert row is not None
    return int(row[0])


async def listing(conn: Conn) -> list[dict[str, Any]]:
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


async def named(conn: Conn, name: str) -> dict[str, Any] | None:
    """A tenant by its name alone (`tenants show`)."""
    return await fetch_one(conn, f"SELECT {TENANT_COLUMNS} FROM webhooks.tenant_summary WHERE name = %s",
                           (name,))


async def tenant_id(conn: Conn, name: str) -> int | None:
    """A tenant's id by its name, as the caller sees the tenants (a scoped caller: its own only)."""
    row = await fetch_one(conn, "SELECT id FROM webhooks.tenant_summary WHERE name = %s", (name,))
    return None if row is None else int(row["id"])


async def tenant_name(conn: Conn, tenant_id: int) -> str:
    """The name of the tenant a session is kept to (its id when the tenant cannot be read)."""
    row = await fetch_one(conn, "SELECT name FROM webhooks.tenant_summary WHERE id = %s", (tenant_id,))
    return str(tenant_id) if row is None else str(row["name"])


async def keep_to(conn: Conn, tenant_id: int) -> None:
    """For the rest of the transaction, see that tenant's rows only, as a token kept to it would
    (row-level security and the views)."""
    await conn.execute(TENANT_SETTING, (str(tenant_id),))


async def keep_session_to(conn: Conn, name: str) -> None:
    """Keep this session to one tenant, as a scoped API token is kept: the views and
    replay_dead_letters() then see only its rows. An unknown name raises NoDataFound."""
    await conn.execute("SELECT set_config('webhooks.tenant', webhooks.tenant_id(%s)::text, false)", (name,))


async def create_portal_link(conn: Conn, tenant: str, lifetime: timedelta, base: str) -> portal.PortalLink:
    """A new one-time link to the console under `base` for the tenant named (NoDataFound: no such
    tenant); the link's secret is in its URL only, never stored."""
    secret = portal.new_secret()
    cur = await conn.execute(
        "SELECT token_name, tenant, expires_at FROM webhooks.create_portal_link(%s, %s, %s, %s)",
        (tenant, *portal.hashes(secret), lifetime))
    row = await cur.fetchone()
    assert row is not None
    return portal.PortalLink(portal.url(base, secret), str(row[1]), str(row[0]), row[2])
