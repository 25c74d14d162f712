"""The HTTP side: one aiohttp session, and one POST per attempt with the product's headers."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import quote, urlsplit

import aiohttp
from aiohappyeyeballs import AddrInfoType
from aiohttp.abc import AbstractResolver, ResolveResult

from worker import __version__, signing
from worker.config import tls_context
from worker.destinations import BlockedDestination, DestinationPolicy, address_blocked, url_problem
from worker.policy import AttemptResult, Category
from worker.queue import Claimed

USER_AGENT = f"webhook-worker/{__version__}"
EXCERPT_BYTES = 1024
MAX_RESPONSE_HEADERS = 100
# Headers the product sets; an endpoint's custom headers cannot replace them.
RESERVED_HEADERS = frozenset(
    {
        "content-type", "content-length", "user-agent", "host", "webhook-id", "webhook-timestamp",
        "webhook-signature", "idempotency-key", "webhook-delivery-id", "webhook-attempt",
        "webhook-event-type", "traceparent",
    }
)


@dataclass(frozen=True)
class Sent:
    result: AttemptResult
    latency_ms: int
    excerpt: str | None


def display_url(url: str) -> str:
    """Scheme, host and port only: what may appear in logs (paths and queries can be secrets)."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "(invalid URL)"
    if ":" in host:
        host = f"[{host}]"
    return f"{parts.scheme}://{host}{port}"


def header_value(text: str) -> str:
    """Text as a header value: printable ASCII as it is, anything else percent-encoded (UTF-8), so
    no value from a producer can end a header line or carry bytes a receiver may reject."""
    if text.isascii() and text.isprintable():
        return text
    return quote(text, safe=_HEADER_SAFE)


_HEADER_SAFE = "".join(chr(c) for c in range(0x21, 0x7F) if chr(c) != "%")


def request_headers(row: Claimed, timestamp: int, body: bytes) -> dict[str, str]:
    headers = {k: v for k, v in row.headers.items() if k.lower() not in RESERVED_HEADERS}
    # The id as sent is the id signed: a receiver verifies with the header it got.
    message_id = header_value(row.idempotency_key)
    headers.update(
        {
            "Content-Type": "application/json",
            "User-Agent": USER_AGENT,
            "webhook-id": message_id,
            "webhook-timestamp": str(timestamp),
            "Idempotency-Key": message_id,
            "webhook-delivery-id": str(row.delivery_id),
            "webhook-attempt": str(row.attempt),
            "webhook-event-type": header_value(row.event_type),
        }
    )
    if row.signing_secrets:
        headers["webhook-signature"] = signing.signature_header(
            row.signing_secrets, message_id, timestamp, body
        )
    if row.traceparent:
        headers["traceparent"] = row.traceparent
    return headers


def transport_failure(exc: BaseException) -> tuple[Category, str]:
    """Which failure category a transport exception belongs to, and a message safe to log."""
    cause = exc.os_error if isinstance(exc, aiohttp.ClientConnectorError) else exc
    if isinstance(cause, BlockedDestination):
        return Category.BLOCKED, str(cause)
    if isinstance(exc, asyncio.TimeoutError | aiohttp.ServerTimeoutError):
        return Category.TIMEOUT, "request timed out"
    if isinstance(exc, aiohttp.ClientConnectorDNSError):
        return Category.DNS, f"DNS lookup failed: {exc.os_error.strerror or type(exc.os_error).__name__}"
    if isinstance(exc, aiohttp.ClientConnectorCertificateError | aiohttp.ClientSSLError):
        return Category.TLS, f"TLS error: {type(exc).__name__}"
    if isinstance(exc, aiohttp.ClientConnectorError):
        return Category.CONNECT, f"connection failed: {exc.os_error.strerror or type(exc.os_error).__name__}"
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return Category.CONNECT, "server disconnected before answering"
    if isinstance(exc, aiohttp.ClientResponseError):
        return Category.CONNECT, f"invalid HTTP response ({exc.status})"
    if isinstance(exc, aiohttp.InvalidURL):
        return Category.INTERNAL, "invalid endpoint URL"
    # Never str(exc) here: several aiohttp errors carry the full URL, which may hold a secret.
    if isinstance(exc, OSError) and exc.strerror:
        return Category.CONNECT, f"{type(exc).__name__}: {exc.strerror}"
    if isinstance(exc, aiohttp.ClientError | OSError):
        return Category.CONNECT, type(exc).__name__
    return Category.INTERNAL, type(exc).__name__


