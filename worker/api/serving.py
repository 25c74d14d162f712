"""The API's listening sockets: deadlines for request heads and bodies, caps on connections in total
and per client (idle keep-alive connections make room first), the separate port for /metrics with a
budget of its own, and problem documents for requests too malformed to reach a route."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import ipaddress
import os
import resource
import socket
from collections import Counter as Tally
from collections.abc import Awaitable, Callable
from typing import cast

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError, LineTooLong
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest
from prometheus_client import CollectorRegistry, Counter, Gauge

from worker import runtime
from worker.config import ApiConfig
from worker.errors import ConfigError
from worker.observability import get_logger
from worker.web.problems import ANSWER_HEADERS, Problem

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
# refused one is answered and closed as it is accepted: it never holds a file past that moment. An
# idle connection closed to make room for one holds its file until the loop's next turn, so the
# open-file budget keeps this many spare.
ACCEPT_PER_TURN = 64
# After accept() found no file left (which the caps should prevent): accept again after this long.
ACCEPT_RETRY_SECONDS = 1.0
# After an answer sent before the whole body was read (a 401, a 408, a 413), aiohttp reads and drops
# the rest for this long at most, so the client can read the answer before the connection closes.
MAX_LINGER_SECONDS = 5.0
# What aiohttp reads of a request head before it gives up: a request target (path and query) up to
# this many bytes, beyond it 414; a header's name and value up to MAX_HEADER_BYTES and at most
# MAX_HEADERS headers, beyond them 431. aiohttp's failure names the limit it passed, which tells a
# request line from a header only while the two limits differ.
MAX_REQUEST_LINE_BYTES = 8190
MAX_HEADER_BYTES = 16384
MAX_HEADERS = 128
assert MAX_REQUEST_LINE_BYTES != MAX_HEADER_BYTES
# One client may hold a quarter of the metrics port's budget (api.metrics_max_connections).
METRICS_BUDGET_PARTS = 4


def counted_as(address: str) -> str:
    """The client a connection counts against: its IPv4 address, or the /64 its IPv6 address is in.
    A host is usually given a whole /64, so counting IPv6 per address would let one host open as
    many connections as it likes (an IPv4-mapped address counts as the IPv4 one)."""
    try:
        ip = ipaddress.ip_address(address.partition("%")[0])  # a link-local peer's zone is no part of it
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


class ListenerMetrics:
    """The listeners' metrics, labelled by port (api, metrics)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.open = Gauge("webhook_api_connections", "Client connections open, by port (api, metrics).",
                          ["port"], registry=registry)
        self.refused = Counter("webhook_api_connections_refused",
                               "Connections answered 503 and closed at once, by port and the cap they "
                               "would have passed (total, per_address).", ["port", "cap"], registry=registry)
        self.idle_closed = Counter("webhook_api_idle_connections_closed",
                                   "Idle keep-alive connections closed to make room for a new one at a "
                                   "cap, by port.", ["port"], registry=registry)
        self.timeouts = Counter("webhook_api_request_timeouts",
                                "Requests whose head or body did not arrive in time, by part (head, body).",
                                ["part"], registry=registry)
        self.unreadable = Counter("webhook_api_unreadable_requests",
                                  "Requests answered before any route because their head could not be "
                                  "read, by status (400, 414, 431).", ["status"], registry=registry)
        for part in ("head", "body"):
            self.timeouts.labels(part)
        for status in ("400", "414", "431"):
            self.unreadable.labels(status)


