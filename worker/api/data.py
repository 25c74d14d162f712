"""The API's database handle: an async pool, and transactions under the caller's database role."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from worker.api.tokens import Caller, Role

# The group role each token role runs as; admin keeps the API's own login (the schema owner's
# privileges), as the operator CLI does. The grants then enforce what the API checks
# (sql/functions/roles.sql).
DATABASE_ROLES: dict[Role, str | None] = {
    "producer": "webhooks_producer",
    "reader": "webhooks_reader",
    "admin": None,
}
APPLICATION_NAME = "webhook-worker api"


class Database:
    def __init__(self, pool: AsyncConnectionPool) -> None:
        self.pool = pool

    @classmethod
    def create(cls, conninfo: str, min_size: int, max_size: int, connect_timeout: float) -> Database:
        return cls(AsyncConnectionPool(
            conninfo, min_size=min_size, max_size=max_size, open=False, timeout=connect_timeout,
            reconnect_timeout=5.0, name="webhook-worker-api",
            kwargs={"autocommit": True, "application_name": APPLICATION_NAME,
                    "connect_timeout": max(1, int(connect_timeout))},
        ))

    async def open(self) -> None:
        # wait=False: the API starts (and says it is not ready) while the database is unreachable.
        await self.pool.open(wait=False)

    async def close(self) -> None:
        await self.pool.close()

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """A connection as the API's own login, for token checks and probes (autocommit)."""
        async with self.pool.connection() as conn:
            yield conn

    @asynccontextmanager
    async def transaction(self, caller: Caller) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """One transaction under the caller's database role; SET LOCAL ends with it, so the pooled
        connection goes back as the API's login."""
        async with self.pool.connection() as conn, conn.transaction():
            role = DATABASE_ROLES[caller.role]
            if role is not None:
                await conn.execute(psycopg.sql.SQL("SET LOCAL ROLE {}").format(psycopg.sql.Identifier(role)))
            if caller.tenant_id is not None:
                # for this transaction only: row-level security and the views keep to this tenant
                await conn.execute("SELECT set_config('webhooks.tenant', %s, true)", (str(caller.tenant_id),))
            yield conn


async def fetch_all(conn: psycopg.AsyncConnection[Any], sql: str, params: Any = None) -> list[dict[str, Any]]:
    cur = conn.cursor(row_factory=dict_row)
    await cur.execute(sql, params)  # every caller passes a literal statement
    return await cur.fetchall()


async def fetch_one(
    conn: psycopg.AsyncConnection[Any], sql: str, params: Any = None
) -> dict[str, Any] | None:
    rows = await fetch_all(conn, sql, params)
    return rows[0] if rows else None
