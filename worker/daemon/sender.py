"""The HTTP side: the aiohttp sessions, and one POST per attempt with the product's headers."""

from __future__ import annotations

import asyncio
import codecs
import contextvars
import functools
import os
import socket
import ssl
import time
from collections.abc import Callable
from urllib.parse import quote

import aiohttp
from aiohappyeyeballs import AddrInfoType
from aiohttp.abc import AbstractResolver, ResolveResult

from worker import __version__
from worker.config import tls_context
from worker.rules import signing
from worker.rules.classification import AttemptResult, Category
from worker.rules.coalescing import digest_label
from worker.rules.destinations import (
    OPERATOR_TENANT,
    BlockedDestination,
    DestinationRules,
    address_blocked,
    tenant_destinations,
    url_problem,
)
from worker.rules.model import Claimed, Sent
from worker.rules.redaction import redact

USER_AGENT = f"webhook-worker/{__version__}"
EXCERPT_BYTES = 1024
MAX_RESPONSE_HEADERS = 100
# Endpoint URLs whose check is remembered at once (Sender.url_problem); beyond, it starts afresh.
MAX_CHECKED_URLS = 4096
_UTF8 = codecs.getincrementaldecoder("utf-8")


def header_value(text: str) -> str:
    """Text as a header value: printable ASCII as it is, anything else percent-encoded (UTF-8), so
    no value from a producer can end a header line or carry bytes a receiver may reject."""
    if text.isascii() and text.isprintable():
        return text
    return quote(text, safe=_HEADER_SAFE)


_HEADER_SAFE = "".join(chr(c) for c in range(0x21, 0x7F) if chr(c) != "%")


def request_headers(row: Claimed, timestamp: int, body: bytes) -> dict[str, str]:
    # The id as sent is the id signed: a receiver verifies with the header it got.
    message_id = header_value(row.idempotency_key)
    headers = {
        **row.headers,  # as claimed: only what the registration rules allow
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
        "webhook-id": message_id,
        "webhook-timestamp": str(timestamp),
        "Idempotency-Key": message_id,
        "webhook-delivery-id": str(row.delivery_id),
        "webhook-attempt": str(row.attempt),
        "webhook-event-type": header_value(row.event_type),
    }
    if row.signing_secrets:
        headers["webhook-signature"] = signing.signature_header(
            row.signing_secrets, message_id, timestamp, body
        )
    if row.traceparent:
        headers["traceparent"] = row.traceparent
    if row.digest_id is not None:
        headers["webhook-digest-id"] = digest_label(row.digest_id)
    return headers


def transport_failure(exc: BaseException) -> tuple[Category, str]:
    """Which failure category a transport exception belongs to, and a message safe to store and log.

    Never the exception's own text: aiohttp puts the request URL, path and query included, into
    several of its messages ("Can not write request body for <url>"), and a Slack-style URL carries
    its token in the path. Messages are built from the type, the errno and fixed words only.
    """
    cause = exc.os_error if isinstance(exc, aiohttp.ClientConnectorError) else exc
    if isinstance(cause, BlockedDestination):
        return Category.BLOCKED, str(cause)  # our own reason, naming the refused address
    if isinstance(exc, asyncio.TimeoutError | aiohttp.ServerTimeoutError):
        return Category.TIMEOUT, "request timed out"
    if isinstance(exc, aiohttp.ClientConnectorDNSError):
        return Category.DNS, f"DNS lookup failed{_lookup_reason(exc.os_error)}"
    if isinstance(exc, aiohttp.ClientConnectorCertificateError | aiohttp.ClientSSLError):
        return Category.TLS, f"TLS error: {type(exc).__name__}"
    if isinstance(exc, aiohttp.ClientConnectorError):
        return Category.CONNECT, f"connection failed: {os_error_text(exc.os_error)}"
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return Category.CONNECT, "server disconnected before answering"
    if isinstance(exc, aiohttp.ClientResponseError):
        # The status aiohttp reports here (400) is its parser's, not the receiver's: leave it out.
        return Category.PROTOCOL, "invalid HTTP response"
    if isinstance(exc, aiohttp.InvalidURL):
        return Category.INTERNAL, "invalid endpoint URL"
    if isinstance(exc, aiohttp.ClientError | OSError):
        return Category.CONNECT, os_error_text(exc)
    return Category.INTERNAL, type(exc).__name__


