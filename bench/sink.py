"""The benchmark's receiver: a minimal asyncio protocol server, in a process of its own.

It answers every POST with 200 (or, by path, after a delay or with a failure), counts requests and
records each receipt time, plus the `bench_t` timestamp a latency payload carries. It parses just
enough HTTP/1.1 (headers, Content-Length, keep-alive) to serve aiohttp's client; the point is that it
costs far less CPU per request than the worker, so it is never the bottleneck.

Paths:
  /ok/...          200 at once
  /slow/<ms>/...   200 after <ms> milliseconds
  /fail/...        500 at once
  GET /_ctl/stats  JSON: count, by_kind counts, first/last receipt, receipt times at fractions
  GET /_ctl/latency JSON: [[bench_t, received_at], ...]
  POST /_ctl/reset forget everything

Run: python -m bench.sink --port 0 --port-file FILE   (uvloop when installed)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import time
from array import array
from pathlib import Path
from typing import Any

OK = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok"
FAIL = b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: text/plain\r\nContent-Length: 4\r\n\r\nfail"
MARK = b'"bench_t": '


def _json_response(data: Any) -> bytes:
    body = json.dumps(data).encode()
    head = f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    return head.encode() + body


class State:
    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.count = 0
        self.by_kind: dict[str, int] = {"ok": 0, "slow": 0, "fail": 0}
        self.times = array("d")
        self.latency: list[tuple[float, float]] = []

    def stats(self, fractions: list[float]) -> dict[str, Any]:
        n = len(self.times)
        marks = {}
        for f in fractions:
            if n:
                marks[str(f)] = self.times[min(n - 1, max(0, int(n * f) - 1))]
        return {
            "count": self.count,
            "by_kind": self.by_kind,
            "first": self.times[0] if n else None,
            "last": self.times[-1] if n else None,
            "at_fraction": marks,
            "loop": type(asyncio.get_running_loop()).__module__,
        }


STATE = State()


class SinkProtocol(asyncio.Protocol):
    def __init__(self) -> None:
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(self.buf[:end])
            length = 0
            lower = head.lower()
            at = lower.find(b"\r\ncontent-length:")
            if at >= 0:
                stop = lower.find(b"\r\n", at + 2)
                length = int(lower[at + 17 : stop if stop >= 0 else None])
            total = end + 4 + length
            if len(self.buf) < total:
                return
            body = bytes(self.buf[end + 4 : total])
            del self.buf[:total]
            self.handle(head, body)

    def handle(self, head: bytes, body: bytes) -> None:
        assert self.transport is not None
        line_end = head.find(b"\r\n")
        method, _, rest = head[: line_end if line_end >= 0 else None].partition(b" ")
        path = rest.partition(b" ")[0].decode()
        if path.startswith("/_ctl/"):
            self.transport.write(self.control(method, path))
            return
        now = time.time()
        STATE.count += 1
        STATE.times.append(now)
        at = body.find(MARK)
        if at >= 0:
            stop = at + len(MARK)
            end = stop
            while end < len(body) and body[end] in b"0123456789.eE+-":
                end += 1
            STATE.latency.append((float(body[stop:end]), now))
        if path.startswith("/slow/"):
            STATE.by_kind["slow"] += 1
            delay = int(path.split("/")[2]) / 1000.0
            asyncio.get_running_loop().call_later(delay, self._write_later, OK)
        elif path.startswith("/fail"):
            STATE.by_kind["fail"] += 1
            self.transport.write(FAIL)
        else:
            STATE.by_kind["ok"] += 1
            self.transport.write(OK)

    def _write_later(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def control(self, method: bytes, path: str) -> bytes:
        route, _, query = path.partition("?")
        if route == "/_ctl/reset":
            STATE.reset()
            return _json_response({"reset": True})
        if route == "/_ctl/latency":
            return _json_response(STATE.latency)
        if route == "/_ctl/stats":
            fractions = [float(x) for x in query.removeprefix("q=").split(",") if x] if query else []
            return _json_response(STATE.stats(fractions))
        return _json_response({"error": f"unknown {route}"})

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None


async def serve(port: int, port_file: Path | None) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(SinkProtocol, "127.0.0.1", port, backlog=1024, reuse_address=True)
    actual = server.sockets[0].getsockname()[1]
    if port_file is not None:
        tmp = port_file.with_suffix(".tmp")
        tmp.write_text(json.dumps({"port": actual, "pid": os.getpid(), "loop": type(loop).__module__}))
        tmp.rename(port_file)
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    async with server:
        await stop.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description="benchmark sink: answers 200 and counts")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--port-file", type=Path)
    parser.add_argument("--no-uvloop", action="store_true", help="use the default asyncio loop")
    args = parser.parse_args()
    factory = None
    if not args.no_uvloop:
        try:
            import uvloop

            factory = uvloop.new_event_loop
        except ImportError:
            pass
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(serve(args.port, args.port_file))


if __name__ == "__main__":
    main()
