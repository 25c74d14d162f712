"""What every /v1 handler and the console share: the API's state (config, database, keys, metrics,
the failed-authentication limiter), the caller, the roles, the client's address, JSON answers."""

from __future__ import annotations

import asyncio
import datetime
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

import orjson
import psycopg
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Histogram

from worker.config import Config
from worker.encryption import Keyring
from worker.rules import forwarded, tokens
from worker.rules.event_types import EventType
from worker.rules.shapes import json_default
from worker.rules.tokens import Caller
from worker.store import messages as message_store
from worker.store import tokens as token_store
from worker.store.database import Database
from worker.web.limits import FailedAuthLimiter, Verdict
from worker.web.problems import forbidden, too_many_failed_authentications, unauthorized
from worker.web.schema_checks import SchemaChecks

# A tenant administrator (tenant_admin) reads, publishes and administers what admin does for
# endpoints, deliveries, dead letters and operations, kept to its tenant by PostgreSQL
# (webhooks_tenant_admin); the fleet's settings, tenants, tokens and catalogue stay the unscoped admin's.
PUBLISH = ("producer", "admin", "tenant_admin")
READ = ("reader", "admin", "tenant_admin")
ADMIN = ("admin", "tenant_admin")
FLEET_READ = ("reader", "admin")
FLEET_ADMIN = ("admin",)
T = TypeVar("T")


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
        self.schema_checks_over_budget = Counter(
            "webhook_api_schema_checks_over_budget",
            "Publish requests whose payloads' schema checks ran past api.schema_validation_budget_seconds "
            "(the checking process was killed; the payloads not checked were refused).", registry=r)


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
    # peers whose X-Forwarded-For / Forwarded headers name the client (api.trusted_proxies)
    trusted_proxies: tuple[forwarded.Network, ...] = field(init=False)
    # the event-type catalogue's entries publishes read, at the catalogue's version
    catalogue: Catalogue = field(default_factory=lambda: Catalogue())
    # the processes publishes' payloads are checked against their types' schemas in
    schema_checks: SchemaChecks = field(init=False)

    def __post_init__(self) -> None:
        self.trusted_proxies = forwarded.networks(self.config.api.trusted_proxies)
        self.schema_checks = SchemaChecks(self.config.api.schema_validation_processes,
                                          self.metrics.schema_checks_over_budget)

    async def check_credential(self, address: str, key: bytes | None,
                               lookup: Callable[[], Awaitable[T | None]],
                               reason: str = "invalid") -> Verdict[T]:
        """The limiter's verdict on a credential (worker.web.limits: a valid one always passes),
        failures counted in the metrics by `reason`, or as rate_limited past the limit."""
        return self._counted(await self.limiter.check(address, key, lookup), reason)

    def _counted(self, verdict: Verdict[T], reason: str = "invalid") -> Verdict[T]:
        if verdict.found is None:
            limited = verdict.retry_after is not None
            self.metrics.failed_authentications.labels("rate_limited" if limited else reason).inc()
        return verdict

    async def verify_token(self, token: str, address: str) -> Caller:
        """The caller a token stands for; raises a Problem (401 for a token that is malformed,
        unknown, revoked or expired; 429 for one of those from an address locked out for failing
        too often). A valid token is served whatever the address did. For the console's login too."""

        async def lookup() -> Caller | None:
            async with self.db.connection() as conn:
                return await token_store.verify(conn, token)

        key = tokens.token_hash(token) if tokens.well_formed(token) else None
        return _caller_or_refusal(await self.check_credential(address, key, lookup))

    def credential_of(self, request: web.Request, roles: tuple[str, ...]) -> Credential | None:
        """The request's bearer token when it is well formed (anything else is authenticate()'s to
        refuse), to be checked with what the request reads first (publishing())."""
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not tokens.well_formed(token):
            return None
        address = client_address(request)
        return Credential(tokens.token_hash(token), address, self.limiter.retry_after(address) is not None,
                          roles)

    async def authenticate(self, request: web.Request) -> Caller:
        """The caller of an API request, from its `Authorization: Bearer` header."""
        address = client_address(request)
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            # No credential guesses nothing: 401 always, and no failure counted against the address
            # (the limit slows guessing; a client that forgot its header is not locked out by it).
            self.metrics.failed_authentications.labels("missing").inc()
            raise unauthorized("an `Authorization: Bearer <token>` header is required")
        return await self.verify_token(token.strip(), address)

    @asynccontextmanager
    async def publishing(self, request: web.Request, names: Sequence[str],
                         fresh: bool = False) -> AsyncIterator[Publishing]:
        """A connection to publish on with message_store.publish_as() or publish_batch_as(), which check
        the token in the publish's own statement, and the catalogue's entries of the event types
        `names` at their version (the publish is refused if the catalogue has changed since). When
        this process has not read those entries at the catalogue's newest version it knows of (or
        `fresh`), one round trip reads them, with the caller the token stands for
        (api_publish_check()); a token not checked yet (the middleware leaves it to this) is then
        answered 401, 403 or 429 as authenticate() would."""
        credential = request[CREDENTIAL]
        kept = None if fresh else self.catalogue.entries(names)
        async with self.db.connection() as conn:
            if kept is not None:
                # the token is checked by the publish's statement alone: one it refuses (or a
                # refusal before it) leaves the credential unsettled, for the middleware to check
                # on its own and answer
                yield Publishing(conn, credential, *kept, kept=True)
                if not credential.settled:
                    credential.settled = True
                    self.limiter.passed(credential.token_hash)
                return
            found, version, known = await message_store.publish_check(conn, credential.token_hash, names)
            if not credential.settled:
                credential.settled = True
                verdict = self._counted(self.limiter.verdict(credential.address, credential.token_hash,
                                                             found, credential.locked))
                found = _caller_or_refusal(verdict)
                if found.role not in credential.roles:
                    raise forbidden(found.role, credential.roles)
            elif found is None:
                raise unauthorized("the token is not valid (unknown, revoked or expired)")  # since its check
            elif found.role not in credential.roles:
                raise forbidden(found.role, credential.roles)
            request[CALLER] = found
            self.catalogue.keep(version, names, known)
            yield Publishing(conn, credential, version, known)