class ConnectionGuard:
    """Counts one port's open connections, in total and per client (counted_as), closes idle
    keep-alive connections to make room for new ones, and holds the deadlines every connection keeps."""

    def __init__(self, port: str, max_connections: int, max_per_address: int, config: ApiConfig,
                 metrics: ListenerMetrics) -> None:
        self.port = port
        self.max_connections = max_connections
        self.max_per_address = max_per_address
        self.head_timeout = config.head_timeout_seconds
        self.body_timeout = config.body_timeout_seconds
        self.metrics = metrics
        self.timeouts = metrics.timeouts
        self.open = 0
        self.by_address: Tally[str] = Tally()
        # connections between an answer and the next request's first byte, longest idle first
        self.idle: dict[GuardedConnection, None] = {}
        metrics.open.labels(port).set_function(lambda: self.open)
        for cap in ("total", "per_address"):
            metrics.refused.labels(port, cap)
        metrics.idle_closed.labels(port)

    @classmethod
    def public(cls, config: ApiConfig, registry: CollectorRegistry) -> ConnectionGuard:
        """The public port's guard (api.max_connections, api.max_connections_per_address)."""
        return cls("api", config.max_connections, config.max_connections_per_address, config,
                   ListenerMetrics(registry))

    def for_metrics_port(self, config: ApiConfig) -> ConnectionGuard:
        """The metrics port's guard: a budget of its own (api.metrics_max_connections), so that
        connections to the public port never keep the scrape out, and the same metrics."""
        budget = config.metrics_max_connections
        return ConnectionGuard("metrics", budget, max(1, budget // METRICS_BUDGET_PARTS), config,
                               self.metrics)

    def admit(self, address: str) -> bool:
        """Count a new connection from this client, unless it would pass a cap that no idle
        connection can make room under: the client's own longest-idle one for its cap, anyone's
        for the total."""
        if self.by_address[address] >= self.max_per_address and not self._make_room(address):
            self.metrics.refused.labels(self.port, "per_address").inc()
            return False
        if self.open >= self.max_connections and not self._make_room(None):
            self.metrics.refused.labels(self.port, "total").inc()
            return False
        self.open += 1
        self.by_address[address] += 1
        return True

    def _make_room(self, address: str | None) -> bool:
        for connection in self.idle:  # longest idle first
            if address is None or connection.address == address:
                connection.close_idle()
                self.metrics.idle_closed.labels(self.port).inc()
                return True
        return False

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
    application (`track_requests` tells it). Between an answer and the next request's first byte the
    connection is idle: aiohttp's keep-alive timer closes it (api.keepalive_timeout_seconds), and
    the guard closes it sooner when a new connection needs its place. Wrapping rather than
    subclassing keeps aiohttp's protocol as aiohttp drives it; everything is passed on.
    """

    def __init__(self, inner: RequestHandler, guard: ConnectionGuard, address: str) -> None:
        """For a connection the guard has admitted (counted) from this client."""
        self._inner = inner
        self._guard = guard
        self._transport: asyncio.Transport | None = None
        self.address = address
        self._counted = True
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
        if not self._in_request:
            self._guard.idle.pop(self, None)  # a next request's first bytes: no longer idle
            if self._head_clock is None and not self._body_abandoned:
                self._start_head_clock()
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        # aiohttp's answer is None (close the transport once the peer has finished sending)
        self._inner.eof_received()
        return None

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_head_clock()
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
        self._guard.idle.pop(self, None)
        if self._counted:
            self._counted = False
            self._guard.release(self.address)

    def close_idle(self) -> None:
        """Close an idle connection to make room: uncounted at once, its place taken by the new one.
        Closing sends what was written before (the last answer) first."""
        self.release()
        if self._transport is not None:
            self._transport.close()

    def request_started(self) -> None:
        self._in_request = True
        self._guard.idle.pop(self, None)
        self._stop_head_clock()

    def body_abandoned(self) -> None:
        self._body_abandoned = True

    def count_unreadable(self, status: int) -> None:
        self._guard.metrics.unreadable.labels(str(status)).inc()

    def request_finished(self) -> None:
        """The answer is handed to aiohttp, which writes it before its task lets any other run; from
        then until a next request's first byte the connection is idle. (A request pipelined behind
        this one, already read, could be dropped if the connection is closed to make room before
        aiohttp starts it: clients that pipeline retry on a closed connection.)"""
        self._in_request = False
        self._answered += 1
        transport = self._transport
        closing = transport is None or transport.is_closing()
        if self._counted and not self._body_abandoned and not closing:
            self._guard.idle[self] = None

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


class AnsweringHandler(RequestHandler):
    """aiohttp's protocol, answering a request whose head it could not read (a request target or a
    header over its limit, too many headers, bytes that are not HTTP) with a problem document like
    every other refusal, rather than aiohttp's plain text that echoes the request back."""

    def handle_error(self, request: BaseRequest, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        if status != 400 or not isinstance(exc, HttpProcessingError) or request.writer.output_size:
            return super().handle_error(request, status, exc, message)
        problem = unreadable(exc, self.max_line_size)
        # never the request's bytes: a path may hold a portal link's secret, a header a token
        get_logger().info("api request unreadable", status=problem.status, kind=problem.kind)
        transport = self.transport
        protocol = transport.get_protocol() if transport is not None else None
        if isinstance(protocol, GuardedConnection):
            protocol.count_unreadable(problem.status)
        response = problem.response()
        response.force_close()
        return response


def unreadable(exc: HttpProcessingError, line_limit: int) -> Problem:
    """The answer to a request head aiohttp could not read; aiohttp's message is not repeated (it
    quotes the request)."""
    if isinstance(exc, LineTooLong):
        # LineTooLong(line, limit): the limit passed names what was too long (MAX_REQUEST_LINE_BYTES)
        if len(exc.args) > 1 and str(exc.args[1]) == str(line_limit):
            return Problem(414, "uri-too-long", "The request target is too long",
                           f"the request's path and query exceed {line_limit} bytes",
                           headers=ANSWER_HEADERS)
        return Problem(431, "header-too-large", "A request header is too large",
                       f"a header's name and value exceed {MAX_HEADER_BYTES} bytes", headers=ANSWER_HEADERS)
    if "Too many headers" in exc.message:
        return Problem(431, "header-too-large", "Too many request headers",
                       f"the request has more than {MAX_HEADERS} headers", headers=ANSWER_HEADERS)
    return Problem(400, "unreadable-request", "The request cannot be read",
                   "the request is not HTTP/1.1 that can be read (its method, target, version or headers)",
                   headers=ANSWER_HEADERS)


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
            address = counted_as(str(peer[0])) if peer else "unknown"
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
        # aiohttp's handler as server() makes it, answering unreadable requests with a problem document
        handler = AnsweringHandler(server, loop=self._loop, **server._kwargs)
        protocol = GuardedConnection(handler, self._guard, address)
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
    together, each with a guard of its own: the public port's caps, the metrics port's budget."""

    def __init__(self, config: ApiConfig, app: web.Application, metrics_app: web.Application,
                 reserved_files: int = RESERVED_FILES) -> None:
        self._config = config
        self.guard = app[GUARD]
        self.metrics_guard = self.guard.for_metrics_port(config)
        self._apps = ((app, config.port, "api.port", BACKLOG, self.guard),
                      (metrics_app, config.metrics_port, "api.metrics_port", METRICS_BACKLOG,
                       self.metrics_guard))
        self._reserved_files = reserved_files
        self._runners: list[web.AppRunner] = []
        self.port = 0
        self.metrics_port = 0

    async def start(self) -> None:
        config = self._config
        # besides the process's own files: the connection being refused as it is accepted, idle
        # ones closed to make room that hold their files until the loop's next turn, the metrics port
        reserved = self._reserved_files + 1 + ACCEPT_PER_TURN + config.metrics_max_connections
        self.guard.max_connections = fit_to_open_files(config.max_connections, reserved)
        ports = []
        for app, port, key, backlog, guard in self._apps:
            runner = web.AppRunner(app, access_log=None, handle_signals=False,
                                   keepalive_timeout=config.keepalive_timeout_seconds,
                                   lingering_time=min(config.body_timeout_seconds, MAX_LINGER_SECONDS),
                                   max_line_size=MAX_REQUEST_LINE_BYTES, max_field_size=MAX_HEADER_BYTES,
                                   max_headers=MAX_HEADERS)
            await runner.setup()
            self._runners.append(runner)
            site = GuardedSite(runner, config.host, port, guard, backlog)
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
