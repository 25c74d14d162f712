"""TCP servers on 127.0.0.1 that misbehave in the ways real receivers do."""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import struct
import threading
from collections.abc import Awaitable, Callable

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: text/plain\r\n\r\nok"


async def _read_request(reader: asyncio.StreamReader) -> bool:
    """Read one HTTP request (headers and Content-Length body); False at end of stream."""
    return await _read_request_head(reader) is not None


async def _read_request_head(reader: asyncio.StreamReader) -> bytes | None:
    """Read one HTTP request and return its head (request line and headers); None at end of stream."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    await reader.readexactly(length)
    return head


def _header(head: bytes, name: bytes) -> str:
    for line in head.split(b"\r\n"):
        if line.lower().startswith(name + b":"):
            return line.split(b":", 1)[1].strip().decode()
    return ""


async def never_answers(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await _read_request(reader)
    await asyncio.sleep(3600)


async def resets(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await _read_request(reader)
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close sends RST
    writer.transport.abort()


async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await _read_request(reader)
    writer.write(b"\x16\x03\x01 this is not HTTP at all\r\n\r\n")
    await writer.drain()
    writer.close()


def answers_late(delay: float) -> Handler:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        await asyncio.sleep(delay)
        writer.write(OK)
        await writer.drain()
        writer.close()
    return handler


async def trickles(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Answers one byte a second, forever: every read succeeds, the response never ends."""
    await _read_request(reader)
    for byte in OK * 1000:
        writer.write(bytes([byte]))
        await writer.drain()
        await asyncio.sleep(1.0)


async def huge_header(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await _read_request(reader)
    writer.write(b"HTTP/1.1 200 OK\r\nX-Filler: " + b"a" * 100_000 + b"\r\nContent-Length: 2\r\n\r\nok")
    await writer.drain()
    writer.close()


async def endless_headers(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await _read_request(reader)
    writer.write(b"HTTP/1.1 200 OK\r\n")
    for n in range(100_000):
        writer.write(b"X-H%d: v\r\n" % n)
        if n % 1000 == 0:
            await writer.drain()
    writer.close()


def sends_megabytes(megabytes: int) -> Handler:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await _read_request(reader):
            size = megabytes * 1024 * 1024
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % size)
            chunk = b"x" * 65536
            for _ in range(size // len(chunk)):
                writer.write(chunk)
                await writer.drain()
        writer.close()
    return handler


class ClosesKeepaliveAtRandom:
    """Answers every request on a connection, advertising keep-alive, and after each answer hangs up
    with the given probability. Records how many requests each connection carried and how many
    asked for a fresh connection (`Connection: close`: the worker sends a request again that way
    when its kept-alive connection was dropped under it)."""

    def __init__(self, probability: float, seed: int = 1) -> None:
        self._probability = probability
        self._rng = random.Random(seed)
        self.requests_per_connection: list[int] = []
        self.fresh_connection_requests = 0
        self.hung_up = 0  # connections closed right after an answer that advertised keep-alive

    async def __call__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.requests_per_connection.append(0)
        number = len(self.requests_per_connection) - 1
        while (head := await _read_request_head(reader)) is not None:
            self.requests_per_connection[number] += 1
            self.fresh_connection_requests += _header(head, b"connection").lower() == "close"
            writer.write(OK)  # advertises keep-alive, then sometimes hangs up anyway
            await writer.drain()
            if self._rng.random() < self._probability:
                self.hung_up += 1
                break
        writer.close()

    @property
    def reused_connections(self) -> int:
        return sum(1 for n in self.requests_per_connection if n > 1)


class ClosesSoonAfterAnswering:
    """Answers one request per connection, advertising keep-alive, and hangs up `low` to `high`
    seconds later whatever arrived meanwhile: the keep-alive race of receivers that close idle
    connections. Counts the requests that arrived on a connection it was
    about to close (never answered) and those that asked for a fresh connection (`Connection:
    close`, as the worker sends a request again after its kept-alive connection was dropped)."""

    def __init__(self, low: float, high: float, seed: int = 1) -> None:
        self._low, self._high = low, high
        self._rng = random.Random(seed)
        self.answered = 0
        self.dropped = 0
        self.fresh_connection_requests = 0

    async def __call__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await _read_request_head(reader)
        if head is not None:
            self.fresh_connection_requests += _header(head, b"connection").lower() == "close"
            writer.write(OK)
            await writer.drain()
            self.answered += 1
            hang_up_at = asyncio.get_running_loop().time() + self._rng.uniform(self._low, self._high)
            try:
                async with asyncio.timeout_at(hang_up_at):
                    if await _read_request_head(reader) is not None:
                        self.dropped += 1  # a request on the kept-alive connection: never answered
                    await asyncio.sleep(max(hang_up_at - asyncio.get_running_loop().time(), 0))
            except TimeoutError:
                pass
        writer.close()


def answers_once_then_closes(delay: float, closed: threading.Event) -> Handler:
    """Answers one request, advertising keep-alive, hangs up `delay` seconds later and sets `closed`."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if await _read_request(reader):
            writer.write(OK)
            await writer.drain()
            await asyncio.sleep(delay)
        writer.close()
        await writer.wait_closed()
        closed.set()
    return handler


class DropsReusedConnections:
    """Answers the first request on each connection, advertising keep-alive, then reads the next
    request on it and hangs up without answering: every reused connection is closed under a request.
    Records (connection number, delivery id, webhook-attempt header) of what it answered and dropped."""

    def __init__(self) -> None:
        self.answered: list[tuple[int, int, str]] = []
        self.dropped: list[tuple[int, int, str]] = []
        self._connections = 0

    async def __call__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._connections += 1
        number = self._connections
        head = await _read_request_head(reader)
        if head is not None:
            self.answered.append(_seen(number, head))
            writer.write(OK)
            await writer.drain()
            head = await _read_request_head(reader)
            if head is not None:
                self.dropped.append(_seen(number, head))
        writer.close()


def _seen(connection: int, head: bytes) -> tuple[int, int, str]:
    return connection, int(_header(head, b"webhook-delivery-id")), _header(head, b"webhook-attempt")


class TcpServer:
    def __init__(self, handler: Handler) -> None:
        self._handler = handler
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self.connections = 0
        self.port = 0

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            await self._handler(reader, writer)

    def start(self) -> TcpServer:
        self._thread.start()

        async def listen() -> None:
            self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
            self.port = self._server.sockets[0].getsockname()[1]

        asyncio.run_coroutine_threadsafe(listen(), self._loop).result(10)
        return self

    def url(self, path: str = "/hook") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def stop(self) -> None:
        async def close() -> None:
            self._server.close()
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()

        asyncio.run_coroutine_threadsafe(close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
