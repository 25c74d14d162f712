"""The delivery loop: claim → hand each request to the executor → the finisher; concurrency, shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar
from uuid import UUID

import psycopg

from worker import schema
from worker.config import LEASE_MARGIN_SECONDS, Config, check_lease
from worker.daemon import outcomes
from worker.daemon.attempt import Executor, InFlight
from worker.daemon.finisher import Finisher
from worker.daemon.liveness import Liveness, id_in_use
from worker.daemon.maintenance import Maintenance
from worker.daemon.retrying import DATABASE_ERRORS, Backoff, brief
from worker.daemon.sender import Sender
from worker.encryption import KEYS_ENV, load_keyring
from worker.errors import ConfigError
from worker.observability import Metrics, ProbeServer, get_logger
from worker.rules import coalescing
from worker.rules.destinations import DestinationRules
from worker.rules.model import Claimed
from worker.runtime import cancel_and_wait
from worker.store.queue import DeliverySettings, Queue

T = TypeVar("T")
SCHEMA_MISSING = (psycopg.errors.UndefinedFunction, psycopg.errors.InvalidSchemaName)
SCHEMA_TOO_OLD = (f"schema older than version {schema.MIN_SUPPORTED_VERSION} (or not migrated): "
                  "run `webhook-worker migrate`")
# When rows are due but another worker got them first, look again soon, but never spin.
MIN_IDLE_SECONDS = 0.05
# Wake-ups that come within this long of a claim that found nothing are held and merged into one
# claim; the window doubles with each such claim, up to the cap, so anyone able to NOTIFY (a role
# with only CONNECT can) makes a worker claim a few times a second at most, not once per NOTIFY.
WAKE_QUIET_MIN_SECONDS = 0.005
WAKE_QUIET_MAX_SECONDS = 0.25
# After the shutdown grace: at most this long to release what is left, then to write the last
# outcomes. The termination grace period in k8s/ is checked against the sum.
RELEASE_SECONDS = 2.0
FINAL_FLUSH_SECONDS = 5.0
GC_YOUNG_THRESHOLD = 50_000


@dataclass(frozen=True)
class Effective:
    """The settings this process runs with: its YAML overrides on top of webhooks.delivery_config."""

    timeout_seconds: float
    lease_seconds: int
    claim_batch_size: int
    finish_batch_size: int

    @classmethod
    def resolve(cls, config: Config, settings: DeliverySettings) -> Effective:
        delivery = config.delivery
        effective = cls(
            timeout_seconds=delivery.timeout_seconds or settings.timeout_seconds,
            lease_seconds=delivery.lease_seconds or settings.lease_seconds,
            claim_batch_size=min(
                delivery.claim_batch_size or settings.claim_batch_size, config.worker.concurrency
            ),
            finish_batch_size=delivery.finish_batch_size or settings.finish_batch_size,
        )
        try:
            check_lease(effective.lease_seconds, effective.timeout_seconds)
        except ValueError as exc:
            raise ConfigError(f"delivery.lease_seconds: {exc} (with webhooks.delivery_config)") from None
        return effective


class Worker:
    """One worker process: claims rows and hands each request to the executor (worker/daemon/attempt.py),
    within its concurrency; holds its liveness; drains in-flight requests at shutdown."""

    def __init__(self, config: Config, queue: Queue, sender: Sender) -> None:
        self.config = config
        self.queue = queue
        self.sender = sender
        self.worker_id = config.worker.id
        self.log = get_logger(worker_id=self.worker_id)
        self.effective: Effective | None = None
        self._stopping = asyncio.Event()
        self._wake = asyncio.Event()
        # Set with _wake by a NOTIFY (anyone may send one), not by this process's own finishes.
        self._notified = False
        self._slot_freed = asyncio.Event()
        # Each request in flight (a row of its own or a digest) and the task running it.
        self._in_flight: dict[InFlight, asyncio.Task[None]] = {}
        self.metrics = Metrics(tenant_label_limit=config.http.endpoint_label_limit)
        self.finisher = Finisher(queue, self.worker_id, self.metrics, self.log, self.wake)
        self.liveness = Liveness(queue, self.worker_id, self.log, self.wake, held=self.held_leases)
        # Set once the effective settings are known (run()).
        self._executor: Executor | None = None
        self.metrics.in_flight.set_function(lambda: len(self._in_flight))
        self._debug = self.log.is_enabled_for(logging.DEBUG)
        self.started = False
        self._probes = ProbeServer(self.metrics, self.readiness, lambda: self.started)

    def stop(self) -> None:
        if not self._stopping.is_set():
            self.log.info("shutdown requested: no more claims", in_flight=len(self._in_flight))
            self._stopping.set()

    def wake(self) -> None:
        self._wake.set()

    def held_leases(self) -> set[UUID]:
        """The leases this process answers for: its requests in flight, and outcomes not yet written."""
        held = self.finisher.unwritten_leases()
        held.update(row.lease_token for flight in self._in_flight for row in flight.members)
        return held

    def notified(self) -> None:
        self._notified = True
        self._wake.set()

    async def readiness(self) -> tuple[bool, dict[str, Any]]:
        """Ready: started, not shutting down, the database reachable with a schema we support, and
        claiming (the worker id held: claims wait while its liveness connection is lost)."""
        if self._stopping.is_set():
            return False, {"reason": "shutting down"}
        if self.effective is None:
            return False, {"reason": "waiting for the database"}
        try:
            version = await self.queue.schema_version(wait_seconds=2.0)
        except SCHEMA_MISSING:
            return False, {"reason": SCHEMA_TOO_OLD}
        except DATABASE_ERRORS as exc:
            return False, {"reason": "database unreachable", "error": brief(exc)}
        supported = version is not None and (
            schema.MIN_SUPPORTED_VERSION <= version <= schema.MAX_SUPPORTED_VERSION)
        details: dict[str, Any] = {"schema_version": version}
        if not supported:
            details["reason"] = (f"schema version {version} outside "
                                 f"{schema.MIN_SUPPORTED_VERSION}-{schema.MAX_SUPPORTED_VERSION}")
            return False, details
        if not self.liveness.alive.is_set():
            details["reason"] = "claims blocked: the worker's liveness registration is not held"
            return False, details
        return True, details

    async def run(self) -> None:
        """Deliver until stop() is called, then shut down gracefully."""
        await self.sender.start()
        await self.queue.open()
        if self.config.http.enabled:
            http = self.config.http
            try:
                port = await self._probes.start(http.host, http.port)
            except OSError as exc:
                await self.sender.close()
                await self.queue.close()
                where = f"{http.host}:{http.port}"
                raise ConfigError(f"http.port: cannot listen on {where}: {exc.strerror}") from None
            self.log.info("probes and metrics listening", port=port)
        # Initialised. Waiting for the database is readiness's business: failing the startup probe
        # would have Kubernetes restart the pod in a loop during a database outage.
        self.started = True
        liveness: asyncio.Task[None] | None = None
        try:
            settings = await self._startup_settings()
            if settings is None:
                return
            self.effective = Effective.resolve(self.config, settings)
            await self._check_keys()
            if not await self._hold_id_at_start():
                return
            longest_request = self.effective.lease_seconds - LEASE_MARGIN_SECONDS
            self._executor = Executor(self.sender, self.metrics, self.log, self.finisher.put, self._done,
                                      self.effective.timeout_seconds, longest_request)
            if self.config.worker.shutdown_grace_seconds < longest_request:
                self.log.warning(
                    "worker.shutdown_grace_seconds is shorter than the longest request the lease allows:"
                    " a request still open when a shutdown's grace ends is interrupted and sent again",
                    shutdown_grace_seconds=self.config.worker.shutdown_grace_seconds,
                    longest_request_seconds=longest_request)
            self.log.info(
                "worker started",
                concurrency=self.config.worker.concurrency,
                lease_seconds=self.effective.lease_seconds,
                timeout_seconds=self.effective.timeout_seconds,
                claim_batch_size=self.effective.claim_batch_size,
            )
            batch, delay = self.effective.finish_batch_size, self.config.worker.finish_max_delay_seconds
            finisher = asyncio.create_task(self.finisher.run(batch, delay), name="finisher")
            # Runs through the drain: outcomes written during the grace need the rows still ours.
            liveness = asyncio.create_task(self.liveness.run(), name="liveness")
            side_tasks = Maintenance(self.config, self.queue, self.metrics, self.log, self.notified).start()
            try:
                await self._claim_loop()
            finally:
                await cancel_and_wait(side_tasks)
            await self._drain(finisher)
        finally:
            await self.sender.close()
            await self.queue.close()
            # Last: whatever is still ours in the database stays ours until every outcome is written.
            # Stopped before its connection closes, or it would take the worker id again.
            if liveness is not None:
                await cancel_and_wait([liveness])
            await self.liveness.close()
            await self._probes.stop()
            self.log.info("worker stopped")

    async def _check_keys(self) -> None:
        """Refuse to start without the keys that opened the stored credentials: one clear line,
        rather than every delivery failing."""
        try:
            in_use = await self.queue.credential_keys()
        except DATABASE_ERRORS as exc:
            self.log.warning("could not check the encryption keys", error=brief(exc))
            return
        held = self.queue.keyring.key_ids
        missing = self.queue.keyring.missing(in_use)
        if missing:
            raise ConfigError(
                f"{KEYS_ENV}: stored credentials are sealed with key(s) {', '.join(missing)}, which this "
                f"worker does not hold (it holds {', '.join(held)}); check the key it was given"
            )
        if in_use.get("plaintext"):
            self.log.warning("credentials stored unsealed; run `webhook-worker keys rotate`"
                             + ("; until then their deliveries are refused (security.require_sealed)"
                                if self.queue.require_sealed else ""),
                             credentials=in_use["plaintext"])

    async def _startup_settings(self) -> DeliverySettings | None:
        """Read webhooks.delivery_config, waiting for the database as long as it takes; refuse a
        database whose encoding is not UTF-8 (schema.encoding_problem)."""
        encoding = await self._until_database(self.queue.server_encoding, "database not reachable; retrying")
        if self._stopping.is_set():
            return None
        problem = schema.encoding_problem(encoding)
        if problem is not None:
            raise ConfigError(f"database.url: {problem}")
        return await self._until_database(self.queue.settings, "database not reachable; retrying")

    async def _until_database(self, call: Callable[[], Awaitable[T]], unreachable: str) -> T | None:
        """The call's result, tried again with backoff while the database is unreachable or not yet
        migrated far enough; None if stop() came first."""
        backoff = Backoff(first=0.5)
        while not self._stopping.is_set():
            try:
                return await call()
            except DATABASE_ERRORS as exc:
                delay = backoff.next()
                if isinstance(exc, SCHEMA_MISSING):
                    self.log.warning(SCHEMA_TOO_OLD, retry_in=delay)
                else:
                    self.log.warning(unreachable, error=brief(exc), retry_in=delay)
                await self._sleep(delay)
        return None

    async def _hold_id_at_start(self) -> bool:
        """Register before the first claim, waiting for the database; False if stopped meanwhile.
        A second live process under the same worker id is refused with one clear error."""
        hold = await self._until_database(
            self.liveness.hold, "could not register the worker's liveness; retrying")
        if hold is None:
            return False
        if not hold.held:
            raise ConfigError(id_in_use(self.worker_id, hold))
        return True

    # --- claim ---------------------------------------------------------------------------------

    async def _claim_loop(self) -> None:
        assert self.effective is not None and self._executor is not None
        executor = self._executor
        concurrency = self.config.worker.concurrency
        batch_size = self.effective.claim_batch_size
        # Claim again only once a good share of slots is free, so a busy worker makes few large
        # claims rather than one claim per finished request.
        refill_at = max(1, batch_size // 2)
        backoff = Backoff()
        loop = asyncio.get_running_loop()
        quiet = 0.0
        while not self._stopping.is_set():
            if not self.liveness.alive.is_set():
                await self._wait_for(self.liveness.alive)  # liveness lost: see Liveness.run
                continue
            free = concurrency - len(self._in_flight)
            if self._in_flight and free < refill_at:
                self._slot_freed.clear()
                await self._wait_for(self._slot_freed)
                continue
            want = min(batch_size, free)
            self._wake.clear()
            by_notify, self._notified = self._notified, False
            try:
                rows = await self._claim_and_start(executor, want)
            except DATABASE_ERRORS as exc:
                self.metrics.database_errors.labels("claim").inc()
                delay = backoff.next()
                self.log.warning("claim failed; retrying", error=brief(exc), retry_in=delay)
                await self._sleep(delay)
                continue
            if rows is None:
                return  # stopped: rows claimed meanwhile were released, or return after their lease
            backoff.reset()
            if rows:
                self.metrics.claim_batch.observe(len(rows))
                quiet = 0.0  # rows found: the next wake-up after an empty claim is not held
            if self._debug:
                self.log.debug("claimed batch", rows=len(rows), wanted=want)
            if len(rows) < want:
                claimed_at = loop.time()
                quiet = quiet_after_claim(quiet, found_rows=bool(rows), by_notify=by_notify)
                # (Woken while claiming: no need to ask when rows fall due; claim again after the hold.)
                if not self._wake.is_set():
                    await self._wait_for(self._wake, limit_seconds=await self._idle_seconds())
                if not self._wake.is_set():
                    quiet = 0.0  # a quiet spell, not a storm: the next wake-up is answered at once
                elif (hold := claimed_at + quiet - loop.time()) > 0:
                    await self._sleep(hold)  # wake-ups meanwhile are merged into the next claim

    async def _claim_and_start(self, executor: Executor, want: int) -> list[Claimed] | None:
        """Claim up to `want` rows and start their requests; None if stop() came first. Holds
        liveness.claims until the rows are in _in_flight: the id held again meanwhile gives
        back the rows leased under this id that it does not see held (Liveness.hold)."""
        assert self.effective is not None
        loop = asyncio.get_running_loop()
        async with self.liveness.claims:
            claim_started = loop.time()
            rows = await self._unless_stopped(
                self.queue.acquire(self.worker_id, want, self.effective.lease_seconds))
            if rows is None:  # stopped while waiting: anything claimed returns after its lease
                return None
            self.metrics.database_call_duration.labels("claim").observe(loop.time() - claim_started)
            if self._stopping.is_set():
                await self._release(rows, "claimed during shutdown")
                return None
            for members in coalescing.requests(rows):
                flight = InFlight(members)
                # unnamed: a name costs a string and a call per delivery, and _in_flight already
                # maps each task to its request
                self._in_flight[flight] = asyncio.create_task(executor.run(flight))
        return rows

    async def _idle_seconds(self) -> float:
        """Sleep until the earliest due retry or lease expiry, capped by the polling interval."""
        poll = self.config.worker.poll_interval_seconds
        try:
            due_in = await self.queue.next_due_in()
        except DATABASE_ERRORS:
            return poll
        if due_in is None:
            return poll
        return min(poll, max(due_in, MIN_IDLE_SECONDS))

    async def _unless_stopped(self, call: Coroutine[Any, Any, T]) -> T | None:
        """The call's result, or None if stop() came first (the call is then cancelled)."""
        task = asyncio.ensure_future(call)
        stopping = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait([task, stopping], return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
        if task.done():
            return task.result()
        await cancel_and_wait([task])
        return None

    async def _wait_for(self, event: asyncio.Event, limit_seconds: float | None = None) -> None:
        """Until the event is set, stop() is called, or the timeout passes."""
        waiters = [asyncio.create_task(event.wait()), asyncio.create_task(self._stopping.wait())]
        try:
            await asyncio.wait(waiters, timeout=limit_seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()

    async def _sleep(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), seconds)

    def _done(self, flight: InFlight) -> None:
        """A request's outcomes are given: its slot is free."""
        self._in_flight.pop(flight, None)
        self._slot_freed.set()

    # --- shutdown ------------------------------------------------------------------------------

    async def _drain(self, finisher: asyncio.Task[None]) -> None:
        """Let requests in flight finish within the grace; then record each request still open as
        an interrupted attempt, release the rows not yet sent, and flush the outcomes."""
        grace = self.config.worker.shutdown_grace_seconds
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        if self._in_flight:
            await asyncio.wait(list(self._in_flight.values()), timeout=grace)
        leftover = list(self._in_flight.values())
        # A digest's members one by one: each is released or recorded as interrupted on its own.
        # No task runs between this snapshot and the cancellations below (no await between them).
        members = [(row, flight.started) for flight in self._in_flight for row in flight.members]
        interrupted_at = time.monotonic()
        if leftover:
            await cancel_and_wait(leftover)
            sent = [(row, started) for row, started in members if started is not None]
            for row, started in sent:
                latency_ms = int((interrupted_at - started) * 1000)
                self.finisher.put(outcomes.interrupted(row, grace, latency_ms))
            if sent:
                self.log.warning("requests still open when the grace ran out: recorded as interrupted "
                                 "attempts", requests=len(sent))
            try:
                await asyncio.wait_for(
                    self._release([row for row, started in members if started is None],
                                  "claimed, not yet sent when the grace ran out"),
                    timeout=max(deadline - loop.time(), RELEASE_SECONDS),
                )
            except TimeoutError:
                self.log.error("release timed out; rows return after their lease")
        self.finisher.close()
        try:
            await asyncio.wait_for(finisher, timeout=max(deadline - loop.time(), FINAL_FLUSH_SECONDS))
        except TimeoutError:
            self.log.error("outcomes not written before exit; their rows return after the lease")

    async def _release(self, rows: list[Claimed], why: str) -> None:
        if not rows:
            return
        try:
            released = await self.queue.release(self.worker_id, rows)
            self.log.info("released claimed rows", released=released, reason=why)
        except DATABASE_ERRORS as exc:
            self.log.error("release failed; rows return after the lease", error=brief(exc))


def quiet_after_claim(previous: float, found_rows: bool, by_notify: bool) -> float:
    """How long after a claim further wake-ups are held and merged into one claim: nothing after a
    claim that found rows; after one a NOTIFY asked for that found nothing a few ms, doubling each
    time, up to a cap. A claim this process asked for itself (a finish freed capacity) and that
    found nothing leaves the window as it was: with one row at a time, that empty look follows
    every delivery, and holding the next NOTIFY behind it could add up to the whole window to the
    next row's latency."""
    if found_rows:
        return 0.0
    if not by_notify:
        return previous
    return min(max(previous * 2, WAKE_QUIET_MIN_SECONDS), WAKE_QUIET_MAX_SECONDS)


def destination_rules(config: Config) -> DestinationRules:
    security = config.security
    return DestinationRules.from_settings(
        security.block_private_networks, security.allow_networks, security.require_https
    )


def sender_for(config: Config) -> Sender:
    """The HTTP side as configured: destination rules and response bounds."""
    security = config.security
    return Sender(config.worker.concurrency, destination_rules(config), security.max_response_bytes,
                  security.max_response_header_bytes, ca_bundle_file=security.ca_bundle_file)


async def serve(config: Config) -> None:
    """Run one worker process until SIGTERM or SIGINT."""
    keyring = load_keyring(config.security.encryption_keys_file, os.environ)
    queue = Queue.create(
        config.database.url,
        config.database.pool_min_size,
        config.database.pool_max_size,
        config.database.connect_timeout_seconds,
        config.worker.id,
        keyring,
        require_sealed=config.security.require_sealed,
    )
    queue.pool_tenants = (config.worker.tenants, config.worker.exclude_tenants)
    worker = Worker(config, queue, sender_for(config))
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, worker.stop)
    tune_garbage_collector()
    await worker.run()


def tune_garbage_collector() -> None:
    """Fewer cyclic collections for a process that makes many small, short-lived objects per
    delivery (rows, headers, outcomes) and frees nearly all of them by reference counting: what was
    loaded at startup is never scanned again, and the young generation is collected every 50,000
    allocations rather than every 700. It buys less worker CPU per delivery."""
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])