def os_error_text(exc: BaseException) -> str:
    """The exception's type, and the system's text for its errno when it has one ("ClientOSError:
    Connection reset by peer"); never the exception's own message, which may quote a URL."""
    errno = exc.errno if isinstance(exc, OSError) else None
    if isinstance(errno, int) and errno > 0:
        return f"{type(exc).__name__}: {os.strerror(errno)}"
    return type(exc).__name__


def _lookup_reason(exc: BaseException) -> str:
    # getaddrinfo's own text ("Name or service not known") is one of libc's fixed strings.
    for error in (exc, exc.__cause__):
        if isinstance(error, socket.gaierror) and error.strerror:
            return f": {error.strerror}"
    return ""


def carries_transport_text(exc: BaseException) -> bool:
    """Whether the exception, or one it was raised from, is an aiohttp or OS error, whose text may
    quote a URL: such an exception is logged and stored by type only, never with its traceback."""
    seen: BaseException | None = exc
    for _ in range(10):  # chains are short; the bound only guards against a cycle
        if seen is None:
            return False
        if isinstance(seen, aiohttp.ClientError | OSError):
            return True
        seen = seen.__cause__ or seen.__context__
    return True


def error_text(exc: BaseException) -> str:
    """An unexpected exception as one line that may be stored and logged."""
    if carries_transport_text(exc):
        return os_error_text(exc)
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


class CheckedResolver(AbstractResolver):
    """Resolves through another resolver and drops the addresses the rules refuse, so a name that
    only leads to refused addresses fails with the reason instead of a connection."""

    def __init__(self, inner: AbstractResolver, rules: DestinationRules) -> None:
        self._inner = inner
        self._rules = rules

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        results = await self._inner.resolve(host, port, family)
        reasons = [address_blocked(r["host"], self._rules) for r in results]
        allowed = [r for r, reason in zip(results, reasons, strict=True) if reason is None]
        if not allowed and results:
            raise BlockedDestination(reasons[0])
        return allowed

    async def close(self) -> None:
        await self._inner.close()


class _RequestConnections:
    """What one request did about connections: the socket factory notes each socket it opens."""

    __slots__ = ("opened",)

    def __init__(self) -> None:
        self.opened = 0


# The request being sent in this task. aiohttp opens a request's sockets in the request's own task
# (or tasks it starts, which copy this context), so a request that fails having opened no socket
# went out on a kept-alive connection: aiohttp does not tell whether it reused one.
_current_request: contextvars.ContextVar[_RequestConnections | None] = contextvars.ContextVar(
    "current_request", default=None)
# Failures of a request whose kept-alive connection the receiver closed under it, before answering.
_DROPPED_CONNECTION = (aiohttp.ClientOSError, aiohttp.ServerDisconnectedError,
                       aiohttp.ClientConnectionResetError)


def checked_socket_factory(rules: DestinationRules) -> Callable[[AddrInfoType], socket.socket]:
    """A socket factory that checks the exact address about to be connected to. aiohttp skips the
    resolver for IP literals, so this is the check no URL form can go around."""

    def make(addr_info: AddrInfoType) -> socket.socket:
        family, type_, proto, _, sockaddr = addr_info
        reason = address_blocked(str(sockaddr[0]), rules)
        if reason is not None:
            raise BlockedDestination(reason)
        request = _current_request.get()
        if request is not None:
            request.opened += 1
        return socket.socket(family=family, type=type_, proto=proto)

    return make


def dropped_keepalive(exc: BaseException, opened_sockets: int) -> bool:
    """Whether a request failed because the receiver closed its kept-alive connection before a
    byte of the answer arrived (the race of receivers that close idle connections): such a request
    is sent again at once on a new connection, as browsers and most HTTP clients do."""
    if opened_sockets or not isinstance(exc, _DROPPED_CONNECTION):
        return False
    if isinstance(exc, aiohttp.ClientConnectorError):
        return False  # connecting failed: that was a new connection
    # With part of an answer parsed, aiohttp passes it as the message: the receiver did answer.
    return not isinstance(exc, aiohttp.ServerDisconnectedError) or isinstance(exc.message, str)


