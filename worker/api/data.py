"""The API's database handle: an async pool, and transactions under the caller's database role."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool, PoolTimeout

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
# While the database is known to be unreachable, a request answers 503 at once rather than wait the
# pool's timeout for a connection that will not come; one request this often tries it again, and
# waits at most this long for a connection.
RETRY_DOWN_SECONDS = 1.0
# /ready answers within a probe's usual 1 s timeout.
READY_TIMEOUT_SECONDS = 0.8


class DatabaseUnavailable(psycopg.OperationalError):
    """The database failed the last connection and is not tried again yet: answered as the
    OperationalError it stands for (503 with Retry-After), without waiting."""


class Database:
    def __init__(self, pool: AsyncConnectionPool) -> None:
        self.pool = pool
        # monotonic time before which the database is known to be down (0: not known to be)
        self._down_until = 0.0

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
    async def _pooled(self, wait: float | None = None) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """A pooled connection, waiting at most `wait` (default: the pool's timeout) for one; raises
        DatabaseUnavailable at once while the database is known to be down, except for one request a
        RETRY_DOWN_SECONDS, which tries it with a short wait."""
        now = time.monotonic()
        if self._down_until:
            if now < self._down_until:
                raise DatabaseUnavailable("the database is unreachable (it failed a moment ago)")
            self._down_until = now + RETRY_DOWN_SECONDS  # this request tries; the others need not
            wait = min(wait or RETRY_DOWN_SECONDS, RETRY_DOWN_SECONDS)
        try:
            async with self.pool.connection(timeout=wait) as conn:
                self._down_until = 0.0
                yield conn
        except (psycopg.OperationalError, PoolTimeout) as exc:
            if _unreachable(exc):
                self._down_until = time.monotonic() + RETRY_DOWN_SECONDS
            raise

    @asynccontextmanager
    async def connection(self, wait: float | None = None) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """A connection as the API's own login, for token checks and probes (autocommit)."""
        async with self._pooled(wait) as conn:
            yield conn

    @asynccontextmanager
    async def transaction(self, caller: Caller) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """One transaction under the caller's database role; SET LOCAL ends with it, so the pooled
        connection goes back as the API's login."""
        async with self._pooled() as conn, conn.transaction():
            role = DATABASE_ROLES[caller.role]
            if role is not None:
                await conn.execute(psycopg.sql.SQL("SET LOCAL ROLE {}").format(psycopg.sql.Identifier(role)))
            if caller.tenant_id is not None:
                # for this transaction only: row-level security and the views keep to this tenant
                await conn.execute("SELECT set_config('webhooks.tenant', %s, true)", (str(caller.tenant_id),))
            yield conn


def _unreachable(exc: Exception) -> bool:
    """Whether an error says the database cannot be reached (no connection came, the connection was
    lost, the server is shutting down or starting), not that one statement failed (a cancel, a
    lock timeout: OperationalErrors too)."""
    if isinstance(exc, DatabaseUnavailable):
        return False  # already known
    if isinstance(exc, PoolTimeout):
        return True
    sqlstate = getattr(exc, "sqlstate", None)
    return sqlstate is None or sqlstate.startswith(("08", "57P"))


async def fetch_all(conn: psycopg.AsyncConnection[Any], sql: str, params: Any = None) -> list[dict[str, Any]]:
    cur = conn.cursor(row_factory=dict_row)
    await cur.execute(sql, params)  # every caller passes a literal statement
    return await cur.fetchall()


async def fetch_one(
    conn: psycopg.AsyncConnection[Any], sql: str, params: Any = None
) -> dict[str, Any] | None:
    rows = await fetch_all(conn, sql, params)
    return rows[0] if rows else None
