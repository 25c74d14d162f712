"""What operators see: structlog logs, Prometheus metrics, and the /health, /ready, /startup probes."""

from __future__ import annotations

import contextlib
import functools
import logging
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import structlog
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from worker.rules.tenants import OTHER_TENANTS

CIRCUIT_STATES = ("closed", "open", "half_open", "forced_open", "forced_closed")
STATUSES = ("pending", "delivering", "retrying", "delivered", "dead_letter")
HELD_BACK_REASONS = ("endpoint_disabled", "paused", "circuit_open", "rate_limited", "concurrency_cap")
# Reasons only a deployment with tenants has: exported from their first appearance on, so a
# single-tenant deployment's metrics are as they were.
TENANT_HELD_BACK_REASONS = ("tenant_rate_limited", "tenant_concurrency_cap", "no_pool")
TRACER_PROVIDER_RECHECK_SECONDS = 1.0
DELIVERY_OUTCOMES = ("delivered", "retried", "deferred", "dead_lettered", "stale")
# The `operation` label of webhook_worker_database_errors_total: every value the worker counts.
DATABASE_OPERATIONS = ("claim", "finish", "stats", "housekeeping")
# The `kind` label of webhook_worker_purged_rows_total: delivered queue rows, and audit-log rows
# (those of the default partition; the daily partitions are dropped whole).
PURGED_KINDS = ("delivered", "log")
DEFAULT_TENANT_LABEL_LIMIT = 100  # http.endpoint_label_limit's default


def tenant_label(name: str, rank: int, limit: int) -> str:
    """A tenant's metrics label: its name for the first `limit` tenants by id (rank 1 is the
    first), `other` for the rest, so the number of series stays bounded."""
    return name if rank <= limit else OTHER_TENANTS


def configure_logging(level: str = "info", fmt: str = "auto") -> None:
    renderer: Any
    if fmt == "console" or (fmt == "auto" and sys.stderr.isatty()):
        renderer = structlog.dev.ConsoleRenderer()
    else:
        renderer = structlog.processors.JSONRenderer()
    level_number = logging.getLevelName(level.upper())
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    structlog.configure(
        processors=[*shared, structlog.processors.format_exc_info, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(level_number),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    # Libraries log through the standard module (psycopg-pool, asyncio, aiohttp) and warnings go
    # there too: render their records with the same processors, so that with `json` every line of
    # stderr is one JSON object (a multi-line message or traceback becomes an escaped string).
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[*shared, structlog.stdlib.add_logger_name],
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                    structlog.processors.format_exc_info, renderer],
    ))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level_number)
    logging.captureWarnings(True)


def get_logger(**context: Any) -> Any:
    return structlog.get_logger("webhook-worker").bind(**context)


@contextlib.contextmanager
def attempt_span(traceparent: str | None, attributes: dict[str, Any]) -> Iterator[Any]:
    """An OpenTelemetry span for one attempt, child of the row's W3C trace context, when the
    OpenTelemetry API is installed (the `otel` extra; run under `opentelemetry-instrument`, or
    configure a TracerProvider, to export). Without it, nothing happens."""
    otel = _opentelemetry()
    if otel is None:
        yield None
        return
    trace, propagator, tracer = otel
    if not _provider_set(trace):
        yield None
        return
    parent = propagator.extract({"traceparent": traceparent} if traceparent else {})
    with tracer.start_as_current_span("webhook.deliver", context=parent, kind=trace.SpanKind.CLIENT,
                                      attributes=attributes) as span:
        yield span


def tracing() -> bool:
    """Whether attempt_span would make a span: the OpenTelemetry API installed and a TracerProvider
    set. Asked first, it spares each attempt the span's attributes and context manager when not."""
    otel = _opentelemetry()
    return otel is not None and _provider_set(otel[0])


_no_provider_until = 0.0


def _provider_set(trace: Any) -> bool:
    """Whether a TracerProvider is set. Without one every span is a no-op, yet creating it costs
    about as much as signing the request; and asking costs an environment lookup,
    so a "no" is trusted for a second."""
    global _no_provider_until
    now = time.monotonic()
    if now < _no_provider_until:
        return False
    if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        _no_provider_until = now + TRACER_PROVIDER_RECHECK_SECONDS
        return False
    return True


@functools.cache
def _opentelemetry() -> tuple[Any, Any, Any] | None:
    """The tracing API, a propagator and our tracer, looked up once (not on every attempt). The
    tracer is a proxy until a TracerProvider is set, and follows it when one is."""
    try:
        from opentelemetry import trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
    except ImportError:
        return None
    return trace, TraceContextTextMapPropagator(), trace.get_tracer("webhook-worker")


