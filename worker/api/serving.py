"""The API's listening sockets: deadlines for request heads and bodies, caps on connections in total
and per client address, and the separate port for /metrics."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import resource
import socket
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
# Connections waiting to be accepted, per listener (the kernel's queue: they hold no file of ours).
BACKLOG = 128
METRICS_BACKLOG = 8  # one scraper at a time
# Connections accepted per turn of the event loop, so that a flood does not starve requests. A
# refused one is answered and closed as it is accepted: it never holds a file past that moment.
ACCEPT_PER_TURN = 64
# After accept() found no file left (which the caps should prevent): accept again after this long.
ACCEPT_RETRY_SECONDS = 1.0
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

    def __init__(self, inner: RequestHandler, guard: ConnectionGuard, address: str) -> None:
        """For a connection the guard has admitted (counted) from this address."""
        self._inner = inner
        self._guard = guard
        self._transport: asyncio.Transport | None = None
        self._address = address
        self._admitted = True
        self._head_clock: asyncio.TimerHandle | None = None
        self._in_request = False
        self._answered = 0
        # A body that missed its deadline is answered 408 and its connection ends after aiohttp's
        # linger: what still trickles in is the old body's rest, not a new request's head.
        self._body_abandoned = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)
        self._start_head_clock()
        self._inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if not self._admitted:
            return
        if not self._in_request and self._head_clock is None and not self._body_abandoned:
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
            self.release()
            self._inner.connection_lost(exc)

    def abandon(self) -> bool:
        """Uncount a connection whose transport was never made; whether it was such a one."""
        if self._transport is not None:
            return False
        self.release()
        return True

    def release(self) -> None:
        """Uncount the connection (once)."""
        if self._admitted:
            self._admitted = False
            self._guard.release(self._address)

    def request_started(self) -> None:
        self._in_request = True
        self._stop_head_clock()

    def body_abandoned(self) -> None:
        self._body_abandoned = True

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
    """A TCP listener (as web.TCPSite) whose connections pass through the guard as they are accepted.

    It accepts by itself rather than through asyncio's create_server: asyncio accepts a backlog's
    worth of sockets at once and hands each to its protocol a turn or two later, so a flood's refused
    connections held files across several bursts and accept() ran out of them ("out of system
    resource": a second without accepting, valid clients timing out). Here a refused connection is
    answered 503 and closed the moment it is accepted; only admitted ones, which the caps bound, hold
    a file."""

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
        loop = asyncio.get_running_loop()
        # an empty host is every interface, as asyncio's create_server takes it
        infos = await loop.getaddrinfo(self._host or None, self._port, type=socket.SOCK_STREAM,
                                       flags=socket.AI_PASSIVE)
        server = Accepting(self._runner, self._guard)
        self._server = server
        try:
            for family, kind, proto, _, address in dict.fromkeys(infos):
                try:
                    sock = socket.socket(family, kind, proto)
                except OSError:
                    continue  # a family this kernel does not offer (IPv6 off), skipped as asyncio does
                server.sockets_held.append(sock)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if family == socket.AF_INET6:
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)  # IPv4 has its own
                sock.bind(address)
                sock.listen(self._backlog)
                sock.setblocking(False)
            if not server.sockets_held:
                raise OSError(errno.EAFNOSUPPORT, f"no address of {self._host!r} can be listened on")
        except OSError:
            server.close()
            raise
        await server.start_serving()
        self.port = int(server.sockets_held[0].getsockname()[1])


class Accepting(asyncio.AbstractServer):
    """The listening sockets of one GuardedSite and their accepting (what aiohttp's runner closes)."""

    def __init__(self, runner: web.BaseRunner, guard: ConnectionGuard) -> None:
        self._runner = runner
        self._guard = guard
        self._loop = asyncio.get_running_loop()
        self.sockets_held: list[socket.socket] = []
        self._serving = False
        self._opening: set[asyncio.Task[None]] = set()

    async def start_serving(self) -> None:
        self._serving = True
        for sock in self.sockets_held:
            self._loop.add_reader(sock.fileno(), self._accept, sock)

    def _accept(self, sock: socket.socket) -> None:
        for _ in range(ACCEPT_PER_TURN):
            try:
                conn, peer = sock.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return
            except OSError as exc:
                if exc.errno not in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    raise
                get_logger().error("socket.accept() out of system resource; accepting again shortly",
                                   error=os.strerror(exc.errno), retry_in=ACCEPT_RETRY_SECONDS)
                self._loop.remove_reader(sock.fileno())
                self._loop.call_later(ACCEPT_RETRY_SECONDS, self._resume, sock)
                return
            address = str(peer[0]) if peer else "unknown"
            if not self._guard.admit(address):
                with contextlib.suppress(OSError):
                    conn.send(BUSY)  # a few bytes into an empty send buffer: it does not block
                conn.close()
                continue
            conn.setblocking(False)
            opening = self._loop.create_task(self._open(conn, address))
            self._opening.add(opening)
            opening.add_done_callback(self._opening.discard)

    def _resume(self, sock: socket.socket) -> None:
        if self._serving:
            self._loop.add_reader(sock.fileno(), self._accept, sock)

    async def _open(self, conn: socket.socket, address: str) -> None:
        server = self._runner.server
        assert server is not None  # BaseSite refuses a runner that was not set up
        protocol = GuardedConnection(server(), self._guard, address)
        try:
            await self._loop.connect_accepted_socket(lambda: protocol, conn)
        except BaseException as exc:
            # Cancelled as the listener closed, or failed: a connection never made into a transport
            # is uncounted and closed here (a transport that was made closes itself, and its
            # connection_lost uncounts it).
            if protocol.abandon():
                conn.close()
            if not isinstance(exc, Exception):
                raise

    def close(self) -> None:
        for opening in self._opening:
            opening.cancel()  # accepted just before: not made into connections after the listener stopped
        if self._serving:
            for sock in self.sockets_held:
                self._loop.remove_reader(sock.fileno())
        self._serving = False
        while self.sockets_held:
            self.sockets_held.pop().close()

    def get_loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def is_serving(self) -> bool:
        return self._serving

    async def wait_closed(self) -> None:
        return None

    async def serve_forever(self) -> None:
        await self.start_serving()
        await asyncio.Event().wait()  # until cancelled


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
            connection = _connection(request)
            if connection is not None:
                connection.body_abandoned()
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
        reserved = self._reserved_files + 1  # the connection being refused as it is accepted
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
