"""The API's listening sockets: deadlines for request heads and bodies, caps on connections in total
and per client address, and the separate port for /metrics."""

from __future__ import annotations

import asyncio
import os
import resource
from collections import Counter as Tally
from collections.abc import Awaitable, Callable
from typing import cast

from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from prometheus_client import CollectorRegistry, Counter, Gauge

from worker import runtime
from worker.config import ApiConfig
from worker.errors import ConfigError
from worker.observability import get_logger

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

# Written, before closing, to a connection that is not served, so the client reads why rather than
# guessing from a bare close (as servers send a 408 before closing a connection that idled, RFC 9110).
BUSY = b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nContent-Length: 0\r\nRetry-After: 1\r\n\r\n"
TOO_SLOW = b"HTTP/1.1 408 Request Timeout\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
# Open files the process needs besides client connections: the listeners, logs, the event loop,
# DNS, and (added to this) the database pool; about a dozen were measured. A connection cap above
# what the open-file limit leaves is no cap: accept() fails first ("out of system resource"), stops
# accepting for a second, and valid clients time out.
RESERVED_FILES = 32
# Connections waiting to be accepted, per listener. asyncio accepts up to this many at once, each
# taking a file before the guard can refuse it, so these count among the reserved files too.
BACKLOG = 128
METRICS_BACKLOG = 8  # one scraper at a time
# After an answer sent before the whole body was read (a 401, a 408, a 413), aiohttp reads and drops
# the rest for this long at most, so the client can read the answer before the connection closes.
MAX_LINGER_SECONDS = 5.0


class ConnectionGuard:
    """Counts the open connections, in total and per client address, for both ports; holds the
    deadlines every connection keeps, and their metrics."""

    def __init__(self, config: ApiConfig, registry: CollectorRegistry) -> None:
        self.max_connections = config.max_connections
        self.max_per_address = config.max_connections_per_address
        self.head_timeout = config.head_timeout_seconds
        self.body_timeout = config.body_timeout_seconds
        self.open = 0
        self.by_address: Tally[str] = Tally()
        gauge = Gauge("webhook_api_connections", "Client connections open (both ports).", registry=registry)
        gauge.set_function(lambda: self.open)
        self.refused = Counter("webhook_api_connections_refused",
                               "Connections answered 503 and closed at once, by the cap they would "
                               "have passed (total, per_address).", ["cap"], registry=registry)
        self.timeouts = Counter("webhook_api_request_timeouts",
                                "Requests whose head or body did not arrive in time, by part (head, body).",
                                ["part"], registry=registry)
        for cap in ("total", "per_address"):
            self.refused.labels(cap)
        for part in ("head", "body"):
            self.timeouts.labels(part)

    def admit(self, address: str) -> bool:
        """Count a new connection from this address, unless it would pass a cap."""
        if self.open >= self.max_connections:
            self.refused.labels("total").inc()
            return False
        if self.by_address[address] >= self.max_per_address:
            self.refused.labels("per_address").inc()
            return False
        self.open += 1
        self.by_address[address] += 1
        return True

    def release(self, address: str) -> None:
        self.open -= 1
        self.by_address[address] -= 1
        if not self.by_address[address]:
            del self.by_address[address]


GUARD = web.AppKey("webhook_api_connection_guard", ConnectionGuard)


class GuardedConnection(asyncio.Protocol):
    """aiohttp's protocol for one connection, wrapped to keep the caps and the head deadline.

    aiohttp has no deadline for a request head: a connection that never completes one is closed only
    by the keep-alive timer (3630 s by default), so a few hundred of them exhaust the process's
    files. The wrapper starts the head's clock when the connection opens and when the first byte of
    a later request arrives (as Go's ReadHeaderTimeout does), and stops it when a request reaches the
    application (`track_requests` tells it). Between requests an idle connection is aiohttp's
    keep-alive timer's (api.keepalive_timeout_seconds). Wrapping rather than subclassing keeps
    aiohttp's handler exactly as aiohttp builds it; everything is passed on.
    """

    def __init__(self, inner: RequestHandler, guard: ConnectionGuard) -> None:
        self._inner = inner
        self._guard = guard
        self._transport: asyncio.Transport | None = None
        self._address = ""
        self._admitted = False
        self._head_clock: asyncio.TimerHandle | None = None
        self._in_request = False
        self._answered = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)
        peer = transport.get_extra_info("peername")
        self._address = str(peer[0]) if peer else "unknown"
        if not self._guard.admit(self._address):
            # closed before aiohttp sees it, so it costs a file for a moment and nothing else
            self._transport.write(BUSY)
            self._transport.close()
            return
        self._admitted = True
        self._start_head_clock()
        self._inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if not self._admitted:
            return
        if not self._in_request and self._head_clock is None:
            self._start_head_clock()
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        # aiohttp's answer is None (close the transport once the peer has finished sending)
        if self._admitted:
            self._inner.eof_received()
        return None

    def pause_writing(self) -> None:
        if self._admitted:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._admitted:
            self._inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_head_clock()
        if self._admitted:
            self._admitted = False
            self._guard.release(self._address)
            self._inner.connection_lost(exc)

    def request_started(self) -> None:
        self._in_request = True
        self._stop_head_clock()

    def request_finished(self) -> None:
        self._in_request = False
        self._answered += 1

    def _start_head_clock(self) -> None:
        loop = asyncio.get_running_loop()
        self._head_clock = loop.call_later(self._guard.head_timeout, self._head_overdue)

    def _stop_head_clock(self) -> None:
        if self._head_clock is not None:
            self._head_clock.cancel()
            self._head_clock = None

    def _head_overdue(self) -> None:
        self._head_clock = None
        transport = self._transport
        if transport is None or transport.is_closing() or self._in_request:
            return
        self._guard.timeouts.labels("head").inc()
        if not self._answered:
            # nothing was written on this connection yet, so the 408 cannot land inside an answer
            transport.write(TOO_SLOW)
        transport.close()


