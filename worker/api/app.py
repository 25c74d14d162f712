"""The API process: the aiohttp application, token authentication, per-request roles, probes."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import os
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import orjson
import psycopg
import psycopg_pool
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest

from worker import schema
from worker.api import forwarded, serving, tokens
from worker.api.data import READY_TIMEOUT_SECONDS, Database, login_problems
from worker.api.limits import FailedAuthLimiter, Verdict
from worker.api.problems import Problem, forbidden, too_many_failed_authentications, unauthorized
from worker.api.tokens import Caller
from worker.config import Config
from worker.encryption import Keyring, KeyringError, load_keyring
from worker.observability import get_logger
from worker.shapes import json_default

# The API reads tokens' and sessions' tenants (sql/migrations/005_tenants.sql), endpoints'
# operational_all_tenants (006_operational_events_tenant.sql), switches to webhooks_admin for admin
# requests and rests as webhooks_authenticator (007_api_login.sql), and reads operations'
# cancelled_by and next_step_at (010_operation_cancel.sql), endpoints' description
# (013_endpoint_description.sql), and checks publishes against the event-type catalogue
# (015_self_service.sql); the worker needs less.
API_SCHEMA_VERSION = 15
# A tenant administrator (tenant_admin) reads, publishes and administers what admin does for
# endpoints, deliveries, dead letters and operations, kept to its tenant by PostgreSQL
# (webhooks_tenant_admin); the fleet's settings, tenants and tokens stay the unscoped admin's.
PUBLISH = ("producer", "admin", "tenant_admin")
READ = ("reader", "admin", "tenant_admin")
ADMIN = ("admin", "tenant_admin")
FLEET_READ = ("reader", "admin")
FLEET_ADMIN = ("admin",)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
# Paths under this prefix need a Bearer token; the probes and the console do not (the console has
# its own login and sessions). /metrics is served on a port of its own (create_metrics_app).
API_PREFIX = "/v1/"
CONSOLE_PREFIX = "/console"
PUBLIC_API_PATHS = frozenset({"/v1/openapi.json"})
# On every answer (the console sets its own, stricter set): an answer may carry a caller's data, so
# no cache keeps it, and a browser must not read a JSON document as HTML or script.
ANSWER_HEADERS = {"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"}
T = TypeVar("T")


class ApiMetrics:
    """The API's metrics. Labels are route patterns and reasons: never a token, id or query."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("webhook_api_requests", "API requests answered, by route, method and status.",
                                ["route", "method", "status"], registry=r)
        self.duration = Histogram("webhook_api_request_duration_seconds", "API request duration, by route.",
                                  ["route"], registry=r,
                                  buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
        self.failed_authentications = Counter(
            "webhook_api_failed_authentications",
            "Requests refused for their credentials, by reason (missing, invalid, rate_limited).",
            ["reason"], registry=r)
        for reason in ("missing", "invalid", "rate_limited"):
            self.failed_authentications.labels(reason)


@dataclass
class ApiState:
    """What every handler and the console share: configuration, database, keys, metrics, limits."""

    config: Config
    db: Database
    keyring: Keyring | None
    metrics: ApiMetrics = field(default_factory=ApiMetrics)
    limiter: FailedAuthLimiter = field(default_factory=lambda: FailedAuthLimiter(20))
    operations_wakeup: asyncio.Event = field(default_factory=asyncio.Event)
    # set when the process stops: the operations loop ends by itself, whatever a cancellation met
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    # peers whose X-Forwarded-For / Forwarded headers name the client (api.trusted_proxies)
    trusted_proxies: tuple[forwarded.Network, ...] = field(init=False)

    def __post_init__(self) -> None:
        self.trusted_proxies = forwarded.networks(self.config.api.trusted_proxies)

    async def check_credential(self, address: str, key: bytes | None,
                               lookup: Callable[[], Awaitable[T | None]],
                               reason: str = "invalid") -> Verdict[T]:
        """The limiter's verdict on a credential (worker.api.limits: a valid one always passes),
        failures counted in the metrics by `reason`, or as rate_limited past the limit."""
        verdict = await self.limiter.check(address, key, lookup)
        if verdict.found is None:
            limited = verdict.retry_after is not None
            self.metrics.failed_authentications.labels("rate_limited" if limited else reason).inc()
        return verdict

    async def verify_token(self, token: str, address: str) -> Caller:
        """The caller a token stands for; raises a Problem (401 for a token that is malformed,
        unknown, revoked or expired; 429 for one of those from an address locked out for failing
        too often). A valid token is served whatever the address did. For the console's login too."""

        async def lookup() -> Caller | None:
            async with self.db.connection() as conn:
                return await tokens.verify(conn, token)

        key = tokens.token_hash(token) if tokens.well_formed(token) else None
        verdict = await self.check_credential(address, key, lookup)
        if verdict.found is not None:
            return verdict.found
        if verdict.retry_after is not None:
            raise too_many_failed_authentications(verdict.retry_after)
        raise unauthorized("the token is not valid (unknown, revoked or expired)")

    async def authenticate(self, request: web.Request) -> Caller:
        """The caller of an API request, from its `Authorization: Bearer` header."""
        address = client_address(request)
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            verdict: Verdict[None] = await self.check_credential(address, None, _nothing, reason="missing")
            if verdict.retry_after is not None:
                raise too_many_failed_authentications(verdict.retry_after)
            raise unauthorized("an `Authorization: Bearer <token>` header is required")
        return await self.verify_token(token.strip(), address)


async def _nothing() -> None:
    return None


STATE = web.AppKey("webhook_api_state", ApiState)
CALLER = web.RequestKey("webhook_api_caller", Caller)


def client_address(request: web.Request) -> str:
    """The address a request's failures count against: the peer, or behind a proxy listed in
    api.trusted_proxies the client its X-Forwarded-For or Forwarded header names."""
    headers, trusted = request.headers, request.config_dict[STATE].trusted_proxies
    return forwarded.client_address(request.remote, headers.getall("X-Forwarded-For", []),
                                    headers.getall("Forwarded", []), trusted)


def caller_of(request: web.Request) -> Caller:
    return request[CALLER]


def allow(*roles: str) -> Callable[[Handler], Handler]:
    """The token roles that may call a handler; a handler without one is refused to everyone."""

    def mark(handler: Handler) -> Handler:
        handler.allowed_roles = roles  # type: ignore[attr-defined]
        return handler

    return mark


def _route_label(request: web.Request) -> str:
    resource = request.match_info.route.resource
    return resource.canonical if resource is not None else "unmatched"


@web.middleware
async def api_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Authentication and role checks for /v1, problem documents for every error, metrics, and
    headers that keep answers out of caches and from being sniffed as something else."""
    state = request.app[STATE]
    started = time.monotonic()
    route = _route_label(request)
    status = 500
    try:
        response = await _answer(request, handler, route)
        status = response.status
        if not response.prepared:
            for name, value in ANSWER_HEADERS.items():
                response.headers.setdefault(name, value)
        return response
    except web.HTTPException as exc:
        status = exc.status
        raise
    finally:
        state.metrics.requests.labels(route, request.method, str(status)).inc()
        state.metrics.duration.labels(route).observe(time.monotonic() - started)


async def _answer(request: web.Request, handler: Handler, route: str) -> web.StreamResponse:
    state = request.app[STATE]
    try:
        if request.path.startswith(API_PREFIX) and request.path not in PUBLIC_API_PATHS \
                and request.match_info.http_exception is None:
            caller = await state.authenticate(request)
            allowed: tuple[str, ...] = getattr(request.match_info.route.handler, "allowed_roles", ())
            if caller.role not in allowed:
                raise forbidden(caller.role, allowed or ("no role",))
            request[CALLER] = caller
        return await handler(request)
    except Problem as problem:
        return problem.response(request.path)
    except web.HTTPException as exc:
        if exc.status < 400 or not request.path.startswith(API_PREFIX):
            raise
        # RFC 9110 15.5.6: a 405 says which methods the resource has
        headers = {"Allow": ", ".join(sorted(exc.allowed_methods))} \
            if isinstance(exc, web.HTTPMethodNotAllowed) else None
        answer = Problem(exc.status, _kind(exc.status), exc.reason, _detail(exc, request), headers=headers)
        return answer.response(request.path)
    except psycopg.errors.DataError as exc:
        # class 22: a value the database cannot take (out of range, a character it cannot store).
        # Each field's bounds are checked before SQL; this keeps anything they miss a 422, not a 500.
        # The primary message only: a DETAIL may quote the row.
        get_logger().warning("api request refused by the database", route=route, sqlstate=exc.sqlstate)
        return Problem(422, "invalid-field", "A field is invalid",
                       f"(body): {exc.diag.message_primary or 'a value the database cannot store'}",
                       field="(body)").response(request.path)
    except (psycopg.OperationalError, psycopg_pool.PoolTimeout):
        get_logger().warning("api database unreachable", route=route)
        return Problem(503, "database-unavailable", "The database is unreachable",
                       "try again shortly", headers={"Retry-After": "5"}).response(request.path)
    except Exception as exc:  # noqa: BLE001 - one request's failure must not end the process
        # the type and the server's primary message only: a DETAIL may quote a row, credentials included
        message = exc.diag.message_primary if isinstance(exc, psycopg.Error) else None
        get_logger().error("api request failed", route=route, method=request.method,
                           error=type(exc).__name__, message=message)
        return Problem(500, "internal", "Internal error", "the request failed; the API's log says why"
                       ).response(request.path)


def _kind(status: int) -> str:
    return {404: "not-found", 405: "method-not-allowed", 413: "body-too-large"}.get(status, "http-error")


def _detail(exc: web.HTTPException, request: web.Request) -> str:
    if exc.status == 404:
        return f"{request.path}: no such route"
    if exc.status == 405:
        return f"{request.method} is not allowed on {request.path}"
    if exc.status == 413:
        return f"the request body exceeds {request.app[STATE].config.api.max_body_bytes} bytes"
    return exc.text or exc.reason


async def _health(_request: web.Request) -> web.Response:
    # Answering proves the loop turns; the database is not consulted (a restart would not fix it).
    return web.json_response({"status": "alive"})


async def _ready(request: web.Request) -> web.Response:
    state = request.app[STATE]
    try:
        async with asyncio.timeout(READY_TIMEOUT_SECONDS), state.db.connection(READY_TIMEOUT_SECONDS) as conn:
            cur = await conn.execute("SELECT webhooks.schema_version()")
            row = await cur.fetchone()
    except (psycopg.Error, psycopg_pool.PoolTimeout, TimeoutError) as exc:
        return web.json_response({"ready": False, "database": f"unreachable: {type(exc).__name__}"},
                                 status=503)
    version = None if row is None else row[0]
    low = max(API_SCHEMA_VERSION, schema.MIN_SUPPORTED_VERSION)
    if version is None or not low <= version <= schema.MAX_SUPPORTED_VERSION:
        return web.json_response({"ready": False, "schema_version": version,
                                  "supported": [low, schema.MAX_SUPPORTED_VERSION]}, status=503)
    return web.json_response({"ready": True, "schema_version": version})


async def _metrics(request: web.Request) -> web.Response:
    return web.Response(body=generate_latest(request.app[STATE].metrics.registry),
                        headers={"Content-Type": CONTENT_TYPE_LATEST})


def create_metrics_app(state: ApiState) -> web.Application:
    """/metrics alone, served on api.metrics_port: request counts per route and status tell who
    calls what, so the public port does not serve them (it answers 404)."""
    app = web.Application(middlewares=[serving.track_requests])
    app[STATE] = state
    app.router.add_get("/metrics", _metrics)
    return app


def json_response(data: Any, status: int = 200, location: str | None = None) -> web.Response:
    """A JSON answer; `location`, for a 201 or 202, is where what it made can be read (RFC 9110 10.2.2)."""
    headers = None if location is None else {"Location": location}
    return web.Response(status=status, body=orjson.dumps(data, default=json_default),
                        content_type="application/json", headers=headers)


def create_app(
    state: ApiState, console: Callable[[ApiState], web.Application] | None = None
) -> web.Application:
    """The API application; `console`, when given, builds the sub-application mounted at /console/."""
    from worker.api import routes

    # track_requests outermost (a request's head has arrived once it runs), body_deadline innermost
    # (after authentication, and its 408 becomes a problem document): worker/api/serving.py
    middlewares = [serving.track_requests, api_middleware, serving.body_deadline]
    app = web.Application(middlewares=middlewares, client_max_size=state.config.api.max_body_bytes)
    app[STATE] = state
    app[serving.GUARD] = serving.ConnectionGuard(state.config.api, state.metrics.registry)
    app.router.add_get("/health", _health)
    app.router.add_get("/ready", _ready)
    routes.add_routes(app)
    if console is not None:
        app.add_subapp(CONSOLE_PREFIX, console(state))
    app.on_startup.append(_start_background)
    app.on_cleanup.append(_stop_background)
    return app


BACKGROUND = web.AppKey("webhook_api_background", list[asyncio.Task[None]])
# How often the start-up check of the login asks again while the database is unreachable.
LOGIN_CHECK_RETRY_SECONDS = 5.0


async def check_login(state: ApiState) -> None:
    """Once the database answers with the group roles made, say loudly what is wrong with the login
    the API runs as: the schema owner, a superuser or CREATEROLE (the API still serves: existing
    deployments run so), or a group role it cannot switch to (those requests fail until granted)."""
    log = get_logger()
    while not state.stopping.is_set():
        try:
            async with state.db.connection() as conn:
                problems = await login_problems(conn)
        except (psycopg.Error, psycopg_pool.PoolTimeout, TimeoutError):
            problems = None
        if problems is None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(LOGIN_CHECK_RETRY_SECONDS):
                    await state.stopping.wait()
            continue
        for problem, missing in problems:
            if missing:
                log.error("api login lacks a group role", problem=problem,
                          advice="docs/security.md, HTTP API")
            else:
                log.warning("api login has more rights than it needs", problem=problem,
                            advice="give the API a login of its own (docs/security.md, HTTP API)")
        log.info("api login checked", problems=len(problems))
        return


async def _start_background(app: web.Application) -> None:
    from worker.api.operations import run_operations

    app[BACKGROUND] = [asyncio.create_task(run_operations(app[STATE])),
                       asyncio.create_task(check_login(app[STATE]))]


async def _stop_background(app: web.Application) -> None:
    app[STATE].stopping.set()
    app[STATE].operations_wakeup.set()
    for task in app[BACKGROUND]:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    await app[STATE].db.close()


def console_factory() -> Callable[[ApiState], web.Application] | None:
    """The console's sub-application factory, when the console is installed (worker.console)."""
    try:
        console = importlib.import_module("worker.console")
    except ModuleNotFoundError as exc:
        if exc.name != "worker.console":
            raise  # the console is there but broken: say so rather than serve without it
        return None
    factory: Callable[[ApiState], web.Application] = console.create_console_app
    return factory


def build_state(config: Config) -> ApiState:
    try:
        keyring: Keyring | None = load_keyring(config.security.encryption_keys_file, os.environ)
    except KeyringError as exc:
        # Reads and publishing need no key; registering or changing an endpoint answers 503 until one is set.
        get_logger().warning("api without encryption keys: endpoint changes are refused", reason=str(exc))
        keyring = None
    db = Database.create(config.database.url, config.database.pool_min_size, config.database.pool_max_size,
                         config.database.connect_timeout_seconds)
    return ApiState(config, db, keyring, limiter=FailedAuthLimiter(config.api.failed_auth_per_minute))


async def serve(config: Config) -> None:
    """Run the API until SIGTERM or SIGINT."""
    state = build_state(config)
    await state.db.open()
    app = create_app(state, console_factory())
    listeners = serving.Listeners(config.api, app, create_metrics_app(state),
                                  serving.RESERVED_FILES + config.database.pool_max_size)
    await listeners.start()
    get_logger().info("api listening", host=config.api.host, port=listeners.port,
                      metrics_port=listeners.metrics_port)
    stopped = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stopped.set)
    await stopped.wait()
    get_logger().info("api stopping")
    await listeners.stop()
