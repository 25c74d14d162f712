"""The API process: the aiohttp application, token authentication, per-request roles, probes."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Awaitable, Callable

import psycopg
import psycopg_pool
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from worker import schema
from worker.api import openapi, routes, serving
from worker.api.declare import Route, route_of
from worker.api.replay_runner import run_operations
from worker.config import Config
from worker.encryption import Keyring, KeyringError, load_keyring
from worker.observability import get_logger
from worker.runtime import cancel_and_wait
from worker.store.database import READY_TIMEOUT_SECONDS, Database, login_problems, schema_version
from worker.web.context import CALLER, CREDENTIAL, DOCUMENT, STATE, ApiState, Credential
from worker.web.limits import FailedAuthLimiter
from worker.web.problems import ANSWER_HEADERS, Problem, forbidden

# The API reads tokens' and sessions' tenants (sql/migrations/005_tenants.sql), endpoints'
# operational_all_tenants (006_operational_events_tenant.sql), switches to webhooks_admin for admin
# requests and rests as webhooks_authenticator (007_api_login.sql), and reads operations'
# cancelled_by and next_step_at (010_operation_cancel.sql), deletes endpoints into
# deleted_endpoints (012_endpoint_deletion.sql), reads endpoints' description
# (013_endpoint_description.sql), and checks publishes against the event-type catalogue
# (015_self_service.sql), opens portal links (017_portal_links.sql), and publishes in a statement
# that checks its token (018_api_publish_round_trips.sql); the worker needs less.
API_SCHEMA_VERSION = 18
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
# Paths under this prefix need a Bearer token; the probes and the console do not (the console has
# its own login and sessions). /metrics is served on a port of its own (create_metrics_app).
API_PREFIX = "/v1/"
CONSOLE_PREFIX = "/console"
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
        declared = route_of(request.match_info.route.handler)
        if request.path.startswith(API_PREFIX) and request.match_info.http_exception is None \
                and not (declared is not None and declared.public):
            if declared is not None and declared.token_checked_by_handler:
                credential = state.credential_of(request, declared.roles)
                if credential is not None:
                    return await _answer_checking_token_in_handler(request, handler, credential, declared)
            await _authenticate(request, declared)
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


async def _authenticate(request: web.Request, declared: Route | None) -> None:
    """The caller of a /v1 request, allowed by its route's roles, or a Problem (401, 403, 429)."""
    caller = await request.app[STATE].authenticate(request)
    # the roles the route's declaration names; a /v1 handler without one is refused to everyone
    allowed = () if declared is None else declared.roles
    if caller.role not in allowed:
        raise forbidden(caller.role, allowed or ("no role",))
    request[CALLER] = caller


async def _answer_checking_token_in_handler(request: web.Request, handler: Handler, credential: Credential,
                                          declared: Route) -> web.StreamResponse:
    """A route whose token is checked with what it reads first (Route.token_checked_by_handler), when
    the token passed within the failed-authentication window; any other is checked on its own first,
    before anything of the request is read. What the token is answered comes first, as on any route:
    a handler that refused its input, or answered, before it checked the token has the token checked
    on its own first."""
    request[CREDENTIAL] = credential
    if not request.app[STATE].limiter.passed_recently(credential.token_hash):
        # A made-up token of the right shape gets its 401 before its body is read, parsed or checked
        # against a schema; a locked-out address's guesses are looked up one at a time (check()).
        await _authenticate(request, declared)
        credential.settled = True
    try:
        response = await handler(request)
    except (Problem, web.HTTPException):
        if not credential.settled:
            await _authenticate(request, declared)
        raise
    if not credential.settled:
        await _authenticate(request, declared)
    return response


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
            version = await schema_version(conn)
    except (psycopg.Error, psycopg_pool.PoolTimeout, TimeoutError) as exc:
        return web.json_response({"ready": False, "database": f"unreachable: {type(exc).__name__}"},
                                 status=503)
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


def create_app(
    state: ApiState, console: Callable[[ApiState], web.Application] | None = None
) -> web.Application:
    """The API application; `console`, when given, builds the sub-application mounted at /console/."""
    # track_requests outermost (a request's head has arrived once it runs), body_deadline innermost
    # (after authentication, and its 408 becomes a problem document): worker/api/serving.py
    middlewares = [serving.track_requests, api_middleware, serving.body_deadline]
    app = web.Application(middlewares=middlewares, client_max_size=state.config.api.max_body_bytes)
    app[STATE] = state
    app[DOCUMENT] = openapi.document()
    app[serving.GUARD] = serving.ConnectionGuard.public(state.config.api, state.metrics.registry)
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
    app[BACKGROUND] = [asyncio.create_task(run_operations(app[STATE])),
                       asyncio.create_task(check_login(app[STATE]))]


async def _stop_background(app: web.Application) -> None:
    app[STATE].stopping.set()
    app[STATE].operations_wakeup.set()
    background: list[asyncio.Task[None]] = app[BACKGROUND]
    await cancel_and_wait(background)
    await app[STATE].schema_checks.close()
    await app[STATE].db.close()


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


async def serve(config: Config, console: Callable[[ApiState], web.Application] | None = None) -> None:
    """Run the API until SIGTERM or SIGINT; `console`, when given, builds the sub-application mounted
    at /console/ (the `api` command gives the console's)."""
    state = build_state(config)
    await state.db.open()
    app = create_app(state, console)
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
