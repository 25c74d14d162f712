"""This process's liveness: its worker id held on a connection of its own; lost workers' rows reclaimed."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Collection
from typing import Any
from uuid import UUID, uuid4

import psycopg

from worker.daemon.retrying import DATABASE_ERRORS, Backoff, brief
from worker.store.queue import Queue, WorkerIdHold

# Each worker checks its own liveness connection and reclaims the rows of lost workers this often;
# a worker's lock must be missing for the grace before its rows are reclaimed, which a cut liveness
# connection, noticed at once and reconnected, stays well within.
INTERVAL_SECONDS = 0.5
GRACE_SECONDS = 1.0
MAX_BACKOFF_SECONDS = 1.0


class Liveness:
    """Holds this process's worker id (sql/functions/liveness.sql) while it runs: `alive` is set
    while it is held, and claims wait for it, since rows claimed without it could be reclaimed by
    other workers.

    Taking the id again (the liveness connection was lost), it gives back every row leased under its
    id that the process does not hold (`held`: the leases of its requests in flight and of outcomes
    not yet written). After a failover to a standby that was behind, the new primary shows rows
    `delivering` whose outcomes went to the old primary; nobody would finish them, and they would
    fill their endpoints' max_in_flight until their leases ran out. `claims` is held by the claim
    loop while a claim runs, so no claim commits between the snapshot of `held` and the release."""

    def __init__(self, queue: Queue, worker_id: str, log: Any, reclaimed: Callable[[], None],
                 held: Callable[[], Collection[UUID]] = frozenset) -> None:
        self.queue = queue
        self.worker_id = worker_id
        self.log = log
        self._reclaimed = reclaimed  # called when lost workers' rows came back: claim again
        self._held = held
        self.claims = asyncio.Lock()
        self.alive = asyncio.Event()
        # This process, as opposed to another process under the same worker id.
        self._instance = uuid4()
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._held_before = False

    async def hold(self) -> WorkerIdHold:
        """Open a liveness connection and hold this process's worker id on it; holding it again, give
        back the rows leased under this id that the process does not hold."""
        await self.close()
        conn = await self.queue.liveness_connection()
        try:
            async with self.claims:
                hold = await self.queue.register_worker(conn, self.worker_id, self._instance)
                released = 0
                if hold.held and self._held_before:
                    released = await self._release_unheld(conn)
        except BaseException:
            await conn.close()
            raise
        if not hold.held:
            await conn.close()
            return hold
        self._conn = conn
        self._held_before = True
        self.alive.set()
        if hold.reclaimed:
            self.log.warning("reclaimed the rows an earlier process under this worker id left in flight",
                             rows=hold.reclaimed)
        if released:
            self.log.warning("gave back rows leased under this worker id that it does not hold (their "
                             "outcomes were lost, as in a failover to a standby that was behind)",
                             rows=released)
        return hold

    async def _release_unheld(self, conn: psycopg.AsyncConnection[Any]) -> int:
        try:
            return await self.queue.release_unheld_leases(conn, self.worker_id, self._held())
        except psycopg.errors.UndefinedFunction:
            # definitions older than this worker (`migrate` not run yet): its rows wait for their lease
            self.log.warning("webhooks.release_unheld_leases() is missing: run `webhook-worker migrate`")
            return 0

    async def run(self) -> None:
        """Keep this process's worker id held and reclaim lost workers' rows, every INTERVAL_SECONDS,
        until cancelled. While the liveness connection is down, `alive` is clear."""
        backoff = Backoff(first=0.05, cap=MAX_BACKOFF_SECONDS)
        while True:
            try:
                if self._conn is None or self._conn.closed:
                    hold = await self.hold()
                    if not hold.held:
                        self.log.error(id_in_use(self.worker_id, hold),
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
        # alive means holding the worker id on a liveness connection: claims wait from here on
        self.alive.clear()
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.close()


def id_in_use(worker_id: str, hold: WorkerIdHold) -> str:
    """The error for a worker id another live process holds."""
    since = f" since {hold.holder_since:%Y-%m-%d %H:%M:%S %Z}" if hold.holder_since else ""
    holder = f" (database backend pid {hold.holder_pid}{since})" if hold.holder_pid else ""
    return (f"worker.id: {worker_id!r} is already in use by a running worker{holder}; "
            "give each worker process its own id")
