"""Connections: the API's pool and its transactions under the caller's database role and tenant
(as_caller, the one place that sets them), the CLI's connection, and the rows-as-dicts helpers every
store module reads with."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from worker.rules.tokens import ROLES, Caller, database_role

Conn = psycopg.AsyncConnection[Any]
# What the API's login rests as between requests: token and session checks, the schema version.
AUTHENTICATOR_ROLE = "webhooks_authenticator"
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


async def _rest_as_authenticator(conn: psycopg.AsyncConnection[Any]) -> None:
    """Each new connection rests as webhooks_authenticator, so whatever runs outside a caller's
    transaction holds only the token and session checks, whatever the login inherits; a
    transaction's SET LOCAL ROLE switches from there (membership is the login's, not the current
    role's). A login that is not a member (an older schema, a missing grant) stays itself: the
    start-up check says so."""
    await conn.execute(
        "SELECT set_config('role', r.rolname, false) FROM pg_roles r"
        " WHERE r.rolname = %s AND pg_has_role(session_user, r.oid, 'MEMBER')", (AUTHENTICATOR_ROLE,))


# Each a problem with the login the API runs as: more rights than it needs, or a group role it
# cannot switch to. Rows: (problem, whether it is a missing right rather than one too many).
_LOGIN_CHECKS = """
    SELECT format('the login %%I is the schema owner%%s: every table and function is its to change, and it'
                  ' bypasses row-level security', session_user,
                  CASE WHEN n.nspowner <> l.oid THEN format(' (it is a member of %%I)', n.nspowner::regrole)
                  ELSE '' END), false
    FROM pg_roles l, pg_namespace n
    WHERE l.rolname = session_user AND n.nspname = 'webhooks' AND NOT l.rolsuper
      AND pg_has_role(l.oid, n.nspowner, 'MEMBER')
    UNION ALL
    SELECT format('the login %%I is a superuser', session_user), false
    FROM pg_roles l WHERE l.rolname = session_user AND l.rolsuper
    UNION ALL
    SELECT format('the login %%I has CREATEROLE: it can grant itself pg_execute_server_program and run'
                  ' programs as the database server''s OS user', session_user), false
    FROM pg_roles l WHERE l.rolname = session_user AND l.rolcreaterole AND NOT l.rolsuper
    UNION ALL
    SELECT format('the login %%I is not a member of %%s: GRANT %%s TO %%I', session_user, g.name, g.name,
                  session_user), true
    FROM unnest(%(groups)s::text[]) g(name)
    WHERE NOT coalesce(pg_has_role(session_user, to_regrole(g.name), 'MEMBER'), false)
"""


# Admin rights are what webhooks_admin is granted: the API's login is neither the schema owner nor
# able to create roles (sql/migrations/007_api_login.sql).
API_GROUPS = (AUTHENTICATOR_ROLE, *(database_role(role) for role in ROLES))


async def login_problems(conn: psycopg.AsyncConnection[Any], groups: tuple[str, ...] = API_GROUPS
                         ) -> list[tuple[str, bool]] | None:
    """What is wrong with the API's login: (problem, missing) pairs, missing meaning a group role it
    cannot switch to (those requests fail), else a right it should not hold. None while a group
    role does not exist yet (the database is not migrated: /ready says so), so as not to blame
    the login for it."""
    cur = await conn.execute("SELECT bool_and(to_regrole(g) IS NOT NULL) FROM unnest(%s::text[]) g",
                             (list(groups),))
    row = await cur.fetchone()
    if row is None or not row[0]:
        return None
    cur = await conn.execute(_LOGIN_CHECKS, {"groups": list(groups)})
    return [(str(problem), bool(missing)) for problem, missing in await cur.fetchall()]


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
            configure=_rest_as_authenticator,
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
        """A connection resting as webhooks_authenticator, for token and session checks and probes
        (autocommit)."""
        async with self._pooled(wait) as conn:
            yield conn

    @asynccontextmanager
    async def transaction(self, caller: Caller) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """One transaction under the caller's database role; SET LOCAL ends with it, so the pooled
        connection goes back resting as webhooks_authenticator."""
        async with self._pooled() as conn, conn.transaction():
            await as_caller(conn, caller)
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


# For the rest of a transaction: row-level security and the views keep to this tenant (its id).
TENANT_SETTING = "SELECT set_config('webhooks.tenant', %s, true)"


async def as_caller(conn: Conn, caller: Caller) -> None:
    """The rest of the transaction open on `conn` runs as the caller: its token role's group role,
    and its tenant when it has one, so PostgreSQL's grants and row-level security, not only our
    checks, keep it to what it may do."""
    await set_local_role(conn, database_role(caller.role))
    if caller.tenant_id is not None:
        await conn.execute(TENANT_SETTING, (str(caller.tenant_id),))


def local_role(role: str) -> psycopg.sql.Composed:
    """The statement after which the rest of a transaction runs as `role`."""
    return psycopg.sql.SQL("SET LOCAL ROLE {}").format(psycopg.sql.Identifier(role))


async def set_local_role(conn: Conn, role: str) -> None:
    await conn.execute(local_role(role))


@asynccontextmanager
async def connect(url: str, application_name: str = "webhook-worker") -> AsyncIterator[Conn]:
    """One connection for an operator command (the CLI, the demo), in autocommit: each call is its own
    transaction unless it opens one."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True,
                                                     application_name=application_name) as conn:
        yield conn


async def schema_version(conn: Conn) -> int | None:
    """The schema's version as the database reports it (webhooks.schema_version()), for /ready."""
    cur = await conn.execute("SELECT webhooks.schema_version()")
    row = await cur.fetchone()
    return None if row is None else row[0]


async def fetch_all(conn: psycopg.AsyncConnection[Any], sql: str, params: Any = None) -> list[dict[str, Any]]:
    cur = conn.cursor(row_factory=dict_row)
    await cur.execute(sql, params)  # every caller passes a literal statement
    return await cur.fetchall()


async def fetch_one(
    conn: psycopg.AsyncConnection[Any], sql: str, params: Any = None
) -> dict[str, Any] | None:
    rows = await fetch_all(conn, sql, params)
    return rows[0] if rows else None
