"""The worker's side tasks: wake-ups on NOTIFY, housekeeping, and queue statistics for the metrics."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from worker.config import Config
from worker.daemon.retrying import DATABASE_ERRORS, Backoff, brief
from worker.observability import Metrics
from worker.store.queue import Queue


@dataclass(frozen=True)
class PurgeRound:
    """What one round of retention did: its batches (each one transaction) and what they removed."""

    batches: int
    delivered_rows: int
    log_partitions: int
    log_rows: int
    # False: the budget ran out while batches still came back full, so rows are left for the next round
    finished: bool


class Maintenance:
    """Loops that run beside the claim loop until cancelled; each survives any failure of its own."""

    def __init__(self, config: Config, queue: Queue, metrics: Metrics, log: Any,
                 wake: Callable[[], None]) -> None:
        self.config = config
        self.queue = queue
        self.metrics = metrics
        self.log = log
        self._wake = wake  # called on every NOTIFY: the claim loop looks again

    def start(self) -> list[asyncio.Task[None]]:
        return [
            asyncio.create_task(self.listen(), name="listener"),
            asyncio.create_task(self.housekeep(), name="housekeeping"),
            asyncio.create_task(self.sample_stats(), name="stats"),
        ]

    async def sample_stats(self) -> None:
        """Sample queue statistics for the metrics; the SQL side lets one worker at a time count."""
        while True:
            try:
                interval = self.config.http.stats_interval_seconds
                # a little under the interval, so that some worker samples in every interval
                stats = await self.queue.queue_stats(self.config.http.endpoint_label_limit, interval * 0.8)
                if stats is not None:
                    self.metrics.record_stats(stats)
            except DATABASE_ERRORS as exc:
                self.metrics.database_errors.labels("stats").inc()
                self.log.warning("sampling queue statistics failed", error=brief(exc))
            except Exception:  # a side task must never die silently
                self.log.exception("sampling queue statistics failed")
            await asyncio.sleep(self.config.http.stats_interval_seconds)

    async def housekeep(self) -> None:
        """Every housekeeping.interval_seconds: expiry, log partitions (Queue.housekeeping), then
        retention (purge). A round that leaves rows behind is followed sooner (after one budget)."""
        settings = self.config.housekeeping
        while True:
            pause = settings.interval_seconds
            try:
                done = await self.queue.housekeeping()
                purged = await self.purge()
                if not purged.finished:
                    pause = settings.purge_budget_seconds
                if done.get("expired_rows"):
                    self.log.warning("dead-lettered rows of disabled endpoints", rows=done["expired_rows"])
                done |= {"purged_delivered": purged.delivered_rows,
                         "dropped_partitions": purged.log_partitions, "purged_log_rows": purged.log_rows}
                if any(done.values()):
                    self.log.info("housekeeping", **done, purge_batches=purged.batches,
                                  purge_finished=purged.finished)
            except DATABASE_ERRORS as exc:
                self.metrics.database_errors.labels("housekeeping").inc()
                self.log.warning("housekeeping failed", error=brief(exc))
            except Exception:  # a side task must never die silently
                self.log.exception("housekeeping failed")
            await asyncio.sleep(pause)

    async def purge(self, clock: Callable[[], float] = time.monotonic) -> PurgeRound:
        """One round of retention: batches of housekeeping.purge_batch_size, each its own transaction,
        for as long as they come back full (more is waiting) and purge_budget_seconds lasts. At least
        one batch runs, however small the budget."""
        settings = self.config.housekeeping
        size = settings.purge_batch_size
        deadline = clock() + settings.purge_budget_seconds
        batches = delivered = partitions = log_rows = 0
        while True:
            batch = await self.queue.purge(size)
            batches += 1
            delivered += batch.delivered_rows
            partitions += batch.log_partitions
            log_rows += batch.log_rows
            self.metrics.count_purge(batch.delivered_rows, batch.log_rows)
            more = batch.delivered_rows >= size or batch.log_rows >= size
            if not more or clock() >= deadline:
                break
        self.metrics.purge_behind.set(1 if more else 0)
        return PurgeRound(batches, delivered, partitions, log_rows, finished=not more)

    async def listen(self) -> None:
        """Wake the claim loop on NOTIFY; reconnect with backoff whenever the connection drops."""
        backoff = Backoff(first=0.5)
        while True:
            try:
                async for _ in self.queue.notifications():
                    backoff.reset()
                    self._wake()
            except Exception as exc:  # noqa: BLE001 - whatever broke it, listen again after a pause
                delay = backoff.next()
                self.log.warning("listener disconnected; reconnecting", error=brief(exc), retry_in=delay)
                await asyncio.sleep(delay)
