"""API tokens and console sessions as stored: created, revoked and listed by the operator; a token's
or a session's caller asked of the database on every request, so a revocation holds at once."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from worker.rules import portal
from worker.rules.tokens import ROLES, Caller, generate_token, scope_problem, token_hash, well_formed
from worker.store.database import Conn, fetch_all


async def create(conn: Conn, name: str, role: str, expires_at: datetime | None,
                 tenant: str | None = None) -> str:
    """Store a new token's hash under its name and return the token (shown once, never stored);
    with a tenant (its name), the token sees and changes only that tenant's rows. A role and tenant
    that do not go together (scope_problem()) raise ValueError naming the tenant."""
    problem = scope_problem(role, tenant)
    if problem is not None:
        raise ValueError(f"tenant: {problem}")
    token = generate_token()
    await conn.execute("SELECT webhooks.api_create_token(%s, %s, %s, %s, %s)",
                       (name, role, token_hash(token), expires_at, tenant))
    return token


async def revoke(conn: Conn, name: str) -> bool:
    cur = await conn.execute("SELECT webhooks.api_revoke_token(%s)", (name,))
    row = await cur.fetchone()
    return bool(row and row[0])


async def listing(conn: Conn) -> list[dict[str, Any]]:
    return await fetch_all(conn, "SELECT * FROM webhooks.api_token_list()")


def _caller(row: Any) -> Caller | None:
    if row is None:
        return None
    name, role, tenant_id = row
    assert role in ROLES
    return Caller(str(name), role, None if tenant_id is None else int(tenant_id))


async def verify(conn: Conn, token: str) -> Caller | None:
    """The caller a token stands for, or None for a malformed, unknown, revoked or expired one. The
    database answers every time, so a revocation takes effect on the next request."""
    if not well_formed(token):
        return None
    cur = await conn.execute("SELECT name, role, tenant_id FROM webhooks.api_token_role(%s)",
                             (token_hash(token),))
    return _caller(await cur.fetchone())


# --- console sessions (a random id in an HttpOnly cookie, its hash stored beside the token's) -------


async def start_session(conn: Conn, session_hash: bytes, token: str, lifetime: timedelta) -> Caller | None:
    """Open a session for a token; None when the token stopped being usable meanwhile."""
    cur = await conn.execute("SELECT name, role, tenant_id FROM webhooks.console_start_session(%s, %s, %s)",
                             (session_hash, token_hash(token), lifetime))
    return _caller(await cur.fetchone())


async def session_caller(conn: Conn, session_hash: bytes) -> Caller | None:
    """Who holds a session, asked of the database on every request so that a revoked token stops at once."""
    cur = await conn.execute("SELECT name, role, tenant_id FROM webhooks.console_session(%s)",
                             (session_hash,))
    return _caller(await cur.fetchone())


async def end_session(conn: Conn, session_hash: bytes) -> None:
    await conn.execute("SELECT webhooks.console_end_session(%s)", (session_hash,))


async def open_portal_link(conn: Conn, link: str, session_hash: bytes) -> Caller | None:
    """Open the session a portal link stands for, using the link up; None for a malformed, unknown,
    used, expired or revoked one."""
    if not portal.well_formed(link):
        return None
    cur = await conn.execute("SELECT name, role, tenant_id FROM webhooks.console_open_portal_link(%s, %s)",
                             (portal.link_hash(link), session_hash))
    return _caller(await cur.fetchone())
