"""The tests' helper library: rows, their states and the waits on them, logins. Worker processes,
endpoints, keys and the general waits come from bench/localworker.py, the one copy the benchmark
uses too, and are re-exported here."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import psycopg

from bench.localworker import (
    HANG_SECONDS,
    LOGIN_PASSWORD,
    LOOPBACK,
    ROOT,
    STALL_SECONDS,
    TEST_TIMINGS,
    WORKER_LOGIN,
    WorkerProcess,
    add_endpoint,
    add_endpoints,
    eventually,
    login_as,
    proc_cpu,
    query,
    wait_started,
    worker_config,
    worker_dsn,
    worker_env,
)
from bench.localworker import KEYRING as TEST_KEYRING
from bench.localworker import KEYS as TEST_KEYS
from bench.localworker import stored as stored  # the tests call the store through it
from worker.config import DatabaseConfig
from worker.localpg import login_role, role_dsn
from worker.store.database import API_GROUPS

T = TypeVar("T")

__all__ = [
    "API_LOGIN", "CONNECT_TIMEOUT_SECONDS", "HANG_SECONDS", "LOGIN_PASSWORD", "LOOPBACK", "PRODUCER_LOGIN",
    "READER_LOGIN", "ROOT", "SECONDS_PER_ROW", "STALL_SECONDS", "TEST_KEYRING", "TEST_KEYS", "TEST_TIMINGS",
    "WORKER_LOGIN", "WorkerProcess", "add_endpoint", "add_endpoints", "all_final", "api_dsn",
    "drain_progress", "enqueue", "eventually", "login_as", "login_dsn", "proc_cpu", "query", "statuses",
    "wait_final", "wait_started", "worker_config", "worker_dsn", "worker_env",
]

PRODUCER_LOGIN = "webhooks_test_producer"
READER_LOGIN = "webhooks_test_reader"
# The API's own login, as docs/security.md makes it: no ownership, no CREATEROLE, NOINHERIT, a member
# of the group roles it switches to (API_GROUPS).
API_LOGIN = "webhooks_test_api"


def login_dsn(dsn: str, login: str) -> str:
    return role_dsn(dsn, login, LOGIN_PASSWORD)


def api_dsn(dsn: str) -> str:
    """The DSN the API logs in with (API_LOGIN; created in the cluster if missing)."""
    return login_role(dsn, API_LOGIN, API_GROUPS, LOGIN_PASSWORD, inherit=False)


# How long a worker waits for a database connection unless configured: the pace of its retries
# while the database is down.
CONNECT_TIMEOUT_SECONDS: float = DatabaseConfig.model_fields["connect_timeout_seconds"].default
# A drain's cap per row: about a hundred times what one delivery costs a loaded machine, so it only
# ever stops a drain that moves and never ends.
SECONDS_PER_ROW = 0.1


def enqueue(dsn: str, webhook_id: int, payload: dict[str, Any] | None = None,
            event_type: str = "alert.created", deliver_after: float = 0.0, count: int = 1) -> list[int]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "INSERT INTO webhooks.alert_delivery_queue (webhook_id, event_type, payload, next_retry_at)"
            " SELECT %s, %s, %s::jsonb || jsonb_build_object('n', n),"
            "        now() + make_interval(secs => %s)"
            " FROM generate_series(1, %s) n RETURNING delivery_id",
            (webhook_id, event_type, json.dumps(payload or {}), deliver_after, count),
        ).fetchall()
    return [r[0] for r in rows]


def statuses(dsn: str, ids: list[int]) -> dict[int, str]:
    rows = query(dsn, "SELECT delivery_id, status FROM webhooks.alert_delivery_queue"
                      " WHERE delivery_id = ANY(%s)", (ids,))
    return dict(rows)  # type: ignore[arg-type]


def all_final(dsn: str, ids: list[int]) -> bool:
    found = statuses(dsn, ids)
    return len(found) == len(ids) and all(s in ("delivered", "dead_letter") for s in found.values())


def drain_progress(dsn: str, ids: list[int]) -> tuple[int, int, object]:
    """(rows final, rows found, their latest change) for these rows: a claim, a deferral, a release
    or an outcome moves the last, so a drain that is alive shows here even before a row ends."""
    [(final, found, changed)] = query(
        dsn, "SELECT count(*) FILTER (WHERE status IN ('delivered', 'dead_letter')), count(*),"
             " max(updated_at) FROM webhooks.alert_delivery_queue WHERE delivery_id = ANY(%s)", (ids,))
    return final, found, changed


def wait_final(dsn: str, ids: list[int], message: str = "every row final", stall: float = STALL_SECONDS,
               per_row: float = SECONDS_PER_ROW) -> None:
    """Wait until every row of `ids` is delivered or dead-lettered. Fails when none of them has
    changed for `stall` seconds (give more where a test makes rows wait: a lease, a long retry), or
    once HANG_SECONDS + per_row × rows have passed."""
    latest: tuple[int, int, object] = (0, 0, None)

    def done() -> bool:
        nonlocal latest
        latest = drain_progress(dsn, ids)
        return latest[0] == latest[1] == len(ids)

    eventually(done, timeout=HANG_SECONDS + per_row * len(ids), interval=0.05 if len(ids) <= 100 else 0.5,
               message=f"{message} ({len(ids)} rows)", progress=lambda: latest, stall=stall)


class BlockingConnection:
    """A worker.store connection (psycopg's async one) driven from synchronous test code, on an event
    loop of its own: `run(call, *args)` awaits `call(conn, *args)`, `execute(sql, params)` runs a
    statement and returns its rows (none for a statement that answers none). For tests that set a role
    or a tenant on the connection, or hold a transaction open, around a store call."""

    def __init__(self, dsn: str, autocommit: bool = True) -> None:
        self._loop = asyncio.new_event_loop()
        self.conn = self._loop.run_until_complete(psycopg.AsyncConnection.connect(dsn, autocommit=autocommit))

    def run(self, call: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
        return self._loop.run_until_complete(call(self.conn, *args, **kwargs))

    def execute(self, sql: Any, params: Any = None) -> list[tuple[Any, ...]]:
        async def rows(conn: psycopg.AsyncConnection[Any]) -> list[tuple[Any, ...]]:
            cur = await conn.execute(sql, params)
            return await cur.fetchall() if cur.description is not None else []

        return self.run(rows)

    def commit(self) -> None:
        self._loop.run_until_complete(self.conn.commit())

    def __enter__(self) -> BlockingConnection:
        return self

    def __exit__(self, kind: object, *exc: object) -> None:
        # as psycopg's connection block does: a transaction left open is committed, unless it failed
        if kind is None and not self.conn.autocommit:
            self.commit()
        self._loop.run_until_complete(self.conn.close())
        self._loop.close()
