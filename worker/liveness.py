"""This process's liveness: its registration on a connection of its own, and reclaiming lost workers' rows."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any
from uuid import uuid4

import psycopg

from worker.queue import Queue, Registration
from worker.retrying import DATABASE_ERRORS, Backoff, brief

# Each worker checks its own liveness connection and reclaims the rows of lost workers this often;
# a worker's lock must be missing for the grace before its rows are reclaimed, which a cut liveness
# connection, noticed at once and reconnected, stays well within.
INTERVAL_SECONDS = 0.5
GRACE_SECONDS = 1.0
MAX_BACKOFF_SECONDS = 1.0


class Liveness:
    """Holds this process's registration (sql/functions/liveness.sql) while it runs: `alive` is set
    while it is held, and claims wait for it, since rows claimed without it could be reclaimed by
    other workers."""

    def __init__(self, queue: Queue, worker_id: str, log: Any, reclaimed: Callable[[], None]) -> None:
        self.queue = queue
        self.worker_id = worker_id
        self.log = log
        self._reclaimed = reclaimed  # called when lost workers' rows came back: claim again
        self.alive = asyncio.Event()
        # This process, as opposed to another process under the same worker id.
        self._instance = uuid4()
        self._conn: psycopg.AsyncConnection[Any] | None = None

    async def register(self) -> Registration:
        """Open a liveness connection and register this process on it."""
        await self.close()
        conn = await self.queue.liveness_connection()
        try:
            registration = await self.queue.register_worker(conn, self.worker_id, self._instance)
        except BaseException:
            await conn.close()
            raise
        if not registration.registered:
            await conn.close()
            return registration
        self._conn = conn
        self.alive.set()
        if registration.reclaimed:
            self.log.warning("reclaimed the rows an earlier process under this worker id left in flight",
                             rows=registration.reclaimed)
        return registration

    async def run(self) -> None:
        """Keep this process registered and reclaim lost workers' rows, every INTERVAL_SECONDS,
        until cancelled. While the liveness connection is down, `alive` is clear."""
        backoff = Backoff(first=0.05, cap=MAX_BACKOFF_SECONDS)
        while True:
            try:
                if self._conn is None or self._conn.closed:
                    registration = await self.register()
                    if not registration.registered:
                        self.log.error(id_in_use(self.worker_id, registration),
                                       action="not claiming until the id is free")
                        await asyncio.sleep(backoff.next())
                        continue
                    self.log.info("liveness registered again; claiming")
                conn = self._conn
                assert conn is not None
                reclaimed = await self.queue.reclaim_lost_workers(conn, GRACE_SECONDS)
                backoff.reset()
                if reclaimed:
                    self.log.warning("reclaimed the rows of lost workers", rows=reclaimed)
                    self._reclaimed()
                # Reading the idle connection until the next round: a connection closed by the
                # server (restart, pg_terminate_backend) is noticed at once, not a round later.
                async for _ in conn.notifies(timeout=INTERVAL_SECONDS):
                    pass
            except DATABASE_ERRORS as exc:
                if self.alive.is_set():
                    self.log.warning("liveness connection lost; claims wait until it is back",
                                     error=brief(exc))
                self.alive.clear()
                await self.close()
                await asyncio.sleep(backoff.next())
            except Exception:  # a side task must never die silently
                self.log.exception("liveness check failed")
                await asyncio.sleep(INTERVAL_SECONDS)

    async def close(self) -> None:
        # alive means holding a registered liveness connection: claims wait from here on
        self.alive.clear()
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.close()


def id_in_use(worker_id: str, registration: Registration) -> str:
    """The error for a worker id another live process holds."""
    since = f" since {registration.holder_since:%Y-%m-%d %H:%M:%S %Z}" if registration.holder_since else ""
    holder = f" (database backend pid {registration.holder_pid}{since})" if registration.holder_pid else ""
    return (f"worker.id: {worker_id!r} is already in use by a running worker{holder}; "
            "give each worker process its own id")