class Metrics:
    """The worker's Prometheus metrics, in a registry of its own. No label ever holds a URL, a
    secret or a payload; endpoint labels are names, for a bounded number of endpoints."""

    def __init__(self, tenant_label_limit: int = DEFAULT_TENANT_LABEL_LIMIT) -> None:
        self.registry = CollectorRegistry()
        self._tenant_reasons_seen: set[str] = set()
        self.tenant_label_limit = tenant_label_limit
        r = self.registry
        self.deliveries = Counter(
            "webhook_worker_deliveries",
            "Attempt outcomes written, by outcome and tenant (the first tenants by id, the rest as `other`).",
            ["outcome", "tenant"], registry=r)
        # Counting an outcome is a dict lookup, not a labels() call: the children by
        # (outcome, tenant name), made on a tenant's first outcome.
        self._outcome_counters: dict[tuple[str, str], Any] = {}
        # Every outcome's series exists from the start for the default tenant (a rate over a series
        # that appears late misses its first increments), and from a tenant's first count for the
        # others: all its outcomes at once, so the first increment of each is seen.
        self._add_tenant("default", 1)
        self.request_duration = Histogram(
            "webhook_worker_request_duration_seconds", "HTTP request duration, to the last byte read.",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30), registry=r)
        self.attempts_per_delivery = Histogram(
            "webhook_worker_attempts_per_delivery", "Attempts a delivery took, when it ended.",
            buckets=(1, 2, 3, 4, 5, 6, 8, 10, 15, 20), registry=r)
        self.in_flight = Gauge("webhook_worker_in_flight", "Requests in flight in this process.", registry=r)
        # The first sign that PostgreSQL runs out of CPU: its claims and finishes take longer
        # (docs/capacity.md; the WebhookDatabaseSlow alert).
        self.database_call_duration = Histogram(
            "webhook_worker_database_call_duration_seconds",
            "Duration of the worker's claims and outcome writes, by operation, for those that succeeded.",
            ["operation"], buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
            registry=r)
        for operation in ("claim", "finish"):  # by the names of database_errors' operations
            self.database_call_duration.labels(operation)
        self.claim_batch = Histogram(
            "webhook_worker_claim_batch_size", "Rows per claim that returned any.",
            buckets=(1, 2, 5, 10, 20, 50, 100, 200, 500, 1000), registry=r)
        self.digests = Counter(
            "webhook_worker_digests", "Digests sent: requests carrying several rows.", registry=r)
        self.digest_rows = Histogram(
            "webhook_worker_digest_rows", "Rows per digest sent.",
            buckets=(2, 5, 10, 20, 50, 100, 200, 500, 1000), registry=r)
        self.database_errors = Counter(
            "webhook_worker_database_errors", "Failed database calls, by operation.", ["operation"],
            registry=r)
        for operation in DATABASE_OPERATIONS:  # at zero from the start, like the outcomes above
            self.database_errors.labels(operation)
        self.queue_depth = Gauge(
            "webhook_worker_queue_depth", "Queue rows by status (sampled by one worker at a time).",
            ["status"], registry=r)
        self.oldest_due_age = Gauge(
            "webhook_worker_oldest_due_age_seconds",
            "Age of the oldest due, unclaimed delivery (sampled by one worker at a time).", registry=r)
        self.held_back = Gauge(
            "webhook_worker_held_back_deliveries",
            "Due deliveries left unclaimed on purpose, by reason (sampled by one worker at a time).",
            ["reason"], registry=r)
        self.circuit_state = Gauge(
            "webhook_worker_endpoint_circuit_state",
            "1 for each endpoint's current circuit state (a bounded number of endpoints).",
            ["endpoint", "state"], registry=r)
        self.tenant_queue_depth = Gauge(
            "webhook_worker_tenant_queue_depth",
            "Queue rows by tenant and status (sampled; the first tenants by id, the rest as `other`).",
            ["tenant", "status"], registry=r)
        # Retention (worker/daemon/maintenance.py): its rate set beside the delivered outcomes' says whether
        # it keeps pace, and purge_behind says when a round could not finish within its budget.
        self.purged_rows = Counter(
            "webhook_worker_purged_rows",
            "Rows retention removed, by kind: delivered queue rows, audit-log rows of the default partition.",
            ["kind"], registry=r)
        self._purged = {kind: self.purged_rows.labels(kind) for kind in PURGED_KINDS}
        self.purge_batches = Counter(
            "webhook_worker_purge_batches", "Retention batches run, each one transaction.", registry=r)
        self.purge_behind = Gauge(
            "webhook_worker_purge_behind",
            "1 when this process's last retention round ran out of its time budget with rows left.",
            registry=r)
        self.stats_sampled = Gauge(
            "webhook_worker_stats_last_sampled_timestamp_seconds",
            "When this process last sampled the queue statistics.", registry=r)

    def count_outcome(self, outcome: str, tenant: str = "default", tenant_rank: int = 1) -> None:
        """Count one attempt outcome written (one of DELIVERY_OUTCOMES) for the row's tenant."""
        counter = self._outcome_counters.get((outcome, tenant))
        if counter is None:
            self._add_tenant(tenant, tenant_rank)
            counter = self._outcome_counters[(outcome, tenant)]
        counter.inc()

    def count_purge(self, delivered_rows: int, log_rows: int) -> None:
        """Count one retention batch and what it removed."""
        self.purge_batches.inc()
        self._purged["delivered"].inc(delivered_rows)
        self._purged["log"].inc(log_rows)

    def _add_tenant(self, tenant: str, tenant_rank: int) -> None:
        label = tenant_label(tenant, tenant_rank, self.tenant_label_limit)
        for outcome in DELIVERY_OUTCOMES:
            self._outcome_counters[(outcome, tenant)] = self.deliveries.labels(outcome, label)

    def record_stats(self, stats: dict[str, Any]) -> None:
        for status in STATUSES:
            self.queue_depth.labels(status).set(stats.get("depth", {}).get(status, 0))
        self.oldest_due_age.set(stats.get("oldest_due_age_seconds") or 0)
        for reason in HELD_BACK_REASONS:
            self.held_back.labels(reason).set(stats.get("held_back", {}).get(reason, 0))
        for reason in TENANT_HELD_BACK_REASONS:
            if reason in stats.get("held_back", {}) or reason in self._tenant_reasons_seen:
                self._tenant_reasons_seen.add(reason)
                self.held_back.labels(reason).set(stats.get("held_back", {}).get(reason, 0))
        self.circuit_state.clear()
        for circuit in stats.get("circuits", []):
            for state in CIRCUIT_STATES:
                self.circuit_state.labels(circuit["endpoint"], state).set(
                    1 if circuit["state"] == state else 0)
        self.tenant_queue_depth.clear()
        by_tenant: dict[str, dict[str, int]] = {}
        for row in stats.get("tenants", []):
            by_tenant.setdefault(row["tenant"], {})[row["status"]] = row["deliveries"]
        for tenant, depth in by_tenant.items():
            for status in STATUSES:  # every status of a tenant with rows, zeros included
                self.tenant_queue_depth.labels(tenant, status).set(depth.get(status, 0))
        self.stats_sampled.set(time.time())