def _caller_or_refusal(verdict: Verdict[Caller]) -> Caller:
    if verdict.found is not None:
        return verdict.found
    if verdict.retry_after is not None:
        raise too_many_failed_authentications(verdict.retry_after)
    raise unauthorized("the token is not valid (unknown, revoked or expired)")


@dataclass(frozen=True)
class Publishing:
    """What ApiState.publishing() read: the connection to publish on, the token, and the catalogue's
    entries of the event types asked for (a type not catalogued is absent) at its version."""

    conn: psycopg.AsyncConnection[Any]
    credential: Credential
    catalogue_version: int
    known: dict[str, EventType]
    # the entries are the ones this process kept from an earlier read: what they refuse is refused
    # only once read afresh (a publish they accept is refused by the database if they are stale)
    kept: bool = False


# Event types whose catalogue entries (or their absence) one API process keeps: a producer may name
# any type, so the copy is bounded; past the bound it starts again.
MAX_KEPT_EVENT_TYPES = 10_000


class Catalogue:
    """The catalogue's entries (or their absence) this process has read, at one version of the
    catalogue: every change to it moves its version (webhooks.event_types_version), and a publish
    that used these entries names their version and is refused when the catalogue has changed
    since, then read again (routes.py). So a change holds from the next publish, as when every
    publish read the catalogue itself."""

    def __init__(self, max_kept: int = MAX_KEPT_EVENT_TYPES) -> None:
        self.version: int | None = None
        self._entries: dict[str, EventType | None] = {}
        self._max_kept = max_kept

    def entries(self, names: Sequence[str]) -> tuple[int, dict[str, EventType]] | None:
        """The version and the entries of `names` (a type not catalogued absent), or None when any
        of them was not read at this version."""
        if self.version is None or any(name not in self._entries for name in names):
            return None
        return self.version, {name: entry for name in names if (entry := self._entries[name]) is not None}

    def keep(self, version: int, names: Sequence[str], known: dict[str, EventType]) -> None:
        """What a read of the catalogue found for `names` at `version`; a read older than what is
        kept is dropped, a newer one replaces it all."""
        if self.version is not None and version < self.version:
            return
        if version != self.version or len(self._entries) + len(names) > self._max_kept:
            self.version, self._entries = version, {}
        for name in names:
            self._entries[name] = known.get(name)

    def forget(self) -> None:
        self.version, self._entries = None, {}


@dataclass
class Credential:
    """A request's bearer token, checked with what its route reads first (ApiState.publishing()):
    its hash, the client's address, whether that address was locked out when the request came,
    the roles its route allows, and whether it has been checked (either way) yet."""

    token_hash: bytes
    address: str
    locked: bool
    roles: tuple[str, ...]
    settled: bool = False


STATE = web.AppKey("webhook_api_state", ApiState)
CALLER = web.RequestKey("webhook_api_caller", Caller)
CREDENTIAL = web.RequestKey("webhook_api_credential", Credential)
# the OpenAPI document, served at /v1/openapi.json
DOCUMENT = web.AppKey("webhook_api_document", dict[str, Any])


def client_address(request: web.Request) -> str:
    """The address a request's failures count against: the peer, or behind a proxy listed in
    api.trusted_proxies the client its X-Forwarded-For or Forwarded header names."""
    headers, trusted = request.headers, request.config_dict[STATE].trusted_proxies
    return forwarded.client_address(request.remote, headers.getall("X-Forwarded-For", []),
                                    headers.getall("Forwarded", []), trusted)


def caller_of(request: web.Request) -> Caller:
    return request[CALLER]


def _as_orjson(value: Any) -> Any:
    """What orjson writes for a value the standard library's json cannot (datetimes as RFC 3339)."""
    return value.isoformat() if isinstance(value, datetime.datetime | datetime.date) else json_default(value)


def json_response(data: Any, status: int = 200, location: str | None = None) -> web.Response:
    """A JSON answer; `location`, for a 201 or 202, is where what it made can be read (RFC 9110 10.2.2)."""
    headers = None if location is None else {"Location": location}
    try:
        body = orjson.dumps(data, default=json_default)
    except TypeError:
        # orjson stops at 254 levels: a stored payload of 254 levels, inside its delivery, is one more
        body = json.dumps(data, default=_as_orjson, ensure_ascii=False, separators=(",", ":")).encode()
    return web.Response(status=status, body=body, content_type="application/json", headers=headers)
