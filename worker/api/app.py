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
from typing import Any

import orjson
import psycopg
import psycopg_pool
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest

from worker import schema
from worker.api import tokens
from worker.api.data import Database, login_problems
from worker.api.limits import FailedAuthLimiter
from worker.api.problems import Problem, forbidden, too_many_failed_authentications, unauthorized
from worker.api.tokens import Caller
from worker.config import Config
from worker.encryption import Keyring, KeyringError, load_keyring
from worker.observability import get_logger

# The API switches to webhooks_admin for admin requests and rests as webhooks_authenticator
# (sql/migrations/007_api_login.sql); the worker needs less.
API_SCHEMA_VERSION = 7
PUBLISH = ("producer", "admin")
READ = ("reader", "admin")
ADMIN = ("admin",)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
# Paths under this prefix need a Bearer token; the probes, /metrics and the console do not (the
# console has its own login and sessions).
API_PREFIX = "/v1/"
CONSOLE_PREFIX = "/console"
PUBLIC_API_PATHS = frozenset({"/v1/openapi.json"})


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

    async def verify_token(self, token: str, address: str) -> Caller:
        """The caller a token stands for; raises a Problem (429 while this address is locked out
        for failing too often, 401 for a token that is unknown, revoked or expired). Every failure
        counts against the address. For the console's login too."""
        retry_after = self.limiter.retry_after(address)
        if retry_after is not None:
            self.metrics.failed_authentications.labels("rate_limited").inc()
            raise too_many_failed_authentications(retry_after)
        async with self.db.connection() as conn:
            caller = await tokens.verify(conn, token)
        if caller is None:
            self.limiter.failed(address)
            self.metrics.failed_authentications.labels("invalid").inc()
            raise unauthorized("the token is not valid (unknown, revoked or expired)")
        return caller

    async def authenticate(self, request: web.Request) -> Caller:
        """The caller of an API request, from its `Authorization: Bearer` header."""
        address = client_address(request)
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            retry_after = self.limiter.retry_after(address)
            if retry_after is not None:
                self.metrics.failed_authentications.labels("rate_limited").inc()
                raise too_many_failed_authentications(retry_after)
            self.limiter.failed(address)
            self.metrics.failed_authentications.labels("missing").inc()
            raise unauthorized("an `Authorization: Bearer <token>` header is required")
        return await self.verify_token(token.strip(), address)


STATE = web.AppKey("webhook_api_state", ApiState)
CALLER = web.RequestKey("webhook_api_caller", Caller)


def client_address(request: web.Request) -> str:
    # The peer address: a forwarded header is not trusted (anyone can send one and dodge the limit).
    return request.remote or "unknown"


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
    """Authentication and role checks for /v1, problem documents for every error, metrics."""
    state = request.app[STATE]
    started = time.monotonic()
    route = _route_label(request)
    status = 500
    try:
        if request.path.startswith(API_PREFIX) and request.path not in PUBLIC_API_PATHS \
                and request.match_info.http_exception is None:
            caller = await state.authenticate(request)
            allowed: tuple[str, ...] = getattr(request.match_info.route.handler, "allowed_roles", ())
            if caller.role not in allowed:
                raise forbidden(caller.role, allowed or ("no role",))
            request[CALLER] = caller
        response = await handler(request)
        status = response.status
        return response
    except Problem as problem:
        status = problem.status
        return problem.response(request.path)
    except web.HTTPException as exc:
        status = exc.status
        if exc.status < 400 or not request.path.startswith(API_PREFIX):
            raise
        answer = Problem(exc.status, _kind(exc.status), exc.reason, _detail(exc, request))
        return answer.response(request.path)
    except (psycopg.OperationalError, psycopg_pool.PoolTimeout):
        status = 503
        get_logger().warning("api database unreachable", route=route)
        return Problem(503, "database-unavailable", "The database is unreachable",
                       "try again shortly", headers={"Retry-After": "5"}).response(request.path)
    except Exception as exc:  # noqa: BLE001 - one request's failure must not end the process
        status = 500
        # the type and the server's primary message only: a DETAIL may quote a row, credentials included
        message = exc.diag.message_primary if isinstance(exc, psycopg.Error) else None
        get_logger().error("api request failed", route=route, method=request.method,
                           error=type(exc).__name__, message=message)
        return Problem(500, "internal", "Internal error", "the request failed; the API's log says why"
                       ).response(request.path)
    finally:
        state.metrics.requests.labels(route, request.method, str(status)).inc()
        state.metrics.duration.labels(route).observe(time.monotonic() - started)


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
        async with state.db.connection() as conn:
            cur = await conn.execute("SELECT webhooks.schema_version()")
            row = await cur.fetchone()
    except (psycopg.Error, TimeoutError) as exc:
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


def json_response(data: Any, status: int = 200) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(data, default=str), content_type="application/json")


def create_app(
    state: ApiState, console: Callable[[ApiState], web.Application] | None = None
) -> web.Application:
    """The API application; `console`, when given, builds the sub-application mounted at /console/."""
    from worker.api import routes

    app = web.Application(middlewares=[api_middleware], client_max_size=state.config.api.max_body_bytes)
    app[STATE] = state
    app.router.add_get("/health", _health)
    app.router.add_get("/ready", _ready)
    app.router.add_get("/metrics", _metrics)
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
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, config.api.host, config.api.port)
    await site.start()
    sockets = getattr(site._server, "sockets", None) or []
    port = sockets[0].getsockname()[1] if sockets else config.api.port
    get_logger().info("api listening", host=config.api.host, port=port)
    stopped = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stopped.set)
    await stopped.wait()
    get_logger().info("api stopping")
    await runner.cleanup()