ReadyCheck = Callable[[], Awaitable[tuple[bool, dict[str, Any]]]]


class ProbeServer:
    """/health (liveness: the event loop answers), /ready, /startup and /metrics on one port."""

    def __init__(self, metrics: Metrics, ready: ReadyCheck, started: Callable[[], bool]) -> None:
        self._metrics = metrics
        self._ready = ready
        self._started = started
        self._runner: web.AppRunner | None = None
        self.port = 0

    async def start(self, host: str, port: int) -> int:
        app = web.Application()
        app.router.add_get("/health", self._health)
        app.router.add_get("/ready", self._ready_probe)
        app.router.add_get("/startup", self._startup)
        app.router.add_get("/metrics", self._metrics_page)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        server = site._server
        sockets = getattr(server, "sockets", None) or []
        self.port = sockets[0].getsockname()[1] if sockets else port
        return self.port

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _health(self, _request: web.Request) -> web.Response:
        # Answering at all proves the loop turns; the database is deliberately not consulted,
        # because restarting a worker would not bring the database back.
        return web.json_response({"status": "alive"})

    async def _ready_probe(self, _request: web.Request) -> web.Response:
        ready, details = await self._ready()
        return web.json_response({"ready": ready, **details}, status=200 if ready else 503)

    async def _startup(self, _request: web.Request) -> web.Response:
        started = self._started()
        return web.json_response({"started": started}, status=200 if started else 503)

    async def _metrics_page(self, _request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self._metrics.registry),
                            headers={"Content-Type": CONTENT_TYPE_LATEST})