class CheckedResolver(AbstractResolver):
    """Resolves through another resolver and drops the addresses the policy refuses, so a name that
    only leads to refused addresses fails with the reason instead of a connection."""

    def __init__(self, inner: AbstractResolver, policy: DestinationPolicy) -> None:
        self._inner = inner
        self._policy = policy

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        results = await self._inner.resolve(host, port, family)
        reasons = [address_blocked(r["host"], self._policy) for r in results]
        allowed = [r for r, reason in zip(results, reasons, strict=True) if reason is None]
        if not allowed and results:
            raise BlockedDestination(reasons[0])
        return allowed

    async def close(self) -> None:
        await self._inner.close()


def checked_socket_factory(policy: DestinationPolicy) -> Callable[[AddrInfoType], socket.socket]:
    """A socket factory that checks the exact address about to be connected to. aiohttp skips the
    resolver for IP literals, so this is the check no URL form can go around."""

    def make(addr_info: AddrInfoType) -> socket.socket:
        family, type_, proto, _, sockaddr = addr_info
        reason = address_blocked(str(sockaddr[0]), policy)
        if reason is not None:
            raise BlockedDestination(reason)
        return socket.socket(family=family, type=type_, proto=proto)

    return make


class Sender:
    """Owns the HTTP session; every attempt goes through send()."""

    def __init__(
        self,
        concurrency: int,
        policy: DestinationPolicy | None = None,
        max_response_bytes: int = 64 * 1024,
        max_header_bytes: int = 8 * 1024,
        resolver: AbstractResolver | None = None,
        ca_bundle_file: str | None = None,
    ) -> None:
        self._concurrency = concurrency
        self._ca_bundle_file = ca_bundle_file
        self._policy = policy or DestinationPolicy()
        # Read at most this much of a response; a larger body is cut off and its connection closed.
        self._max_response_bytes = max_response_bytes
        self._max_header_bytes = max_header_bytes
        self._resolver = resolver
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        resolver = CheckedResolver(self._resolver or aiohttp.DefaultResolver(), self._policy)
        connector = aiohttp.TCPConnector(
            limit=self._concurrency, limit_per_host=0, ttl_dns_cache=60, resolver=resolver,
            socket_factory=checked_socket_factory(self._policy),
            # aiohttp's own verifying default unless a private CA is added to the system's
            ssl=tls_context(self._ca_bundle_file) if self._ca_bundle_file else True,
        )
        self._session = aiohttp.ClientSession(
            connector=connector, auto_decompress=True, trust_env=False, raise_for_status=False,
            # A receiver's status line and each header line; and no more headers than this many.
            max_line_size=self._max_header_bytes, max_field_size=self._max_header_bytes,
            max_headers=MAX_RESPONSE_HEADERS,
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def send(self, row: Claimed, body: bytes, timeout_seconds: float) -> Sent:
        headers = request_headers(row, int(time.time()), body)
        connect_timeout = row.retry_policy.connect_timeout_seconds
        return await self.post(row.url, body, headers, timeout_seconds, connect_timeout)

    async def post(
        self, url: str, body: bytes, headers: dict[str, str], timeout_seconds: float,
        connect_timeout: float | None,
    ) -> Sent:
        """One POST under the destination rules and bounds; every outcome is a Sent, never a raise."""
        assert self._session is not None, "Sender.start() first"
        started = time.monotonic()
        problem = url_problem(url, self._policy)
        if problem is not None:
            return Sent(AttemptResult(failure=Category.BLOCKED, error=problem), 0, None)
        timeout = aiohttp.ClientTimeout(total=timeout_seconds, sock_connect=connect_timeout)
        try:
            # The whole attempt, body included, within the timeout: a receiver that trickles its
            # answer a byte at a time cannot hold a request open past it.
            async with asyncio.timeout(timeout_seconds), self._session.post(
                url,
                data=body,
                headers=headers,
                timeout=timeout,
                allow_redirects=False,
            ) as response:
                excerpt = await _read_excerpt(response, self._max_response_bytes)
                result = AttemptResult(
                    status=response.status, retry_after=response.headers.get("Retry-After")
                )
        except Exception as exc:  # noqa: BLE001 - every transport failure becomes a category
            category, message = transport_failure(exc)
            result, excerpt = AttemptResult(failure=category, error=message), None
        return Sent(result, int((time.monotonic() - started) * 1000), excerpt)


async def _read_excerpt(response: aiohttp.ClientResponse, limit: int) -> str:
    head = await response.content.read(EXCERPT_BYTES)
    drained = len(head)
    while drained < limit:
        chunk = await response.content.read(limit - drained)
        if not chunk:
            break
        drained += len(chunk)
    else:
        response.close()
    return excerpt_text(head)


def excerpt_text(raw: bytes) -> str:
    """At most EXCERPT_BYTES of UTF-8, cut at a character boundary, without NULs (PostgreSQL
    text cannot hold them): a receiver's error page of any encoding can always be stored."""
    text = raw.decode("utf-8", errors="replace").replace("\x00", "\ufffd")
    return text.encode()[:EXCERPT_BYTES].decode("utf-8", errors="ignore")