class Sender:
    """Owns the HTTP sessions; every attempt goes through send().

    Each set of destination rules has sessions of its own (the operator's, and one per set of networks
    granted to tenants), so a connection, or a name resolved, under one set of rules is never reused
    under another: a keep-alive connection to an internal address opened for the operator's
    endpoint must not carry a tenant's request to the same host, which the tenant may not reach."""

    def __init__(
        self,
        concurrency: int,
        rules: DestinationRules | None = None,
        max_response_bytes: int = 64 * 1024,
        max_header_bytes: int = 8 * 1024,
        resolver: AbstractResolver | None = None,
        ca_bundle_file: str | None = None,
    ) -> None:
        self._concurrency = concurrency
        self._ca_bundle_file = ca_bundle_file
        # the operator's: security.* of the configuration
        self._rules = rules or DestinationRules()
        # Read at most this much of a response; a larger body is cut off and its connection closed.
        self._max_response_bytes = max_response_bytes
        self._max_header_bytes = max_header_bytes
        self._resolver = resolver
        # url_problem's answer per endpoint URL, keyed by (endpoint id, URL version, rules), never
        # by the URL itself, which may carry a token: it buys not parsing the URL again on every
        # attempt, which cost about as much as signing the request.
        self._url_problems: dict[tuple[int, str, DestinationRules], str | None] = {}
        # Each tenant's rules, by whether it is the operator's tenant and what it was granted.
        self._tenant_rules: dict[tuple[bool, tuple[object, ...]], DestinationRules] = {}
        self._tls: ssl.SSLContext | bool = True
        # Per set of rules: the session, and one only for a request sent again after its kept-alive
        # connection was dropped, whose connections are never reused, so the second try cannot
        # meet the same race.
        self._sessions: dict[DestinationRules, tuple[aiohttp.ClientSession, aiohttp.ClientSession]] = {}
        self._started = False

    async def start(self) -> None:
        # aiohttp's own verifying default unless a private CA is added to the system's
        self._tls = tls_context(self._ca_bundle_file) if self._ca_bundle_file else True
        self._started = True
        self._sessions_for(self._rules)

    def _sessions_for(self, rules: DestinationRules) -> tuple[aiohttp.ClientSession, aiohttp.ClientSession]:
        """The sessions of these rules, made the first time they are used (the rules are the operator's:
        one, and one per distinct set of networks granted to tenants)."""
        assert self._started, "Sender.start() first"
        sessions = self._sessions.get(rules)
        if sessions is None:
            sessions = self._sessions[rules] = (self._new_session(rules, force_close=False),
                                                 self._new_session(rules, force_close=True))
        return sessions

    def rules_for(self, row: Claimed) -> DestinationRules:
        """Where the row's endpoint may deliver: its tenant's rules (worker.rules.destinations), or the
        operator's when the claim carries no tenant's networks (a schema that predates them)."""
        if row.tenant_networks is None:
            return self._rules
        key = (row.tenant == OPERATOR_TENANT, row.tenant_networks)
        rules = self._tenant_rules.get(key)
        if rules is None:
            if len(self._tenant_rules) >= MAX_CHECKED_URLS:
                self._tenant_rules.clear()
            rules = tenant_destinations(self._rules, row.tenant, row.tenant_networks)
            self._tenant_rules[key] = rules
        return rules

    def _new_session(self, rules: DestinationRules, force_close: bool) -> aiohttp.ClientSession:
        resolver = CheckedResolver(self._resolver or aiohttp.DefaultResolver(), rules)
        connector = aiohttp.TCPConnector(
            limit=self._concurrency, limit_per_host=0, ttl_dns_cache=60, resolver=resolver,
            socket_factory=checked_socket_factory(rules), force_close=force_close,
            ssl=self._tls,
        )
        return aiohttp.ClientSession(
            connector=connector, auto_decompress=True, trust_env=False, raise_for_status=False,
            # No cookies: a receiver's Set-Cookie must never reach another endpoint on its host,
            # and filtering the jar for every request cost about 1% of the worker's CPU.
            cookie_jar=aiohttp.DummyCookieJar(),
            # A receiver's status line and each header line; and no more headers than this many.
            max_line_size=self._max_header_bytes, max_field_size=self._max_header_bytes,
            max_headers=MAX_RESPONSE_HEADERS,
        )

    async def close(self) -> None:
        sessions, self._sessions = self._sessions, {}
        for pair in sessions.values():
            for session in pair:
                await session.close()

    async def send(self, row: Claimed, body: bytes, timeout_seconds: float) -> Sent:
        rules = self.rules_for(row)
        problem = self.url_problem(row, rules)
        if problem is not None:
            return Sent(AttemptResult(failure=Category.BLOCKED, error=problem), 0, None)
        headers = request_headers(row, int(time.time()), body)
        connect_timeout = row.retry_policy.connect_timeout_seconds
        return await self._post(row.url, body, headers, timeout_seconds, connect_timeout, rules)

    def url_problem(self, row: Claimed, rules: DestinationRules | None = None) -> str | None:
        """Why the row's URL can never be delivered to (url_problem), asked once per URL version
        and rules."""
        rules = rules or self.rules_for(row)
        if not row.url_version:
            return url_problem(row.url, rules)
        key = (row.endpoint_id, row.url_version, rules)
        try:
            return self._url_problems[key]
        except KeyError:
            if len(self._url_problems) >= MAX_CHECKED_URLS:
                self._url_problems.clear()
            problem = self._url_problems[key] = url_problem(row.url, rules)
            return problem

    async def post(
        self, url: str, body: bytes, headers: dict[str, str], timeout_seconds: float,
        connect_timeout: float | None, rules: DestinationRules | None = None,
    ) -> Sent:
        """One POST under the destination rules (`rules`, else the operator's) and bounds; every
        outcome is a Sent, never a raise."""
        rules = rules or self._rules
        problem = url_problem(url, rules)
        if problem is not None:
            return Sent(AttemptResult(failure=Category.BLOCKED, error=problem), 0, None)
        return await self._post(url, body, headers, timeout_seconds, connect_timeout, rules)

    async def _post(
        self, url: str, body: bytes, headers: dict[str, str], timeout_seconds: float,
        connect_timeout: float | None, rules: DestinationRules,
    ) -> Sent:
        session, fresh_session = self._sessions_for(rules)
        started = time.monotonic()
        request = _RequestConnections()
        token = _current_request.set(request)
        try:
            # The whole attempt, body and a second try included, within the timeout: a receiver
            # that trickles its answer a byte at a time cannot hold a request open past it. This
            # is the only total timeout: a second one inside aiohttp cost a timer per request.
            client_timeout = _client_timeout(connect_timeout)
            async with asyncio.timeout(timeout_seconds):
                try:
                    response = await session.post(
                        url, data=body, headers=headers, allow_redirects=False, timeout=client_timeout)
                except _DROPPED_CONNECTION as exc:
                    if not dropped_keepalive(exc, request.opened):
                        raise
                    response = await fresh_session.post(
                        url, data=body, headers=headers, allow_redirects=False, timeout=client_timeout)
                async with response:
                    excerpt = await _read_excerpt(response, self._max_response_bytes, url)
            result = AttemptResult(status=response.status, retry_after=response.headers.get("Retry-After"))
        except Exception as exc:  # noqa: BLE001 - every transport failure becomes a category
            category, message = transport_failure(exc)
            result, excerpt = AttemptResult(failure=category, error=message), None
        finally:
            _current_request.reset(token)
        return Sent(result, int((time.monotonic() - started) * 1000), excerpt)


