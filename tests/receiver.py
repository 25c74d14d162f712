"""A real HTTP receiver on 127.0.0.1 that records every request and answers from a script."""

from __future__ import annotations

import asyncio
import ssl
import threading
import time
from dataclasses import dataclass, field
from urllib.parse import unquote

from aiohttp import web


@dataclass(frozen=True)
class Reply:
    status: int = 200
    delay: float = 0.0
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b"ok"
    hold: bool = False  # wait until Receiver.release() before answering
    echo: bool = False  # answer with the request's own body
    # Answer with this text, `{url}` replaced by the request's path and query as received (as
    # Express quotes them: "Cannot POST {url}"), `{decoded}` by the same percent-decoded and
    # `{authorization}` by the request's Authorization header: a receiver that echoes its URL.
    echo_url: str | None = None


@dataclass(frozen=True)
class Received:
    path: str
    headers: dict[str, str]  # lower-cased names
    body: bytes
    at: float  # time.time() on arrival

    @property
    def delivery_id(self) -> int:
        return int(self.headers["webhook-delivery-id"])


class Receiver:
    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        """With `tls`, the receiver speaks HTTPS with that server context."""
        self._tls = tls
        self.requests: list[Received] = []
        self._scripts: dict[str, list[Reply]] = {}
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._gate = asyncio.Event()
        self._holding = 0
        self._open: dict[str, int] = {}
        self.max_open: dict[str, int] = {}
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self.port = 0

    def start(self) -> Receiver:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    async def _start(self) -> None:
        self._gate = asyncio.Event()
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0, backlog=1024, ssl_context=self._tls)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    def stop(self) -> None:
        self.release()
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def url(self, path: str) -> str:
        scheme = "https" if self._tls else "http"
        return f"{scheme}://127.0.0.1:{self.port}{path}"

    def script(self, path: str, *replies: Reply) -> None:
        """Answer requests to `path` with these replies in order; the last one repeats."""
        with self._lock:
            self._scripts[path] = list(replies)

    def script_delivery(self, delivery_id: int, *replies: Reply) -> None:
        """Like script(), for one delivery (by its webhook-delivery-id header), whatever the path."""
        with self._lock:
            self._scripts[f"delivery:{delivery_id}"] = list(replies)

    def release(self) -> None:
        self._loop.call_soon_threadsafe(self._gate.set)

    def open_now(self, path: str) -> int:
        with self._lock:
            return self._open.get(path, 0)

    @property
    def holding(self) -> int:
        return self._holding

    def to(self, path: str) -> list[Received]:
        with self._lock:
            return [r for r in self.requests if r.path == path]

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        with self._lock:
            self.requests.append(
                Received(request.path, {k.lower(): v for k, v in request.headers.items()}, body,
                         time.time())
            )
            script = self._scripts.get(f"delivery:{request.headers.get('webhook-delivery-id')}")
            script = script or self._scripts.get(request.path)
            reply = (script.pop(0) if len(script) > 1 else script[0]) if script else Reply()
            self._open[request.path] = self._open.get(request.path, 0) + 1
            self.max_open[request.path] = max(self.max_open.get(request.path, 0), self._open[request.path])
        try:
            if reply.hold:
                self._holding += 1
                try:
                    await self._gate.wait()
                finally:
                    self._holding -= 1
            if reply.delay:
                await asyncio.sleep(reply.delay)
        finally:
            with self._lock:
                self._open[request.path] -= 1
        answer = body if reply.echo else reply.body
        if reply.echo_url is not None:
            answer = (reply.echo_url.replace("{url}", request.raw_path)
                      .replace("{decoded}", unquote(request.raw_path))
                      .replace("{authorization}", request.headers.get("Authorization", ""))).encode()
        return web.Response(status=reply.status, body=answer, headers=reply.headers)
