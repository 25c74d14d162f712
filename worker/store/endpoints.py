"""Endpoints as stored: registered and changed (their URL, signing secrets, headers and secret
settings sealed bound to their id, in the same transaction as the row), read in their one shape
(worker.rules.endpoints.COLUMNS), enabled, disabled, deleted, their circuits set, their credentials
re-sealed; for the CLI, the API and the console alike."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from datetime import datetime
from decimal import Decimal
from typing import Any

import psycopg

from worker import encryption
from worker.encryption import DecryptionError, Keyring
from worker.rules import signing
from worker.rules.endpoints import (
    COLUMNS,
    EVERY_EVENT_TYPE,
    DestinationScope,
    EndpointCreate,
    EndpointFields,
    EndpointProblem,
    EndpointUpdate,
    Registered,
    check_routing_key,
    coalescing_changes,
    columns_of,
    refused_tenant,
)
from worker.rules.redaction import display_url
from worker.rules.registration import headers_problem, url_has_userinfo
from worker.rules.self_service import SigningSecret
from worker.store.database import Conn, fetch_all, fetch_one


@dataclass(frozen=True)
class EndpointSpec:
    name: str
    url: str
    url_display: str
    signing_secrets: tuple[str, ...]
    event_types: tuple[str, ...] = EVERY_EVENT_TYPE
    headers: dict[str, str] = field(default_factory=dict)
    max_attempts: int | None = None
    timeout_ms: int | None = None
    retry_schedule: dict[str, Any] | None = None
    rate_limit_per_second: float | None = None
    rate_limit_burst: int | None = None
    max_in_flight: int | None = None
    circuit_policy: dict[str, Any] = field(default_factory=dict)
    body_format: str = "raw"
    secret_settings: dict[str, Any] = field(default_factory=dict, repr=False)
    active: bool = True
    tenant: str | None = None  # its name; None: the `default` tenant
    # every tenant's operational events, not only its own tenant's: the operator's channel
    operational_all_tenants: bool = False


class InvalidEndpoint(ValueError):
    """Endpoint settings that cannot be stored; the message names the field, never a credential."""


# --- which endpoint, and where it may deliver ---------------------------------------------------------


async def endpoint_ref(conn: Conn, name_or_id: str) -> int | None:
    """The endpoint an id, a name or TENANT/NAME names, as the caller sees them (webhooks.endpoint_ref();
    TooManyRows: a name held in more than one tenant, to a caller that is no tenant's)."""
    cur = await conn.execute("SELECT webhooks.endpoint_ref(%s)", (name_or_id,))
    row = await cur.fetchone()
    return None if row is None or row[0] is None else int(row[0])


async def stored(conn: Conn, endpoint_id: int) -> bool:
    """Whether the endpoint's row is there for the caller (row-level security hides another tenant's)."""
    cur = await conn.execute("SELECT 1 FROM webhooks.endpoints WHERE id = %s", (endpoint_id,))
    return await cur.fetchone() is not None


async def visible(conn: Conn, endpoint_id: int) -> bool:
    """Whether the caller sees the endpoint (row-level security answers another tenant's as missing)."""
    cur = await conn.execute("SELECT 1 FROM webhooks.endpoint_summary WHERE id = %s", (endpoint_id,))
    return await cur.fetchone() is not None


# The tenant a new endpoint goes to (its name given, or NULL: `default`, or a scoped caller's own)
# or, with an endpoint's id, that endpoint's tenant; no row: an endpoint the caller does not see.
DESTINATION_SCOPE = "SELECT tenant, allow_networks FROM webhooks.tenant_destinations(%s, %s)"


async def destination_scope(conn: Conn, tenant: str | None = None,
                            endpoint_id: int | None = None) -> DestinationScope | None:
    """Where an endpoint registered in `tenant` (or the endpoint `endpoint_id`) may deliver, as the
    caller's session sees it; None: no such endpoint for this caller. A tenant that does not exist
    is an EndpointProblem on `tenant`; another tenant than a scoped caller's own raises
    InsufficientPrivilege, as registration would."""
    try:
        cur = await conn.execute(DESTINATION_SCOPE, (tenant, endpoint_id))
        row = await cur.fetchone()
    except psycopg.errors.NoDataFound:
        raise refused_tenant(tenant) from None
    return None if row is None else DestinationScope(str(row[0]), tuple(row[1] or ()))


# --- register and update --------------------------------------------------------------------------


def _refused(exc: psycopg.Error, name: str | None = None, tenant: str | None = None) -> EndpointProblem:
    """What the database refused, as a field problem (its DETAIL may quote the row: never used)."""
    if isinstance(exc, psycopg.errors.UniqueViolation):
        # names are unique within a tenant: the clash is always in the endpoint's own tenant
        return EndpointProblem("name", f"an endpoint named {name!r} exists in this tenant" if name else
                               "an endpoint with this name exists in this tenant", conflict=True)
    if isinstance(exc, psycopg.errors.NoDataFound):
        return refused_tenant(tenant)
    constraint = getattr(exc.diag, "constraint_name", None) or ""
    if constraint == "tenant_max_endpoints":
        return EndpointProblem("tenant", str(exc.diag.message_primary), conflict=True)
    return EndpointProblem("(body)", f"refused by constraint {constraint or type(exc).__name__}")


async def register(conn: Conn, body: EndpointCreate, keyring: Keyring, *,
                   tenant: str | None = None, active: bool = True) -> Registered:
    """Store a new endpoint in one transaction (check_destination first: it may block on DNS), in
    `tenant` or else the body's."""
    tenant = tenant if tenant is not None else body.tenant
    secret = body.secret or signing.generate_secret()
    if (problem := signing.secret_problem(secret)) is not None:
        raise EndpointProblem("secret", problem)
    body_format = body.body_format or "raw"
    check_routing_key(body.body_format, body.routing_key)
    problem = headers_problem(body.url, body.headers or {})
    if problem is not None:
        raise EndpointProblem("headers", problem)
    # the columns webhooks.register_endpoint takes; the others follow in the same transaction
    taken = {spec_field.name for spec_field in fields(EndpointSpec)}
    later = {**coalescing_changes(body, body_format),
             **{k: v for k, v in columns_of(body).items() if k not in taken}}
    spec = EndpointSpec(
        name=body.name, url=body.url, url_display=display_url(body.url), signing_secrets=(secret,),
        event_types=tuple(body.event_types or EVERY_EVENT_TYPE), headers=body.headers or {},
        max_attempts=body.max_attempts,
        timeout_ms=round(body.timeout_seconds * 1000) if body.timeout_seconds else None,
        retry_schedule={"delays": body.retry_delays} if body.retry_delays else None,
        rate_limit_per_second=body.rate_limit_per_second, rate_limit_burst=body.rate_limit_burst,
        max_in_flight=body.max_in_flight, body_format=body_format,
        secret_settings={"routing_key": body.routing_key} if body.routing_key else {},
        active=active, tenant=tenant, operational_all_tenants=bool(body.operational_all_tenants),
    )
    try:
        async with conn.transaction():
            endpoint_id = await register_endpoint(conn, spec, keyring)
            if later:
                await update_endpoint(conn, endpoint_id, later, keyring)
    except InvalidEndpoint as exc:
        problem_field, _, detail = str(exc).partition(": ")
        raise EndpointProblem(problem_field, detail) from None
    except (psycopg.errors.UniqueViolation, psycopg.errors.NoDataFound, psycopg.errors.CheckViolation) as exc:
        raise _refused(exc, body.name, tenant) from None
    return Registered(endpoint_id, body.name, spec.url_display, secret)


async def update(conn: Conn, endpoint_id: int, body: EndpointUpdate, keyring: Keyring) -> list[str]:
    """Change what the body gives, in one transaction (check_destination first for a new URL); the
    fields changed."""
    changes = columns_of(body)
    coalesce = body.coalesce_max is not None or body.coalesce_window is not None
    if not changes and body.routing_key is None and not coalesce:
        raise EndpointProblem("(body)", "nothing to change: give at least one field")
    try:
        async with conn.transaction():
            if coalesce or body.body_format is not None:
                stored = await endpoint_coalescing(conn, endpoint_id)
                stored_format, stored_max = stored or (None, None)
                changes.update(coalescing_changes(body, body.body_format or stored_format, stored_max))
            if body.routing_key is not None or body.body_format == "pagerduty":
                stored_format, settings = await endpoint_format_and_settings(conn, endpoint_id, keyring)
                check_routing_key(body.body_format, body.routing_key, stored_format,
                                  "routing_key" in settings)
                if body.routing_key is not None:
                    changes["secret_settings"] = {**settings, "routing_key": body.routing_key}
            await update_endpoint(conn, endpoint_id, changes, keyring)
    except InvalidEndpoint as exc:
        problem_field, _, detail = str(exc).partition(": ")
        raise EndpointProblem(problem_field, detail) from None
    except (psycopg.errors.UniqueViolation, psycopg.errors.CheckViolation) as exc:
        raise _refused(exc) from None
    renamed = {"secret_settings": "routing_key", "timeout_ms": "timeout_seconds",
               "retry_schedule": "retry_delays", "delivery_ttl": "ttl_seconds"}
    return sorted({renamed.get(k, k) for k in changes if k != "url_display"})


async def register_endpoint(conn: Conn, spec: EndpointSpec, keyring: Keyring) -> int:
    """Store an endpoint. Its URL, signing secrets, headers and secret settings are sealed bound to
    its id, so the row is inserted first and its credentials stored in the same transaction: nothing
    in plaintext, and nothing sealed without its row, is ever committed."""
    problem = headers_problem(spec.url, spec.headers)
    if problem is not None:
        raise InvalidEndpoint(f"headers: {problem}")
    async with conn.transaction():
        cur = await conn.execute(
            "SELECT webhooks.register_endpoint(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s,"
            " %s, %s, %s)",
            (
                spec.name,
                "",  # the credentials follow once the id they are bound to is known
                spec.url_display,
                "[]",
                list(spec.event_types),
                "{}",
                spec.max_attempts,
                spec.timeout_ms,
                json.dumps(spec.retry_schedule) if spec.retry_schedule is not None else None,
                # numeric in SQL: a float would arrive as double precision, which matches no signature
                None if spec.rate_limit_per_second is None else Decimal(str(spec.rate_limit_per_second)),
                spec.rate_limit_burst,
                spec.max_in_flight,
                json.dumps(spec.circuit_policy),
                spec.body_format,
                "{}",
                spec.active,
                spec.tenant,
                spec.operational_all_tenants,
            ),
        )
        row = await cur.fetchone()
        assert row is not None
        endpoint_id = int(row[0])
        await conn.execute(
            "SELECT webhooks.store_endpoint_credentials(%s, %s, %s, %s, %s)",
            (
                endpoint_id,
                keyring.seal(spec.url, encryption.URL, endpoint_id),
                json.dumps([
                    {"secret": keyring.seal(s, encryption.SIGNING_SECRET, endpoint_id), "expires_at": None}
                    for s in spec.signing_secrets
                ]),
                json.dumps(keyring.seal_settings(spec.secret_settings, endpoint_id)),
                json.dumps(keyring.seal_headers(spec.headers, endpoint_id)),
            ),
        )
    return endpoint_id


@dataclass(frozen=True)
class StoredCredentials:
    """An endpoint's credentials as stored (sealed), read for a change that depends on them."""

    url: str = field(repr=False)
    signing_secrets: list[dict[str, Any]] = field(repr=False)
    secret_settings: dict[str, str] = field(repr=False)
    headers: dict[str, str] = field(repr=False)


async def stored_credentials(conn: Conn, endpoint_id: int) -> StoredCredentials | None:
    """The endpoint's sealed credentials, locked until the caller's transaction ends."""
    row = await fetch_one(conn, "SELECT * FROM webhooks.endpoint_credentials(%s, 1)", (endpoint_id - 1,))
    if row is None or row["id"] != endpoint_id:
        return None
    return StoredCredentials(row["url"], row["signing_secrets"], row["secret_settings"], row["headers"])


async def endpoint_coalescing(conn: Conn, endpoint_id: int) -> tuple[str, int | None] | None:
    """The endpoint's body format and coalesce_max, for a change to either."""
    cur = await conn.execute("SELECT body_format, coalesce_max FROM webhooks.endpoints WHERE id = %s",
                             (endpoint_id,))
    row = await cur.fetchone()
    return None if row is None else (str(row[0]), row[1])


async def endpoint_format_and_settings(conn: Conn, endpoint_id: int, keyring: Keyring
                                       ) -> tuple[str | None, dict[str, str]]:
    """The endpoint's body format and its secret settings opened, for a change that keeps them."""
    cur = await conn.execute("SELECT body_format FROM webhooks.endpoint_summary WHERE id = %s",
                             (endpoint_id,))
    row = await cur.fetchone()
    stored = await stored_credentials(conn, endpoint_id)
    if row is None or stored is None:
        return None, {}
    try:
        settings = keyring.open_settings(stored.secret_settings, endpoint_id, allow_plaintext=True)
    except DecryptionError as exc:
        raise InvalidEndpoint(f"secret_settings: the stored settings cannot be opened: {exc}") from None
    return str(row[0]), settings


async def update_endpoint(conn: Conn, endpoint_id: int, changes: dict[str, Any], keyring: Keyring) -> None:
    """Apply changes (webhooks.update_endpoint's fields); a new URL, headers or secret settings are
    sealed bound to the endpoint, and headers are checked against the URL they will go with."""
    changes = dict(changes)
    async with conn.transaction():
        if changes.get("url") is not None or changes.get("headers") is not None:
            await _check_url_and_headers(conn, endpoint_id, changes, keyring)
        if changes.get("url") is not None:
            changes["url"] = keyring.seal(changes["url"], encryption.URL, endpoint_id)
        if changes.get("secret_settings") is not None:
            changes["secret_settings"] = keyring.seal_settings(changes["secret_settings"], endpoint_id)
        if changes.get("headers") is not None:
            changes["headers"] = keyring.seal_headers(changes["headers"], endpoint_id)
        await conn.execute("SELECT webhooks.update_endpoint(%s, %s)", (endpoint_id, json.dumps(changes)))


async def _check_url_and_headers(conn: Conn, endpoint_id: int, changes: dict[str, Any],
                                 keyring: Keyring) -> None:
    stored = await stored_credentials(conn, endpoint_id)
    if stored is None:
        return  # no such endpoint: the update changes nothing
    url = changes.get("url")
    if url is None:
        try:
            url = keyring.open(stored.url, encryption.URL, endpoint_id, allow_plaintext=True)
        except DecryptionError as exc:
            raise InvalidEndpoint(f"url: the stored URL cannot be opened: {exc}") from None
    headers = changes.get("headers")
    if headers is not None:
        problem = headers_problem(url, headers)
    elif url_has_userinfo(url) and any(name.lower() == "authorization" for name in stored.headers):
        problem = headers_problem(url, {"Authorization": "x"})
    else:
        problem = None
    if problem is not None:
        raise InvalidEndpoint(f"headers: {problem}")


async def rotate_secret(conn: Conn, endpoint_id: int, secret: str, old_expire_at: datetime | None,
                        keyring: Keyring, decided_by: str = "operator") -> int:
    """Sign with `secret` from now on, the earlier secrets until `old_expire_at`; the rotation is an
    endpoint event naming `decided_by` (webhooks.rotate_secret()). The secrets in use, 0: no such
    endpoint for the caller."""
    sealed = keyring.seal(secret, encryption.SIGNING_SECRET, endpoint_id)
    cur = await conn.execute("SELECT webhooks.rotate_secret(%s, %s, %s, %s)",
                             (endpoint_id, sealed, old_expire_at, decided_by))
    row = await cur.fetchone()
    return 0 if row is None or row[0] is None else int(row[0])


# --- reading ----------------------------------------------------------------------------------------


async def read(conn: Conn, endpoint_id: int) -> dict[str, Any] | None:
    """An endpoint in its one shape (COLUMNS)."""
    return await fetch_one(conn, f"SELECT {COLUMNS} FROM webhooks.endpoint_summary WHERE id = %s",
                           (endpoint_id,))


async def listing(conn: Conn) -> list[dict[str, Any]]:
    """Every endpoint in its one shape, with its attempt counts (`endpoints list`)."""
    return await fetch_all(conn, f"SELECT {COLUMNS}, successes, failures FROM webhooks.endpoint_summary"
                                 " ORDER BY id")


async def page(conn: Conn, after_id: int | None, limit: int) -> list[dict[str, Any]]:
    """A page of endpoints in their one shape, by id after a cursor (GET /v1/endpoints)."""
    return await fetch_all(
        conn, f"SELECT {COLUMNS} FROM webhooks.endpoint_summary"
              " WHERE (%(after)s::bigint IS NULL OR id > %(after)s) ORDER BY id LIMIT %(limit)s",
        {"after": after_id, "limit": limit})


async def details(conn: Conn, endpoint_id: int) -> dict[str, Any] | None:
    """An endpoint in its one shape, its queued rows by status and its last ten changes."""
    row = await read(conn, endpoint_id)
    if row is None:
        return None
    row["queued"] = {r["status"]: r["n"] for r in await fetch_all(
        conn, "SELECT status, count(*) AS n FROM webhooks.alert_delivery_queue WHERE webhook_id = %s"
              " GROUP BY status ORDER BY status", (endpoint_id,))}
    row["recent_changes"] = await fetch_all(
        conn, "SELECT change, reason, decided_by, delivery_id, at FROM webhooks.endpoint_events"
              " WHERE webhook_id = %s ORDER BY at DESC, id DESC LIMIT 10", (endpoint_id,))
    return row


async def activity(conn: Conn, endpoint_id: int) -> dict[str, Any]:
    """The endpoint's queued rows by status and its last state changes (`endpoints show`)."""
    cur = await conn.execute(
        "SELECT status, count(*) FROM webhooks.alert_delivery_queue WHERE webhook_id = %s GROUP BY 1",
        (endpoint_id,))
    return {
        "queued": dict(await cur.fetchall()),
        "events": await fetch_all(
            conn,
            "SELECT change, reason, decided_by, delivery_id, at FROM webhooks.endpoint_events"
            " WHERE webhook_id = %s ORDER BY at DESC LIMIT 10",
            (endpoint_id,),
        ),
    }


async def health(conn: Conn, endpoint_id: int, hours: int) -> dict[str, Any] | None:
    """The endpoint's health and circuit, and its attempts over the last `hours` by outcome and category."""
    row = await fetch_one(
        conn, "SELECT id, name, active, health_status, circuit_state, circuit_open_until,"
              " consecutive_failures, successes, failures, last_success_at, last_failure_at"
              " FROM webhooks.endpoint_summary WHERE id = %s", (endpoint_id,))
    if row is None:
        return None
    row["window_hours"] = hours
    row["recent"] = await fetch_all(
        conn, "SELECT outcome, coalesce(failure_category, 'none') AS category, count(*) AS attempts"
              " FROM webhooks.alert_delivery_log WHERE webhook_id = %s"
              " AND logged_at >= now() - make_interval(hours => %s)"
              " GROUP BY 1, 2 ORDER BY 1, 2", (endpoint_id, hours))
    last = await fetch_one(
        conn, "SELECT failure_category FROM webhooks.alert_delivery_log WHERE webhook_id = %s"
              " AND failure_category IS NOT NULL ORDER BY logged_at DESC LIMIT 1", (endpoint_id,))
    row["last_failure_category"] = None if last is None else last["failure_category"]
    return row


async def summaries(conn: Conn, limit: int) -> list[dict[str, Any]]:
    """Endpoints with their health and their last failure's category (the console's lists). The
    category comes from the audit log, read only from the last failure's time on."""
    return await fetch_all(
        conn,
        "SELECT s.id, s.name, s.description, s.url_display, s.active, s.disabled_reason, s.health_status,"
        "       s.circuit_state,"
        "       s.circuit_open_until, s.consecutive_failures, s.last_success_at, s.last_failure_at,"
        "       f.failure_category AS last_failure_category"
        " FROM webhooks.endpoint_summary s"
        " LEFT JOIN LATERAL ("
        "     SELECT l.failure_category FROM webhooks.alert_delivery_log l"
        "     WHERE l.webhook_id = s.id AND l.failure_category IS NOT NULL"
        "       AND l.logged_at >= s.last_failure_at - interval '1 minute'"
        "     ORDER BY l.logged_at DESC LIMIT 1) f ON true"
        " ORDER BY s.id LIMIT %s",
        (limit,))


async def events(conn: Conn, endpoint_id: int, limit: int) -> list[dict[str, Any]]:
    """An endpoint's latest state changes, newest first."""
    return await fetch_all(
        conn, "SELECT at, change, reason, decided_by FROM webhooks.endpoint_events WHERE webhook_id = %s"
              " ORDER BY at DESC LIMIT %s", (endpoint_id, limit))


async def latest_events(conn: Conn, limit: int) -> list[dict[str, Any]]:
    """Every endpoint's latest state changes, newest first, with the endpoint's name."""
    return await fetch_all(
        conn,
        "SELECT v.at, v.webhook_id, e.name AS endpoint_name, v.change, v.reason, v.decided_by"
        " FROM webhooks.endpoint_events v JOIN webhooks.endpoint_summary e ON e.id = v.webhook_id"
        " ORDER BY v.at DESC LIMIT %s", (limit,))


async def names(conn: Conn, limit: int) -> dict[str, list[Any]]:
    """The endpoints' and the tenants' ids and names, by name (the console's filter choices)."""
    endpoints = await fetch_all(conn, "SELECT id, name FROM webhooks.endpoint_summary ORDER BY name LIMIT %s",
                                (limit,))
    tenants = await fetch_all(conn, "SELECT id, name FROM webhooks.tenant_summary ORDER BY name LIMIT %s",
                              (limit,))
    return {"endpoints": endpoints, "tenants": tenants}


# --- state changes ------------------------------------------------------------------------------------


async def set_active(conn: Conn, endpoint_id: int, active: bool, reason: str,
                     decided_by: str | None = None) -> str | None:
    """Enable or disable the endpoint (webhooks.enable_endpoint(), disable_endpoint()); the change made,
    or None when there was nothing to do. Without `decided_by` the functions' default names who."""
    if decided_by is None:
        cur = await (conn.execute("SELECT webhooks.enable_endpoint(%s)", (endpoint_id,)) if active else
                     conn.execute("SELECT webhooks.disable_endpoint(%s, %s)", (endpoint_id, reason)))
    elif active:
        cur = await conn.execute("SELECT webhooks.enable_endpoint(%s, %s)", (endpoint_id, decided_by))
    else:
        cur = await conn.execute("SELECT webhooks.disable_endpoint(%s, %s, %s)",
                                 (endpoint_id, reason, decided_by))
    row = await cur.fetchone()
    return None if row is None else row[0]


async def set_circuit(conn: Conn, endpoint_id: int, action: str, until: datetime | str | None,
                      decided_by: str | None = None) -> str:
    """Reset, open or close the endpoint's circuit (webhooks.set_circuit()); the change made."""
    if decided_by is None:
        cur = await conn.execute("SELECT webhooks.set_circuit(%s, %s, %s)", (endpoint_id, action, until))
    else:
        cur = await conn.execute("SELECT webhooks.set_circuit(%s, %s, %s, %s)",
                                 (endpoint_id, action, until, decided_by))
    row = await cur.fetchone()
    assert row is not None
    return str(row[0])


# The console's endpoint actions: a change with a reason, through the functions the CLI calls.
ENDPOINT_ACTIONS = ("enable", "disable", "reset", "open")


async def act(conn: Conn, endpoint_id: int, action: str, reason: str, decided_by: str) -> str | None:
    """An endpoint change through the function the CLI calls; the change made, or None when there was
    nothing to do (enabling an enabled endpoint). The reason is recorded in the endpoint's events,
    apart from who decided."""
    if action == "disable":
        cur = await conn.execute("SELECT webhooks.disable_endpoint(%s, %s, %s)",
                                 (endpoint_id, reason, decided_by))
    elif action == "enable":
        cur = await conn.execute("SELECT webhooks.enable_endpoint(%s, %s, %s)",
                                 (endpoint_id, decided_by, reason))
    elif action in ("reset", "open"):
        cur = await conn.execute("SELECT webhooks.set_circuit(%s, %s, NULL, %s, %s)",
                                 (endpoint_id, action, decided_by, reason))
    else:
        raise ValueError(f"action: must be one of {', '.join(ENDPOINT_ACTIONS)}")
    row = await cur.fetchone()
    return None if row is None or row[0] is None else str(row[0])


async def delete(conn: Conn, endpoint_id: int, drop_pending: bool, decided_by: str) -> int | None:
    """webhooks.api_delete_endpoint(): the rows dropped with it (made dead letters), or None when there
    is no such endpoint. Refused (ObjectInUse) while rows wait without drop_pending, and while any is
    being sent."""
    cur = await conn.execute("SELECT webhooks.api_delete_endpoint(%s, %s, %s)",
                             (endpoint_id, drop_pending, decided_by))
    row = await cur.fetchone()
    return None if row is None or row[0] is None else int(row[0])


# --- credentials at rest ---------------------------------------------------------------------------


async def signing_secrets(conn: Conn, keyring: Keyring, endpoint_id: int,
                          allow_plaintext: bool = False) -> list[SigningSecret] | None:
    """The secrets the endpoint's requests are signed with now, newest first, opened with the keys
    (what its receiver needs to verify); None when there is no such endpoint, or it is another
    tenant's to a session kept to one. A value that does not open raises DecryptionError; one
    stored in plaintext UnsealedValue unless allow_plaintext (security.require_sealed)."""
    async with conn.transaction():
        cur = await conn.execute("SELECT id, signing_secrets FROM webhooks.endpoint_credentials(%s, 1)",
                                 (endpoint_id - 1,))
        row = await cur.fetchone()
    if row is None or row[0] != endpoint_id:
        return None
    cur = await conn.execute("SELECT now()")  # the database's clock decides, as for signing
    clock = await cur.fetchone()
    assert clock is not None
    now: datetime = clock[0]
    opened = []
    for stored in row[1]:
        expires_at = _timestamp(stored.get("expires_at"))
        if expires_at is None or expires_at > now:
            secret = keyring.open(stored["secret"], encryption.SIGNING_SECRET, endpoint_id, allow_plaintext)
            opened.append(SigningSecret(secret, expires_at))
    return opened


def _timestamp(value: Any) -> datetime | None:
    return None if value is None else datetime.fromisoformat(value)


# --- credentials at rest, re-sealed ----------------------------------------------------------------


async def url_fingerprints(conn: Conn, keyring: Keyring, batch_size: int = 500) -> dict[int, str]:
    """Each endpoint's URL fingerprint (Keyring.fingerprint), or '?' where the URL cannot be opened."""
    fingerprints: dict[int, str] = {}
    after = 0
    while True:
        # A plain read (the operator CLI runs as the schema owner): endpoint_credentials() would lock
        # the rows, and a listing must not hold up a worker disabling an endpoint.
        cur = await conn.execute(
            "SELECT id, url FROM webhooks.endpoints WHERE id > %s ORDER BY id LIMIT %s", (after, batch_size))
        rows = await cur.fetchall()
        for endpoint_id, url in rows:
            try:
                fingerprints[endpoint_id] = keyring.fingerprint(
                    keyring.open(url, encryption.URL, endpoint_id, allow_plaintext=True))
            except DecryptionError:
                fingerprints[endpoint_id] = "?"
        if len(rows) < batch_size:
            return fingerprints
        after = rows[-1][0]


async def credential_keys(conn: Conn) -> dict[str, int]:
    cur = await conn.execute("SELECT * FROM webhooks.credential_keys()")
    return {str(k): int(n) for k, n in await cur.fetchall()}


async def unbound_credentials(conn: Conn, keyring: Keyring, batch_size: int = 500) -> int:
    """How many stored credentials are not sealed bound to their endpoint (plaintext, sealed before
    binding, or not opening with these keys): what `keys rotate` would still change or cannot."""
    count, after = 0, 0
    while True:
        # A plain read, like url_fingerprints: a status query must not lock endpoints.
        cur = await conn.execute(
            "SELECT id, url, signing_secrets, secret_settings, headers FROM webhooks.endpoints"
            " WHERE id > %s ORDER BY id LIMIT %s", (after, batch_size))
        rows = await cur.fetchall()
        for endpoint_id, url, stored_secrets, settings, headers in rows:
            values = [(url, encryption.URL)]
            values += [(entry["secret"], encryption.SIGNING_SECRET) for entry in stored_secrets]
            values += [(str(v), encryption.setting(name)) for name, v in settings.items()]
            values += [(str(v), encryption.header(name)) for name, v in headers.items()]
            count += sum(not keyring.is_bound(value, purpose, endpoint_id) for value, purpose in values)
        if len(rows) < batch_size:
            return count
        after = rows[-1][0]


async def reseal_credentials(conn: Conn, keyring: Keyring, batch_size: int = 100) -> int:
    """Re-seal every endpoint's credentials under the keyring's primary key, bound to their endpoint
    (sealing any stored in plaintext, binding any sealed before binding existed), one committed batch
    of endpoints at a time; returns how many endpoints changed."""
    changed, after = 0, 0
    while True:
        async with conn.transaction():
            cur = await conn.execute("SELECT * FROM webhooks.endpoint_credentials(%s, %s)",
                                     (after, batch_size))
            rows = await cur.fetchall()
            for endpoint_id, url, stored_secrets, settings, headers in rows:
                new_url = keyring.reseal(url, encryption.URL, endpoint_id)
                new_secrets = [
                    {**entry,
                     "secret": keyring.reseal(entry["secret"], encryption.SIGNING_SECRET, endpoint_id)}
                    for entry in stored_secrets
                ]
                new_settings = {
                    name: keyring.reseal(str(value), encryption.setting(name), endpoint_id)
                    for name, value in settings.items()
                }
                new_headers = {
                    name: keyring.reseal(str(value), encryption.header(name), endpoint_id)
                    for name, value in headers.items()
                }
                new = (new_url, new_secrets, new_settings, new_headers)
                if new != (url, stored_secrets, settings, headers):
                    await conn.execute(
                        "SELECT webhooks.store_endpoint_credentials(%s, %s, %s, %s, %s)",
                        (endpoint_id, new_url, json.dumps(new_secrets), json.dumps(new_settings),
                         json.dumps(new_headers)),
                    )
                    changed += 1
        if len(rows) < batch_size:
            return changed
        after = rows[-1][0]


__all__ = ["EndpointFields", "EndpointSpec", "InvalidEndpoint", "StoredCredentials"]