@functools.lru_cache(maxsize=64)
def _client_timeout(connect_timeout: float | None) -> aiohttp.ClientTimeout:
    """aiohttp's timeouts for a request: none in total (Sender._post bounds the whole attempt), the
    connect timeout of the endpoint's retry policy. One object per value, not one per request."""
    return aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout)


async def _read_excerpt(response: aiohttp.ClientResponse, limit: int, url: str) -> str:
    head = await response.content.read(EXCERPT_BYTES)
    drained, cut = len(head), False
    if drained < limit and response.content.at_eof():
        return excerpt_text(head, url)  # the whole body, read: no second read to learn so
    while drained < limit:
        chunk = await response.content.read(limit - drained)
        if not chunk:
            break
        drained, cut = drained + len(chunk), True
    else:
        response.close()
        cut = True  # at the limit: more may have followed
    return excerpt_text(head, url, cut)


def excerpt_text(raw: bytes, url: str, cut: bool = False) -> str:
    """At most EXCERPT_BYTES of UTF-8, cut at a character boundary, without NULs (PostgreSQL
    text cannot hold them): a receiver's error page of any encoding can always be stored. The
    URL's secret parts are redacted (an error page may quote the URL); `cut`: the body went on
    after `raw`, which may then end inside a quoted secret."""
    # an incomplete character at the end of a cut body is left out, so a secret cut off there
    # still ends the text and is found
    text = _UTF8("replace").decode(raw, final=False) if cut else raw.decode("utf-8", errors="replace")
    text = redact(text.replace("\x00", "\ufffd"), url, cut)
    return text.encode()[:EXCERPT_BYTES].decode("utf-8", errors="ignore")
