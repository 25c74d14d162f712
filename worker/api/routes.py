"""The /v1 routes: each a thin handler over the SQL functions, under the caller's database role."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, TypeVar
from urllib.parse import urlencode

import orjson
import psycopg
from aiohttp import web
from pydantic import Field, JsonValue, field_validator

from worker import coalescing, event_types, signing
from worker import endpoints as endpoint_service
from worker import operator_sql as operator_queries
from worker import tenants as tenant_rules
from worker.api import endpoints as endpoint_rules
from worker.api import queries, self_service
from worker.api.app import (
    ADMIN,
    FLEET_ADMIN,
    FLEET_READ,
    PUBLISH,
    READ,
    STATE,
    ApiState,
    allow,
    caller_of,
    json_response,
)
from worker.api.inputs import (
    BIGINT_MAX,
    INTEGER_MAX,
    SMALLINT,
    Body,
    decode_cursor,
    encode_cursor,
    limit_param,
    path_id,
    printable_text,
    query_params,
    read_body,
    read_json,
    read_optional_body,
    timestamp,
    timestamp_param,
)
from worker.api.problems import Problem, conflict, invalid, not_found
from worker.api.tokens import Caller
from worker.observability import get_logger
from worker.policy import RetrySchedule, category_problem
from worker.shapes import json_default

T = TypeVar("T")
# A full tenant queue drains at the tenant's delivery rate; a few seconds is a fair first wait.
QUOTA_RETRY_AFTER_SECONDS = 5
STATUSES = ("pending", "delivering", "retrying", "delivered", "dead_letter")
# W3C trace context, as the queue's traceparent_w3c_format constraint accepts it.
TRACEPARENT = re.compile(r"^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$")
HEALTH_WINDOW_HOURS = 24


def _state(request: web.Request) -> ApiState:
    return request.app[STATE]


def _decided_by(caller: Caller) -> str:
    return f"api:{caller.name}"


def _printable(value: str | None) -> str | None:
    if value is not None and not value.isprintable():
        raise ValueError("must be printable (no control characters)")
    return value


# --- messages ---------------------------------------------------------------------------------------


class MessageBody(Body):
    event_type: str = Field(min_length=1, max_length=256)
    payload: JsonValue
    endpoint: str | int | None = None
    idempotency_key: str | None = Field(default=None, min_length=1, max_length=512)
    ordering_key: str | None = Field(default=None, min_length=1, max_length=512)
    priority: int = Field(default=0, ge=SMALLINT[0], le=SMALLINT[1])
    expires_at: datetime | None = None

    @field_validator("event_type", "idempotency_key", "ordering_key")
    @classmethod
    def _printable(cls, value: str | None) -> str | None:
        return _printable(value)

    @field_validator("expires_at", mode="before")
    @classmethod
    def _expires_at(cls, value: Any) -> Any:
        if isinstance(value, str):
            return timestamp(value, "expires_at")
        if value is not None:
            raise ValueError("expected an RFC 3339 timestamp string")
        return value


# \u0000 in JSON text, not an escaped backslash followed by "u0000"
NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


@allow(*PUBLISH)
async def publish(request: web.Request) -> web.Response:
    body = await read_body(request, MessageBody)
    traceparent = request.headers.get("traceparent")
    if traceparent is not None and not _valid_traceparent(traceparent):
        raise invalid("traceparent", "not a W3C trace context (00-<32 hex>-<16 hex>-<2 hex>)")
    endpoint = None if body.endpoint is None else str(body.endpoint)
    try:
        payload = orjson.dumps(body.payload).decode()
    except TypeError:  # orjson's own limit: nested deeper than 254
        raise invalid("payload", "nested too deep (at most 254 levels)") from None
    if "\\u0000" in payload and NUL_ESCAPE.search(payload):
        raise invalid("payload", "holds \\u0000, which PostgreSQL's jsonb cannot store")
    try:
        async with _state(request).db.transaction(caller_of(request)) as conn:
            known = await event_types.get_async(conn, body.event_type)
            refused = event_types.publish_problem(body.event_type, known, body.payload,
                                                  _state(request).config.api.require_known_event_types)
            if refused is not None:
                raise invalid(refused.field, refused.message)
            rows = await queries.publish(conn, body.event_type, payload, endpoint, body.idempotency_key,
                                         body.ordering_key, body.priority, body.expires_at, traceparent)
    except psycopg.errors.NoDataFound:
        raise invalid("endpoint", "no endpoint with this name or id") from None
    except psycopg.errors.ProgramLimitExceeded as exc:
        raise Problem(413, "payload-too-large", "The payload is too large",
                      f"payload: {exc.diag.message_primary}", field="payload") from None
    except psycopg.errors.InsufficientPrivilege as exc:
        raise invalid("event_type", str(exc.diag.message_primary)) from None
    except psycopg.errors.UniqueViolation as exc:
        if exc.diag.constraint_name != "idempotency_key_reused":
            raise
        raise conflict(str(exc.diag.message_primary), field="idempotency_key") from None
    except psycopg.errors.ConfigurationLimitExceeded as exc:
        # the tenant's max_queued: the producer waits for the queue to drain, nothing is lost
        raise Problem(429, "tenant-quota", "The tenant's queue is full", str(exc.diag.message_primary),
                      headers={"Retry-After": str(QUOTA_RETRY_AFTER_SECONDS)}) from None
    created = any(row["created"] for row in rows)
    # the key given, or the event id generated for it (every delivery's webhook-id)
    event_id = rows[0]["idempotency_key"] if rows else body.idempotency_key
    deliveries = [{k: row[k] for k in ("delivery_id", "endpoint_id", "endpoint_name")} for row in rows]
    # where the deliveries it made can be followed
    where = None if event_id is None else "/v1/deliveries?" + urlencode({"idempotency_key": event_id})
    return json_response({"idempotency_key": event_id, "created": created, "deliveries": deliveries},
                         status=202 if created or not rows else 200, location=where if created else None)


def _valid_traceparent(value: str) -> bool:
    return (TRACEPARENT.fullmatch(value) is not None and not value.startswith("ff")
            and value[3:35] != "0" * 32 and value[36:52] != "0" * 16)


# --- deliveries -------------------------------------------------------------------------------------


async def _endpoint_filter(conn: psycopg.AsyncConnection[Any], value: str | None, field: str) -> int | None:
    if value is None:
        return None
    found = await queries.endpoint_id(conn, value)
    if found is None:
        raise invalid(field, "no endpoint with this name or id")
    return found


def _check_category(value: str | None, field: str) -> None:
    # an unknown category matches nothing: a filter (or a bulk replay) that silently finds nothing
    problem = None if value is None else category_problem(value)
    if problem is not None:
        raise invalid(field, problem)


DELIVERY_FILTERS = {"status", "endpoint", "event_type", "category", "since", "until", "idempotency_key",
                    "tenant", "cursor", "limit"}


@allow(*READ)
async def list_deliveries(request: web.Request) -> web.Response:
    params = query_params(request, DELIVERY_FILTERS)
    limit = limit_param(params)
    status = params.get("status")
    if status is not None and status not in STATUSES:
        raise invalid("status", f"expected one of {', '.join(STATUSES)}")
    _check_category(params.get("category"), "category")
    before = decode_cursor(params["cursor"], (int,))[0] if "cursor" in params else None
    filters: dict[str, Any] = {
        "status": status, "event_type": params.get("event_type"), "category": params.get("category"),
        "idempotency_key": params.get("idempotency_key"),
        "since": timestamp_param(params, "since"), "until": timestamp_param(params, "until"),
    }
    async with _state(request).db.transaction(caller_of(request)) as conn:
        await self_service.narrow_to_tenant(conn, params.get("tenant"))
        filters["webhook_id"] = await _endpoint_filter(conn, params.get("endpoint"), "endpoint")
        rows = await queries.deliveries(conn, filters, before, limit + 1)
    more = len(rows) > limit
    rows = rows[:limit]
    cursor = encode_cursor(rows[-1]["delivery_id"]) if more else None
    return json_response({"items": rows, "next_cursor": cursor})


@allow(*READ)
async def get_delivery(request: web.Request) -> web.Response:
    delivery_id = path_id(request)
    async with _state(request).db.transaction(caller_of(request)) as conn:
        row = await queries.delivery(conn, delivery_id)
    if row is None:
        raise not_found(f"delivery {delivery_id}")
    for attempt in row["attempts_history"]:
        digest_id = attempt["digest_id"]
        attempt["digest"] = None if digest_id is None else coalescing.digest_label(digest_id)
        if digest_id is None:
            attempt["digest_rows"] = None
    row["attempts_history"] = row.pop("attempts_history")
    return json_response(row)


@allow(*ADMIN)
async def replay_delivery(request: web.Request) -> web.Response:
    delivery_id = path_id(request)
    await _no_body(request)
    async with _state(request).db.transaction(caller_of(request)) as conn:
        replayed = await queries.replay(conn, delivery_id)
        status = None if replayed else await queries.delivery_status(conn, delivery_id)
    if replayed:
        get_logger().info("api replayed a delivery", delivery_id=delivery_id, by=caller_of(request).name)
        return json_response({"delivery_id": delivery_id, "status": "pending"}, status=202,
                             location=f"/v1/deliveries/{delivery_id}")
    if status is None:
        raise not_found(f"delivery {delivery_id}")
    raise conflict(f"delivery {delivery_id} is {status}: only dead letters and delivered rows are replayed")


class NoBody(Body):
    """Routes that take no body accept `{}` or nothing, and refuse any field."""


async def _no_body(request: web.Request) -> None:
    await read_optional_body(request, NoBody)


# --- dead letters -----------------------------------------------------------------------------------

DEAD_LETTER_FILTERS = {"endpoint", "event_type", "category", "since", "until", "tenant", "cursor", "limit"}


@allow(*READ)
async def list_dead_letters(request: web.Request) -> web.Response:
    params = query_params(request, DEAD_LETTER_FILTERS)
    limit = limit_param(params)
    _check_category(params.get("category"), "category")
    after = None
    if "cursor" in params:
        at, after_id = decode_cursor(params["cursor"], (datetime, int))
        after = (at, after_id)
    filters: dict[str, Any] = {
        "event_type": params.get("event_type"), "category": params.get("category"),
        "since": timestamp_param(params, "since"), "until": timestamp_param(params, "until"),
    }
    async with _state(request).db.transaction(caller_of(request)) as conn:
        await self_service.narrow_to_tenant(conn, params.get("tenant"))
        filters["webhook_id"] = await _endpoint_filter(conn, params.get("endpoint"), "endpoint")
        rows = await queries.dead_letters(conn, filters, after, limit + 1)
    more = len(rows) > limit
    rows = rows[:limit]
    last = rows[-1] if more else None
    cursor = None if last is None else encode_cursor(last["dead_lettered_at"], last["delivery_id"])
    return json_response({"items": rows, "next_cursor": cursor})


class ReplayFilter(Body):
    endpoint: str | int | None = None
    event_type: str | None = Field(default=None, min_length=1)
    category: str | None = Field(default=None, min_length=1)
    since: str | None = None
    until: str | None = None

    @field_validator("category")
    @classmethod
    def _category(cls, value: str | None) -> str | None:
        problem = None if value is None else category_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value


class BulkReplayBody(Body):
    filter: ReplayFilter = Field(default_factory=ReplayFilter)
    rate: float | None = Field(default=None, gt=0, le=100_000)
    max: int | None = Field(default=None, ge=1, le=INTEGER_MAX)


@allow(*ADMIN)
async def replay_dead_letters(request: web.Request) -> web.Response:
    body = await read_body(request, BulkReplayBody)
    state, caller = _state(request), caller_of(request)
    given = body.filter
    filters: dict[str, Any] = {
        "event_type": given.event_type, "category": given.category,
        "since": None if given.since is None else timestamp(given.since, "filter.since"),
        "until": None if given.until is None else timestamp(given.until, "filter.until"),
    }
    async with state.db.transaction(caller) as conn:
        filters["webhook_id"] = await _endpoint_filter(
            conn, None if given.endpoint is None else str(given.endpoint), "filter.endpoint")
        operation_id = await queries.start_replay(conn, filters, body.rate, body.max, _decided_by(caller))
        operation = await queries.operation(conn, operation_id)
    state.operations_wakeup.set()
    get_logger().info("api bulk replay started", operation_id=operation_id, by=caller.name)
    return json_response(operation, status=202, location=f"/v1/operations/{operation_id}")


@allow(*READ)
async def get_operation(request: web.Request) -> web.Response:
    operation_id = path_id(request)
    async with _state(request).db.transaction(caller_of(request)) as conn:
        operation = await queries.operation(conn, operation_id)
    if operation is None:
        raise not_found(f"operation {operation_id}")
    return json_response(operation)


@allow(*ADMIN)
async def cancel_operation(request: web.Request) -> web.Response:
    operation_id = path_id(request)
    await _no_body(request)
    caller = caller_of(request)
    async with _state(request).db.transaction(caller) as conn:
        status = await queries.cancel_operation(conn, operation_id, _decided_by(caller))
        operation = await queries.operation(conn, operation_id)
    if status is None or operation is None:
        raise not_found(f"operation {operation_id}")
    if status != "cancelled":
        raise conflict(f"operation {operation_id} is {status}: only a running operation is cancelled")
    get_logger().info("api operation cancelled", operation_id=operation_id, by=caller.name)
    return json_response(operation)


# --- endpoints --------------------------------------------------------------------------------------


async def _endpoint_path(conn: psycopg.AsyncConnection[Any], request: web.Request) -> int:
    """The endpoint a path names, by id or by name (as the CLI's ENDPOINT arguments)."""
    value = printable_text("id", request.match_info["id"])
    found = await queries.endpoint_id(conn, value)
    if found is None:
        raise not_found(f"endpoint {value}")
    return found


def _keyring(state: ApiState) -> Any:
    if state.keyring is None:
        raise Problem(503, "no-encryption-keys", "Endpoint credentials cannot be sealed",
                      "the API has no encryption keys (WEBHOOK_WORKER_ENCRYPTION_KEYS or "
                      "security.encryption_keys_file)")
    return state.keyring


async def _sync(state: ApiState, caller: Caller, work: Callable[[psycopg.Connection[Any]], T]) -> T:
    """The operator functions of worker.operator_sql (sealing credentials bound to the endpoint's id) in
    a thread, under the caller's database role and tenant (self_service.in_thread)."""
    return await self_service.in_thread(state, caller, work)


@allow(*READ)
async def list_endpoints(request: web.Request) -> web.Response:
    params = query_params(request, {"tenant", "cursor", "limit"})
    limit = limit_param(params)
    after = decode_cursor(params["cursor"], (int,))[0] if "cursor" in params else None
    async with _state(request).db.transaction(caller_of(request)) as conn:
        await self_service.narrow_to_tenant(conn, params.get("tenant"))
        rows = await queries.endpoints(conn, after, limit + 1)
    more = len(rows) > limit
    rows = rows[:limit]
    return json_response({"items": rows, "next_cursor": encode_cursor(rows[-1]["id"]) if more else None})


@allow(*ADMIN)
async def create_endpoint(request: web.Request) -> web.Response:
    state = _state(request)
    body = await read_body(request, endpoint_rules.EndpointCreate)
    endpoint_rules.refuse_scoped(body, caller_of(request).tenant_id)
    keyring = _keyring(state)
    await endpoint_rules.check_destination(body.url, state.config)
    try:
        registered = await endpoint_rules.settled(
            _sync(state, caller_of(request), lambda conn: endpoint_service.register(conn, body, keyring)))
    except psycopg.errors.InsufficientPrivilege as exc:  # a tenant not the scoped caller's own
        raise Problem(403, "forbidden", "The token may not do this", str(exc.diag.message_primary),
                      field="tenant") from None
    get_logger().info("api registered an endpoint", endpoint_id=registered.id, by=caller_of(request).name)
    async with state.db.transaction(caller_of(request)) as conn:
        row = await queries.endpoint(conn, registered.id)
    return json_response({**(row or {}), "signing_secret": registered.signing_secret}, status=201,
                         location=f"/v1/endpoints/{registered.id}")


@allow(*READ)
async def get_endpoint(request: web.Request) -> web.Response:
    async with _state(request).db.transaction(caller_of(request)) as conn:
        row = await queries.endpoint(conn, await _endpoint_path(conn, request))
    return json_response(row)


@allow(*ADMIN)
async def update_endpoint(request: web.Request) -> web.Response:
    state = _state(request)
    body = await read_body(request, endpoint_rules.EndpointPatch)
    endpoint_rules.refuse_scoped(body, caller_of(request).tenant_id)
    keyring = _keyring(state)
    await endpoint_rules.check_destination(body.url, state.config)
    async with state.db.transaction(caller_of(request)) as conn:
        endpoint_id = await _endpoint_path(conn, request)
    await endpoint_rules.settled(
        _sync(state, caller_of(request),
              lambda conn: endpoint_service.update(conn, endpoint_id, body, keyring)))
    async with state.db.transaction(caller_of(request)) as conn:
        row = await queries.endpoint(conn, endpoint_id)
    return json_response(row)


@allow(*ADMIN)
async def delete_endpoint(request: web.Request) -> web.Response:
    await _no_body(request)
    try:
        async with _state(request).db.transaction(caller_of(request)) as conn:
            endpoint_id = await _endpoint_path(conn, request)
            deleted = await queries.delete_endpoint(conn, endpoint_id)
    except (psycopg.errors.ObjectInUse, psycopg.errors.ForeignKeyViolation) as exc:
        raise conflict(str(exc.diag.message_primary or "the endpoint still has deliveries")) from None
    if not deleted:
        raise not_found(f"endpoint {request.match_info['id']}")
    return web.Response(status=204)


@allow(*READ)
async def endpoint_health(request: web.Request) -> web.Response:
    params = query_params(request, {"hours"})
    hours = params.get("hours", str(HEALTH_WINDOW_HOURS))
    if not hours.isdigit() or not 1 <= int(hours) <= 24 * 31:
        raise invalid("hours", "expected an integer from 1 to 744")
    async with _state(request).db.transaction(caller_of(request)) as conn:
        row = await queries.endpoint_health(conn, await _endpoint_path(conn, request), int(hours))
    return json_response(row)


class CircuitBody(Body):
    action: Literal["reset", "open", "close"]
    until: str | None = None


@allow(*ADMIN)
async def endpoint_circuit(request: web.Request) -> web.Response:
    body = await read_body(request, CircuitBody)
    if body.until is not None and body.action != "open":
        raise invalid("until", "only with action open")
    until = None if body.until is None else timestamp(body.until, "until")
    caller = caller_of(request)
    async with _state(request).db.transaction(caller) as conn:
        endpoint_id = await _endpoint_path(conn, request)
        change = await queries.set_circuit(conn, endpoint_id, body.action, until, _decided_by(caller))
        health = await queries.endpoint_health(conn, endpoint_id, HEALTH_WINDOW_HOURS)
    return json_response({"endpoint_id": endpoint_id, "change": change,
                          "circuit_state": health and health["circuit_state"]})


class ReasonBody(Body):
    reason: str | None = Field(default=None, min_length=1, max_length=1000)


async def _set_active(request: web.Request, active: bool) -> web.Response:
    reason = (await read_optional_body(request, ReasonBody)).reason
    if active and reason is not None:
        raise invalid("reason", "only when disabling")
    caller = caller_of(request)
    async with _state(request).db.transaction(caller) as conn:
        endpoint_id = await _endpoint_path(conn, request)
        change = await queries.set_active(conn, endpoint_id, active, reason or "disabled over the API",
                                          _decided_by(caller))
    return json_response({"endpoint_id": endpoint_id, "active": active, "changed": change is not None})


@allow(*ADMIN)
async def enable_endpoint(request: web.Request) -> web.Response:
    return await _set_active(request, True)


@allow(*ADMIN)
async def disable_endpoint(request: web.Request) -> web.Response:
    return await _set_active(request, False)


@allow(*ADMIN)
async def rotate_secret(request: web.Request) -> web.Response:
    state = _state(request)
    body = await read_optional_body(request, endpoint_rules.SecretRotation)
    keyring = _keyring(state)
    secret = body.secret or signing.generate_secret()
    endpoint_rules.check_secret(secret)
    expire_at = None
    if body.expire_old_after_hours is not None:
        expire_at = datetime.now(UTC) + timedelta(hours=body.expire_old_after_hours)
    async with state.db.transaction(caller_of(request)) as conn:
        endpoint_id = await _endpoint_path(conn, request)
    active = await _sync(state, caller_of(request), lambda conn: operator_queries.rotate_secret(
                                 conn, endpoint_id, secret,
                                                                             expire_at, keyring))
    return json_response({"endpoint_id": endpoint_id, "signing_secret": secret, "active_secrets": active,
                          "old_expire_at": expire_at})


# --- tenants ---------------------------------------------------------------------------------------


class TenantLimits(Body):
    """A tenant's limits; a field given as null clears that limit."""

    rate_limit_per_second: float | None = Field(default=None, gt=0)
    rate_limit_burst: int | None = Field(default=None, ge=1, le=INTEGER_MAX)
    max_in_flight: int | None = Field(default=None, ge=1, le=INTEGER_MAX)
    max_endpoints: int | None = Field(default=None, ge=0, le=INTEGER_MAX)
    max_queued: int | None = Field(default=None, ge=0, le=BIGINT_MAX)

    def given(self) -> dict[str, Any]:
        return {key: getattr(self, key) for key in self.model_fields_set if key in TenantLimits.model_fields}


class TenantCreate(TenantLimits):
    name: str

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        problem = tenant_rules.name_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value


@allow(*FLEET_ADMIN)
async def list_tenants(request: web.Request) -> web.Response:
    query_params(request, set())
    async with _state(request).db.transaction(caller_of(request)) as conn:
        return json_response({"items": await queries.tenants(conn)})


@allow(*FLEET_ADMIN)
async def create_tenant(request: web.Request) -> web.Response:
    body = await read_body(request, TenantCreate)
    try:
        async with _state(request).db.transaction(caller_of(request)) as conn:
            await queries.add_tenant(conn, body.name, body.given())
            row = await queries.tenant(conn, body.name)
    except psycopg.errors.UniqueViolation:
        raise conflict(f"name: a tenant named {body.name!r} exists", field="name") from None
    get_logger().info("api added a tenant", tenant=body.name, by=caller_of(request).name)
    return json_response(row, status=201, location=None if row is None else f"/v1/tenants/{row['id']}")


@allow(*FLEET_ADMIN)
async def get_tenant(request: web.Request) -> web.Response:
    async with _state(request).db.transaction(caller_of(request)) as conn:
        row = await queries.tenant(conn, printable_text("id", request.match_info["id"]))
    if row is None:
        raise not_found(f"tenant {request.match_info['id']}")
    return json_response(row)


@allow(*FLEET_ADMIN)
async def update_tenant(request: web.Request) -> web.Response:
    body = await read_body(request, TenantLimits)
    limits = body.given()
    if not limits:
        raise invalid("(body)", "nothing to change: give at least one limit")
    async with _state(request).db.transaction(caller_of(request)) as conn:
        row = await queries.tenant(conn, printable_text("id", request.match_info["id"]))
        if row is None:
            raise not_found(f"tenant {request.match_info['id']}")
        await queries.update_tenant(conn, row["name"], limits)
        row = await queries.tenant(conn, row["name"])
    return json_response(row)


# --- stats and config -------------------------------------------------------------------------------


@allow(*READ)
async def stats(request: web.Request) -> web.Response:
    query_params(request, set())
    async with _state(request).db.transaction(caller_of(request)) as conn:
        return json_response(await queries.stats(conn))


@allow(*FLEET_READ)
async def get_config(request: web.Request) -> web.Response:
    query_params(request, set())
    async with _state(request).db.transaction(caller_of(request)) as conn:
        return json_response(await queries.config(conn))


@allow(*FLEET_ADMIN)
async def patch_config(request: web.Request) -> web.Response:
    data = await read_json(request)
    if not isinstance(data, dict) or not data:
        raise invalid("(body)", "expected a JSON object of settings to change")
    async with _state(request).db.transaction(caller_of(request)) as conn:
        current = orjson.loads(orjson.dumps(await queries.config(conn), default=json_default))
    changes: dict[str, str | None] = {}
    for key, value in data.items():
        if key not in operator_queries.SETTABLE:
            # what GET answers can be sent back: a column no setting changes, unchanged, is ignored
            if key in current and current[key] == value:
                continue
            raise invalid(key, "not a setting" if key not in current else "read-only")
        changes[key] = _setting_text(key, value)
    try:
        async with _state(request).db.transaction(caller_of(request)) as conn:
            await queries.set_config(conn, changes)
            settings = await queries.config(conn)
    except (psycopg.errors.DataError, psycopg.errors.IntegrityError) as exc:
        message = (exc.diag.message_primary or type(exc).__name__).splitlines()[0]
        # the setting named by the refusal, or the only one given; a rule over several names them all
        named = exc.diag.column_name or exc.diag.constraint_name or ""
        field = next((key for key in changes if key in named), None)
        if field is None:
            field = next(iter(changes)) if len(changes) == 1 else "(body)"
        raise invalid(field, message) from None
    get_logger().info("api changed settings", keys=sorted(changes), by=caller_of(request).name)
    return json_response(settings)


def _setting_text(key: str, value: Any) -> str | None:
    """A JSON value as the text the setting's SQL type reads, refusing the wrong JSON type."""
    sql_type = operator_queries.SETTABLE[key]
    if value is None:
        return None
    if sql_type == "jsonb":
        if key == "retry_schedule":
            try:
                RetrySchedule.from_json(value, 0.0)
            except (ValueError, TypeError, AttributeError) as exc:
                raise invalid(key, str(exc)) from None
        return orjson.dumps(value).decode()
    if sql_type == "boolean":
        if not isinstance(value, bool):
            raise invalid(key, "expected true or false")
        return "true" if value else "false"
    if sql_type == "interval":
        # seconds, as the setting reads; an interval's text ('7 days') is accepted too
        if isinstance(value, int | float) and not isinstance(value, bool):
            return f"{value} seconds"
        if not isinstance(value, str):
            raise invalid(key, "expected a number of seconds, or an interval such as '7 days'")
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise invalid(key, "expected a number")
    if sql_type == "integer" and not isinstance(value, int):
        raise invalid(key, "expected an integer")
    return str(value)


# --- the table ----------------------------------------------------------------------------------------


@allow("producer", "reader", "admin", "tenant_admin")
async def whoami(request: web.Request) -> web.Response:
    caller = caller_of(request)
    return json_response({"name": caller.name, "role": caller.role})


async def openapi_document(_request: web.Request) -> web.Response:
    from worker.api.openapi import document

    return json_response(document())


ROUTES: list[tuple[str, str, Callable[[web.Request], Any]]] = [
    ("GET", "/v1/token", whoami),
    ("GET", "/v1/openapi.json", openapi_document),
    ("POST", "/v1/messages", publish),
    ("GET", "/v1/deliveries", list_deliveries),
    ("GET", "/v1/deliveries/{id}", get_delivery),
    ("POST", "/v1/deliveries/{id}/replay", replay_delivery),
    ("GET", "/v1/dead-letters", list_dead_letters),
    ("POST", "/v1/dead-letters/replay", replay_dead_letters),
    ("GET", "/v1/operations/{id}", get_operation),
    ("POST", "/v1/operations/{id}/cancel", cancel_operation),
    ("GET", "/v1/endpoints", list_endpoints),
    ("POST", "/v1/endpoints", create_endpoint),
    ("GET", "/v1/endpoints/{id}", get_endpoint),
    ("PATCH", "/v1/endpoints/{id}", update_endpoint),
    ("DELETE", "/v1/endpoints/{id}", delete_endpoint),
    ("GET", "/v1/endpoints/{id}/health", endpoint_health),
    ("POST", "/v1/endpoints/{id}/circuit", endpoint_circuit),
    ("POST", "/v1/endpoints/{id}/enable", enable_endpoint),
    ("POST", "/v1/endpoints/{id}/disable", disable_endpoint),
    ("POST", "/v1/endpoints/{id}/rotate-secret", rotate_secret),
    ("GET", "/v1/tenants", list_tenants),
    ("POST", "/v1/tenants", create_tenant),
    ("GET", "/v1/tenants/{id}", get_tenant),
    ("PATCH", "/v1/tenants/{id}", update_tenant),
    ("GET", "/v1/stats", stats),
    ("GET", "/v1/config", get_config),
    ("PATCH", "/v1/config", patch_config),
    *self_service.ROUTES,
]


def add_routes(app: web.Application) -> None:
    for method, path, handler in ROUTES:
        app.router.add_route(method, path, handler)
