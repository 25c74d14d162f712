"""The worker's side tasks: wake-ups on NOTIFY, housekeeping, and queue statistics for the metrics."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from worker.config import Config
from worker.observability import Metrics
from worker.queue import Queue
from worker.retrying import DATABASE_ERRORS, Backoff, brief

HOUSEKEEPING_INTERVAL_SECONDS = 30.0


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
        """Every HOUSEKEEPING_INTERVAL_SECONDS: expiry, log partitions, retention (Queue.housekeeping)."""
        while True:
            try:
                done = await self.queue.housekeeping()
                if done.get("expired_rows"):
                    self.log.warning("dead-lettered rows of disabled endpoints", rows=done["expired_rows"])
                if any(done.values()):
                    self.log.info("housekeeping", **done)
            except DATABASE_ERRORS as exc:
                self.log.warning("housekeeping failed", error=brief(exc))
            except Exception:  # a side task must never die silently
                self.log.exception("housekeeping failed")
            await asyncio.sleep(HOUSEKEEPING_INTERVAL_SECONDS)

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