class GuardedSite(web.BaseSite):
    """A TCP listener (as web.TCPSite) whose connections pass through the guard."""

    def __init__(self, runner: web.BaseRunner, host: str, port: int, guard: ConnectionGuard,
                 backlog: int) -> None:
        super().__init__(runner, backlog=backlog)
        self._host = host
        self._port = port
        self._guard = guard
        self.port = port  # the port bound, once started (port 0 picks a free one)

    @property
    def name(self) -> str:
        return f"http://{self._host}:{self.port}"

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        assert server is not None  # BaseSite refuses a runner that was not set up
        guard = self._guard
        listening = await asyncio.get_running_loop().create_server(
            lambda: GuardedConnection(server(), guard), self._host, self._port, backlog=self._backlog,
            reuse_address=True)
        self._server = listening
        if listening.sockets:
            self.port = int(listening.sockets[0].getsockname()[1])


def _connection(request: web.Request) -> GuardedConnection | None:
    transport = request.transport
    protocol = transport.get_protocol() if transport is not None else None
    return protocol if isinstance(protocol, GuardedConnection) else None


@web.middleware
async def track_requests(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Stops the head's clock once a request reaches the application. The outermost middleware: the
    clock must stop before anything slow (authentication asks the database)."""
    connection = _connection(request)
    if connection is not None:
        connection.request_started()
    try:
        return await handler(request)
    finally:
        if connection is not None:
            connection.request_finished()


@web.middleware
async def body_deadline(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Reads the whole body within api.body_timeout_seconds before the handler runs, or answers 408.

    aiohttp reads a body only as fast as the client sends it, with no deadline; reading it here, once
    for every route (handlers and the console's forms get it from aiohttp's cache), keeps one rule in
    one place. It runs inside the API's middleware, after authentication (a caller without a valid
    token is refused before its body is read) and so that a 408 is a problem document like every
    other error.
    """
    if request.body_exists and request.match_info.http_exception is None:
        guard = request.config_dict[GUARD]
        try:
            async with asyncio.timeout(guard.body_timeout):
                await request.read()
        except TimeoutError:
            guard.timeouts.labels("body").inc()
            raise web.HTTPRequestTimeout(
                text=f"the request body did not arrive within {guard.body_timeout:g} s") from None
    return await handler(request)


def fit_to_open_files(wanted: int, reserved: int) -> int:
    """The connection cap the open-file limit allows: the soft limit is raised to the hard one, as
    the worker raises it, and the cap lowered (with a warning) when even that leaves fewer than
    `wanted` files besides the `reserved` ones."""
    raised = runtime.raise_open_files_limit()
    if raised is not None:
        get_logger().info("open-files soft limit raised", before=raised[0], after=raised[1])
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= wanted + reserved:
        return wanted
    allowed = max(1, soft - reserved)
    get_logger().warning("api.max_connections lowered to what the open-file limit leaves",
                         max_connections=wanted, allowed=allowed, open_file_limit=soft)
    return allowed


class Listeners:
    """The public port (api.port) and the metrics port (api.metrics_port), started and stopped
    together; one guard counts the connections of both."""

    def __init__(self, config: ApiConfig, app: web.Application, metrics_app: web.Application,
                 reserved_files: int = RESERVED_FILES) -> None:
        self._config = config
        self._apps = ((app, config.port, "api.port", BACKLOG),
                      (metrics_app, config.metrics_port, "api.metrics_port", METRICS_BACKLOG))
        self._guard = app[GUARD]
        self._reserved_files = reserved_files
        self._runners: list[web.AppRunner] = []
        self.port = 0
        self.metrics_port = 0

    async def start(self) -> None:
        config = self._config
        reserved = self._reserved_files + BACKLOG + METRICS_BACKLOG
        self._guard.max_connections = fit_to_open_files(config.max_connections, reserved)
        ports = []
        for app, port, key, backlog in self._apps:
            runner = web.AppRunner(app, access_log=None, handle_signals=False,
                                   keepalive_timeout=config.keepalive_timeout_seconds,
                                   lingering_time=min(config.body_timeout_seconds, MAX_LINGER_SECONDS))
            await runner.setup()
            self._runners.append(runner)
            site = GuardedSite(runner, config.host, port, self._guard, backlog)
            try:
                await site.start()
            except OSError as exc:
                await self.stop()
                # asyncio's strerror repeats the address; the errno's text alone names the problem
                reason = os.strerror(exc.errno) if exc.errno else str(exc)
                raise ConfigError(f"{key}: cannot listen on {config.host}:{port}: {reason}") from None
            ports.append(site.port)
        self.port, self.metrics_port = ports

    async def stop(self) -> None:
        # the metrics port first: the API's own cleanup closes the database last
        while self._runners:
            await self._runners.pop().cleanup()
