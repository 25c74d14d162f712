"""Writing outcomes: batches of attempts' outcomes to webhooks.finish(), counted and reported."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from typing import Any
from uuid import UUID

import psycopg

from worker.daemon.retrying import TRANSIENT_ERRORS, Backoff, brief
from worker.observability import Metrics
from worker.rules.classification import Outcome
from worker.rules.model import Finished, FinishResult
from worker.store.queue import Queue


class Finisher:
    """Takes outcomes as deliveries end and writes them in batches, each one transaction; a batch
    the database rejects is split until the outcome at fault is isolated."""

    def __init__(self, queue: Queue, worker_id: str, metrics: Metrics, log: Any,
                 written: Callable[[], None]) -> None:
        self.queue = queue
        self.worker_id = worker_id
        self.metrics = metrics
        self.log = log
        self._written = written  # called after each batch is written
        self._waiting: asyncio.Queue[Finished | None] = asyncio.Queue()
        # The leases of outcomes given and not yet written (or dropped): still this process's.
        self._unwritten: Counter[UUID] = Counter()

    def put(self, finished: Finished) -> None:
        self._unwritten[finished.lease_token] += 1
        self._waiting.put_nowait(finished)

    def unwritten_leases(self) -> set[UUID]:
        return set(self._unwritten)

    def close(self) -> None:
        """No more outcomes: run() writes what it holds and returns."""
        self._waiting.put_nowait(None)

    async def run(self, max_batch: int, max_delay: float) -> None:
        """Write outcomes in batches: up to max_batch, or whatever came within max_delay; end once
        close() was called and every outcome before it is written."""
        loop = asyncio.get_running_loop()
        closing = False
        while not closing:
            first = await self._waiting.get()
            if first is None:
                break
            batch = [first]
            deadline = loop.time() + max_delay
            while len(batch) < max_batch:
                try:
                    item = self._waiting.get_nowait()
                except asyncio.QueueEmpty:
                    remaining = deadline - loop.time()
                    if remaining <= 0:
                        break
                    try:
                        item = await asyncio.wait_for(self._waiting.get(), remaining)
                    except TimeoutError:
                        break
                if item is None:
                    closing = True
                    break
                batch.append(item)
            try:
                await self._write(batch)
            except Exception:  # the finisher must survive anything: these rows return after their lease
                self.log.exception("writing outcomes failed", outcomes=len(batch))
            finally:
                for finished in batch:
                    left = self._unwritten[finished.lease_token] - 1
                    if left > 0:
                        self._unwritten[finished.lease_token] = left
                    else:
                        del self._unwritten[finished.lease_token]

    async def _write(self, batch: list[Finished]) -> None:
        """Write a batch, retrying while the database is unreachable. A batch the database rejects
        is split until the outcome at fault is isolated and dropped: its row comes back after its
        lease, and every other outcome is written."""
        backoff = Backoff()
        loop = asyncio.get_running_loop()
        while True:
            try:
                started = loop.time()
                results = await self.queue.finish(self.worker_id, batch)
                self.metrics.database_call_duration.labels("finish").observe(loop.time() - started)
                break
            except TRANSIENT_ERRORS as exc:
                self.metrics.database_errors.labels("finish").inc()
                delay = backoff.next()
                self.log.warning(
                    "finish failed; retrying", error=brief(exc), outcomes=len(batch), retry_in=delay
                )
                await asyncio.sleep(delay)
            except psycopg.Error as exc:
                if len(batch) == 1:
                    self.log.error(
                        "outcome rejected by the database; the row returns after its lease",
                        delivery_id=batch[0].delivery_id, error=brief(exc),
                    )
                    return
                half = len(batch) // 2
                await self._write(batch[:half])
                await self._write(batch[half:])
                return
        # Capacity freed here (fleet-wide concurrency is counted from rows in flight): claim again.
        self._written()
        self._count(batch, results)
        stale = [r.delivery_id for r in results if not r.applied]
        if stale:
            self.log.warning("outcomes arrived after their lease was taken over", delivery_ids=stale)
        for result in results:
            if result.endpoint_change:
                self.log.warning(
                    "endpoint state changed", delivery_id=result.delivery_id, change=result.endpoint_change
                )

    def _count(self, batch: list[Finished], results: list[FinishResult]) -> None:
        outcomes = {f.delivery_id: f for f in batch}
        count = self.metrics.count_outcome
        for result in results:
            finished = outcomes.get(result.delivery_id)
            tenant, rank = (finished.tenant, finished.tenant_rank) if finished is not None else ("default", 1)
            if not result.applied:
                count("stale", tenant, rank)
            elif result.status == "delivered":
                count("delivered", tenant, rank)
            elif result.status == "dead_letter":
                count("dead_lettered", tenant, rank)
            elif finished is not None and finished.outcome == Outcome.DEFERRED:
                count("deferred", tenant, rank)
            else:
                count("retried", tenant, rank)
            if result.applied and result.status in ("delivered", "dead_letter") and finished is not None:
                self.metrics.attempts_per_delivery.observe(finished.attempt)
