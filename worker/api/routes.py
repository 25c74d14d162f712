"""The /v1 routes: each a thin handler over the SQL functions, under the caller's database role."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Literal, TypeVar
from urllib.parse import urlencode

import orjson
import psycopg
from aiohttp import web
from pydantic import AfterValidator, ConfigDict, Field, JsonValue, create_model, field_validator

from worker.api import answers, message_history, portal, self_service
from worker.api import endpoints as endpoint_rules
from worker.api.declare import Header, Route, body_of, id_of, query_of, ref_of
from worker.api.inputs import (
    BIGINT_MAX,
    DEAD_LETTER_CURSOR,
    DEFAULT_PAGE,
    INTEGER_MAX,
    MAX_PAGE,
    SMALLINT,
    Body,
    Id,
    Query,
    Ref,
    Text,
    Timestamp,
    dead_letter_cursor,
    encode_dead_letter_cursor,
    one_field_given,
    parse,
)
from worker.observability import get_logger
from worker.rules import coalescing, event_types, signing, wording
from worker.rules import endpoints as endpoint_service
from worker.rules import tenants as tenant_rules
from worker.rules.destinations import MAX_GRANTED_NETWORKS, granted_networks
from worker.rules.policy import CATEGORIES, RetrySchedule, category_problem
from worker.rules.schemas import SchemaUnusable
from worker.rules.shapes import json_default
from worker.rules.tokens import Caller
from worker.store import deliveries as delivery_store
from worker.store import endpoints as endpoint_store
from worker.store import messages as message_store
from worker.store import operations as operation_store
from worker.store import settings as setting_store
from worker.store import tenants as tenant_store
from worker.web.context import (
    ADMIN,
    DOCUMENT,
    FLEET_ADMIN,
    FLEET_READ,
    PUBLISH,
    READ,
    STATE,
    ApiState,
    Publishing,
    caller_of,
    json_response,
)
from worker.web.problems import Problem, conflict, invalid, not_found, refused, unauthorized
from worker.web.schema_checks import Check, ChecksFailed, OverBudget, RequestChecks

T = TypeVar("T")
# W3C trace context, as the queue's traceparent_w3c_format constraint accepts it.
TRACEPARENT_PATTERN = r"^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$"
TRACEPARENT = re.compile(TRACEPARENT_PATTERN)
HEALTH_WINDOW_HOURS = 24
MAX_HEALTH_WINDOW_HOURS = 24 * 31


def _category(value: str) -> str:
    # an unknown category matches nothing: a filter (or a bulk replay) that silently finds nothing
    problem = category_problem(value)
    if problem is not None:
        raise ValueError(problem)
    return value


Category = Annotated[str, AfterValidator(_category), Field(json_schema_extra={"enum": list(CATEGORIES)})]


def _state(request: web.Request) -> ApiState:
    return request.app[STATE]


def _decided_by(caller: Caller) -> str:
    return f"api:{caller.name}"


# --- messages ---------------------------------------------------------------------------------------


class MessageBody(Body):
    event_type: Text = Field(min_length=1, max_length=256)
    payload: JsonValue = Field(description="any JSON value, sent as the body (at most max_payload_bytes,"
                                           " nested at most 254 deep, no \\u0000 in strings)")
    endpoint: Ref | None = Field(default=None, description="name or id; absent: every subscriber")
    idempotency_key: Text | None = Field(default=None, min_length=1, max_length=512)
    ordering_key: Text | None = Field(default=None, min_length=1, max_length=512)
    priority: int = Field(default=0, ge=SMALLINT[0], le=SMALLINT[1])
    expires_at: Timestamp | None = None


# \u0000 in JSON text, not an escaped backslash followed by "u0000"
NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


def _traceparent(request: web.Request) -> str | None:
    traceparent = request.headers.get("traceparent")
    if traceparent is not None and not _valid_traceparent(traceparent):
        raise invalid("traceparent", "not a W3C trace context (00-<32 hex>-<16 hex>-<2 hex>)")
    return traceparent


def _payload_text(body: MessageBody) -> str:
    """The payload as the JSON text PostgreSQL is sent, or a Problem for one it cannot store."""
    try:
        payload = orjson.dumps(body.payload).decode()
    except TypeError:  # orjson's own limit: nested deeper than 254
        raise invalid("payload", "nested too deep (at most 254 levels)") from None
    if "\\u0000" in payload and NUL_ESCAPE.search(payload):
        raise invalid("payload", "holds \\u0000, which PostgreSQL's jsonb cannot store")
    return payload


def _schema_checks(request: web.Request) -> RequestChecks:
    """The request's schema checks, within its budget (api.schema_validation_budget_seconds)."""
    state = _state(request)
    return state.schema_checks.for_request(state.config.api.schema_validation_budget_seconds)


class _ReadAfresh(Exception):
    """Entries of the catalogue kept from an earlier read refused a message: read them again before
    refusing it (they may be stale)."""


async def _refusals(request: web.Request, messages: Sequence[tuple[MessageBody, str]], pub: Publishing,
                    checks: RequestChecks) -> list[Problem | None]:
    """What each message (with its payload's JSON text) is refused for by its type's catalogue entry
    (or api.require_known_event_types), or None. Payloads are checked against their types' schemas
    off the event loop, within the request's budget (worker/web/schema_checks.py)."""
    require_known = _state(request).config.api.require_known_event_types
    refusals: list[Problem | None] = []
    wanted: list[tuple[int, Check]] = []
    for i, (message, payload) in enumerate(messages):
        known = pub.known.get(message.event_type)
        refused = event_types.type_problem(message.event_type, known, require_known)
        refusals.append(None if refused is None else invalid(refused.field, refused.message))
        if refused is None and known is not None and known.schema_text is not None:
            wanted.append((i, Check(known.schema_text, payload)))
    try:
        verdicts = await checks.verdicts(wanted)
    except ChecksFailed as exc:
        get_logger().error("api could not check payloads against their schemas", reason=str(exc))
        raise Problem(503, "schema-checks-unavailable", "Payloads cannot be checked against their schemas",
                      "try again", headers={"Retry-After": "1"}) from None
    over_budget: set[int] = set()
    for (i, _check), verdict in zip(wanted, verdicts, strict=True):
        event_type = messages[i][0].event_type
        if isinstance(verdict, OverBudget):
            over_budget.add(i)
            of_type = wording.quoted(event_type)
            refusals[i] = invalid("payload", f"not checked against the schema of event type {of_type} "
                                  "within api.schema_validation_budget_seconds "
                                  f"({checks.budget.seconds:g} s, for the request's payloads together)")
        elif verdict is not None:
            refused = event_types.unusable_schema(event_type, str(verdict)) \
                if isinstance(verdict, SchemaUnusable) else event_types.payload_refusal(event_type, verdict)
            refusals[i] = invalid(refused.field, refused.message)
    # entries kept from an earlier read may be stale: what they refuse is refused once read afresh
    # (a check that ran out of budget is not run again: the budget is the request's)
    if pub.kept and any(refusal is not None and i not in over_budget for i, refusal in enumerate(refusals)):
        raise _ReadAfresh()
    return refusals


def _refusal(sqlstate: str | None, constraint: str | None, message: str | None) -> Problem | None:
    """What a publish the database refused is answered (the single publish, and each message of a
    batch alike), or None for an error that is no refusal of this message."""
    if sqlstate == "P0002":  # no_data_found
        return invalid("endpoint", "no endpoint with this name or id")
    if sqlstate == "P0003":  # too_many_rows: a name several tenants hold, to an unscoped caller
        return conflict(str(message), field="endpoint")
    if sqlstate == "54000":  # program_limit_exceeded
        return Problem(413, "payload-too-large", "The payload is too large", f"payload: {message}",
                       field="payload")
    if sqlstate == "42501":  # insufficient_privilege: a reserved event type
        return invalid("event_type", str(message))
    if sqlstate == "23505" and constraint == "idempotency_key_reused":  # unique_violation
        return conflict(str(message), field="idempotency_key")
    if sqlstate == "53400":  # configuration_limit_exceeded
        # the tenant's max_queued: the producer waits for the queue to drain, nothing is lost; a
        # message that needs more rows than the quota itself can never fit (no Retry-After)
        return refused(429, "tenant-quota", "The tenant's queue is full", str(message),
                       tenant_rules.quota_retry_after(constraint))
    return None


def _refused(exc: psycopg.Error) -> Problem | None:
    """What a publish whose statement failed is answered, or None for an error that is no refusal."""
    if exc.sqlstate == "28000":  # invalid_authorization_specification: the token is not usable
        return unauthorized("the token is not valid (unknown, revoked or expired)")
    if exc.sqlstate == message_store.CATALOGUE_CHANGED:  # again, as it was read afresh: changing now
        return Problem(503, "catalogue-changing", "The event-type catalogue is changing", "try again",
                       headers={"Retry-After": "1"})
    return _refusal(exc.sqlstate, exc.diag.constraint_name, exc.diag.message_primary)


def _published(body: MessageBody, rows: list[dict[str, Any]]) -> tuple[dict[str, Any], int, str | None]:
    """A published message's answer, status and location, from the deliveries api_publish() answered."""
    created = any(row["created"] for row in rows)
    # the key given, or the event id generated for it (every delivery's webhook-id)
    event_id = rows[0]["idempotency_key"] if rows else body.idempotency_key
    deliveries = [{k: row[k] for k in ("delivery_id", "endpoint_id", "endpoint_name")} for row in rows]
    # where the deliveries it made can be followed
    where = None if event_id is None else "/v1/deliveries?" + urlencode({"idempotency_key": event_id})
    answer = {"idempotency_key": event_id, "created": created, "deliveries": deliveries}
    return answer, 202 if created or not rows else 200, where if created else None


async def _publish_with(request: web.Request, names: list[str],
                        publish: Callable[[Publishing], Awaitable[list[dict[str, Any]]]]
                        ) -> list[dict[str, Any]]:
    """The rows `publish` answers on a connection from ApiState.publishing(), the database's
    refusals answered as Problems. When the catalogue changed since this process read the entries
    `publish` checked against, or when entries kept from an earlier read refuse a message, it runs
    once more with them read afresh."""
    state = _state(request)
    for fresh in (False, True):
        try:
            async with state.publishing(request, names, fresh) as publishing:
                return await publish(publishing)
        except _ReadAfresh:
            continue
        except psycopg.Error as exc:
            if exc.sqlstate == message_store.CATALOGUE_CHANGED and not fresh:
                continue
            refusal = _refused(exc)
            if refusal is None:
                raise
            raise refusal from None
    raise AssertionError("the second round reads the catalogue afresh")


async def publish(request: web.Request) -> web.Response:
    """One round trip to PostgreSQL, one statement: api_publish_as(), which checks the token and the
    catalogue's version; before it, a first one reads the type's catalogue entry and the token's
    caller (api_publish_check()) when this process does not hold the entry at the catalogue's
    version (ApiState.publishing())."""
    body = body_of(request, MessageBody)
    traceparent = _traceparent(request)
    payload = _payload_text(body)
    endpoint = None if body.endpoint is None else str(body.endpoint)
    checks = _schema_checks(request)

    async def send(pub: Publishing) -> list[dict[str, Any]]:
        [refused] = await _refusals(request, [(body, payload)], pub, checks)
        if refused is not None:
            raise refused
        return await message_store.publish_as(pub.conn, pub.credential.token_hash, pub.credential.roles,
                                        pub.catalogue_version, body.event_type, payload, endpoint,
                                        body.idempotency_key, body.ordering_key, body.priority,
                                        body.expires_at, traceparent)

    rows = await _publish_with(request, [body.event_type], send)
    answer, status, where = _published(body, rows)
    return json_response(answer, status=status, location=where)


# One request's worth of messages: large enough to spare a producer round trips, small enough that its
# one transaction stays short.
MAX_BATCH = 1000


class BatchBody(Body):
    messages: list[dict[str, JsonValue]] = Field(
        min_length=1, max_length=MAX_BATCH,
        description=f"1 to {MAX_BATCH} messages, each a JSON object as POST /v1/messages takes (the "
                    "MessageBody schema), judged alone: one that is not gets its own problem")


def _batch_message(given: dict[str, JsonValue]) -> MessageBody | Problem:
    """A message of a batch read as POST /v1/messages reads its body, or the problem refusing it."""
    try:
        return parse(MessageBody, given)
    except Problem as problem:
        return problem


def _batch_problem(index: int, problem: Problem) -> dict[str, Any]:
    return {**problem.document(), "index": index}


async def publish_batch(request: web.Request) -> web.Response:
    """Round trips as POST /v1/messages's, whatever the batch's size: api_publish_batch_as() publishes
    every message in one statement, each in a subtransaction of its own. Each message is judged
    alone: a malformed one, or one the database refuses, gets its own problem (with its index) and
    the others are queued; only a malformed envelope refuses the whole request."""
    body = body_of(request, BatchBody)
    traceparent = _traceparent(request)
    given = [_batch_message(message) for message in body.messages]
    results: list[dict[str, Any]] = []
    sent: list[tuple[int, MessageBody]] = []  # the messages sent to the database: ordinal - 1, index
    checks = _schema_checks(request)

    async def send(pub: Publishing) -> list[dict[str, Any]]:
        results[:] = [{} for _ in given]
        sent.clear()
        items: list[dict[str, Any]] = []
        payloads: list[tuple[int, MessageBody, str]] = []
        for i, message in enumerate(given):
            try:
                if isinstance(message, Problem):
                    raise message
                payloads.append((i, message, _payload_text(message)))
            except Problem as problem:
                results[i] = _batch_problem(i, problem)
        refusals = await _refusals(request, [(message, payload) for _, message, payload in payloads], pub,
                                   checks)
        for (i, message, payload), refusal in zip(payloads, refusals, strict=True):
            if refusal is not None:
                results[i] = _batch_problem(i, refusal)
                continue
            sent.append((i, message))
            items.append(_batch_item(message, payload))
        # Sent even when every message was refused above: the statement is what checks the token
        # (an empty batch publishes nothing).
        return await message_store.publish_batch_as(pub.conn, pub.credential.token_hash, pub.credential.roles,
                                              pub.catalogue_version, orjson.dumps(items).decode(),
                                              traceparent)

    names = sorted({m.event_type for m in given if isinstance(m, MessageBody)})
    rows = await _publish_with(request, names, send)
    by_ordinal: dict[int, list[dict[str, Any]]] = {}
    for row in rows:
        by_ordinal.setdefault(row["ordinal"], []).append(row)
    retry_after: int | None = None
    for ordinal, (i, message) in enumerate(sent, start=1):
        found = by_ordinal.get(ordinal, [])
        if found and found[0]["refused_sqlstate"] is not None:
            refusal = _refusal(found[0]["refused_sqlstate"], found[0]["refused_constraint"],
                               found[0]["refused_message"])
            assert refusal is not None, found[0]["refused_sqlstate"]  # api_publish_batch() refuses only these
            results[i] = _batch_problem(i, refusal)
            wait = refusal.headers.get("Retry-After")
            if wait is not None:
                retry_after = max(retry_after or 0, int(wait))
        else:
            results[i] = _published(message, found)[0]
    created = any(result.get("created") for result in results)
    response = json_response({"results": results}, status=202 if created else 200)
    if retry_after is not None:
        # a message refused for its tenant's full queue may be sent again: the batch says when
        response.headers["Retry-After"] = str(retry_after)
    return response


def _batch_item(message: MessageBody, payload: str) -> dict[str, Any]:
    """One message as api_publish_batch() takes it; its payload the JSON text already checked."""
    item: dict[str, Any] = {"event_type": message.event_type, "payload": orjson.Fragment(payload),
                            "priority": message.priority}
    for key in ("endpoint", "idempotency_key", "ordering_key", "expires_at"):
        value = getattr(message, key)
        if value is not None:
            item[key] = value if key == "expires_at" else str(value)
    return item


def _valid_traceparent(value: str) -> bool:
    return (TRACEPARENT.fullmatch(value) is not None and not value.startswith("ff")
            and value[3:35] != "0" * 32 and value[36:52] != "0" * 16)


# --- deliveries -------------------------------------------------------------------------------------


async def _endpoint_filter(conn: psycopg.AsyncConnection[Any], value: str | None, field: str) -> int | None:
    if value is None:
        return None
    found = await endpoint_rules.endpoint_id(conn, value, field)
    if found is None:
        raise invalid(field, "no endpoint with this name or id")
    return found


class Page(Query):
    limit: int = Field(default=DEFAULT_PAGE, ge=1, le=MAX_PAGE, description="rows per page")


class Filters(Page):
    tenant: Text | None = self_service.TENANT_FILTER
    endpoint: Ref | None = Field(default=None, description="endpoint name or id")
    event_type: Text | None = Field(default=None, description="exact event type")
    category: Category | None = Field(default=None, description="failure category")
    since: Timestamp | None = Field(default=None, description="inclusive")
    until: Timestamp | None = Field(default=None, description="exclusive")


class DeliveryQuery(Filters):
    status: answers.Status | None = None
    idempotency_key: Text | None = Field(default=None, description="every endpoint's delivery of this key")
    cursor: Id | None = Field(default=None, description="next_cursor of the previous page")


def _filters(query: Filters) -> dict[str, Any]:
    return {"event_type": query.event_type, "category": query.category, "since": query.since,
            "until": query.until}


async def list_deliveries(request: web.Request) -> web.Response:
    query = query_of(request, DeliveryQuery)
    filters = {**_filters(query), "status": query.status, "idempotency_key": query.idempotency_key}
    async with _state(request).db.transaction(caller_of(request)) as conn:
        await self_service.narrow_to_tenant(conn, query.tenant)
        filters["webhook_id"] = await _endpoint_filter(conn, _ref(query.endpoint), "endpoint")
        rows = await delivery_store.page(conn, filters, query.cursor, query.limit + 1)
    more = len(rows) > query.limit
    rows = rows[:query.limit]
    cursor = str(rows[-1]["delivery_id"]) if more else None
    return json_response({"items": rows, "next_cursor": cursor})


def _ref(value: int | str | None) -> str | None:
    return None if value is None else str(value)


async def get_delivery(request: web.Request) -> web.Response:
    delivery_id = id_of(request)
    async with _state(request).db.transaction(caller_of(request)) as conn:
        row = await delivery_store.delivery(conn, delivery_id)
    if row is None:
        raise not_found(f"delivery {delivery_id}")
    for attempt in row["attempts_history"]:
        digest_id = attempt["digest_id"]
        attempt["digest"] = None if digest_id is None else coalescing.digest_label(digest_id)
        if digest_id is None:
            attempt["digest_rows"] = None
    row["attempts_history"] = row.pop("attempts_history")
    return json_response(row)


async def replay_delivery(request: web.Request) -> web.Response:
    delivery_id = id_of(request)
    async with _state(request).db.transaction(caller_of(request)) as conn:
        replayed = await delivery_store.replay(conn, delivery_id)
        status = None if replayed else await delivery_store.status(conn, delivery_id)
    if replayed:
        get_logger().info("api replayed a delivery", delivery_id=delivery_id, by=caller_of(request).name)
        return json_response({"delivery_id": delivery_id, "status": "pending"}, status=202,
                             location=f"/v1/deliveries/{delivery_id}")
    if status is None:
        raise not_found(f"delivery {delivery_id}")
    async with _state(request).db.transaction(caller_of(request)) as conn:
        refusal = await delivery_store.replay_refusal(conn, delivery_id)
    raise conflict(refusal or f"delivery {delivery_id} was not replayed: try again")


# --- dead letters -----------------------------------------------------------------------------------


class DeadLetterQuery(Filters):
    cursor: str | None = Field(default=None, pattern=DEAD_LETTER_CURSOR,
                               description="next_cursor of the previous page")


async def list_dead_letters(request: web.Request) -> web.Response:
    query = query_of(request, DeadLetterQuery)
    after = None if query.cursor is None else dead_letter_cursor(query.cursor)
    filters = _filters(query)
    async with _state(request).db.transaction(caller_of(request)) as conn:
        await self_service.narrow_to_tenant(conn, query.tenant)
        filters["webhook_id"] = await _endpoint_filter(conn, _ref(query.endpoint), "endpoint")
        rows = await delivery_store.dead_letter_page(conn, filters, after, query.limit + 1)
    more = len(rows) > query.limit
    rows = rows[:query.limit]
    last = rows[-1] if more else None
    cursor = None if last is None else encode_dead_letter_cursor(last["dead_lettered_at"],
                                                                  last["delivery_id"])
    return json_response({"items": rows, "next_cursor": cursor})


class ReplayFilter(Body):
    endpoint: Ref | None = None
    event_type: Text | None = Field(default=None, min_length=1)
    category: Category | None = None
    since: Timestamp | None = None
    until: Timestamp | None = None


class BulkReplayBody(Body):
    filter: ReplayFilter = Field(default_factory=ReplayFilter)
    # rows a second; below one row in 1000 s the pacing's intervals overflow, and nobody means it
    rate: float | None = Field(default=None, ge=0.001, le=100_000)
    max: int | None = Field(default=None, ge=1, le=INTEGER_MAX)


async def replay_dead_letters(request: web.Request) -> web.Response:
    body = body_of(request, BulkReplayBody)
    state, caller = _state(request), caller_of(request)
    given = body.filter
    filters: dict[str, Any] = {"event_type": given.event_type, "category": given.category,
                               "since": given.since, "until": given.until}
    async with state.db.transaction(caller) as conn:
        filters["webhook_id"] = await _endpoint_filter(conn, _ref(given.endpoint), "filter.endpoint")
        operation_id = await operation_store.start_replay(conn, filters, body.rate, body.max,
                                                          _decided_by(caller))
        operation = await operation_store.operation(conn, operation_id)
    state.operations_wakeup.set()
    get_logger().info("api bulk replay started", operation_id=operation_id, by=caller.name)
    return json_response(operation, status=202, location=f"/v1/operations/{operation_id}")


async def get_operation(request: web.Request) -> web.Response:
    operation_id = id_of(request)
    async with _state(request).db.transaction(caller_of(request)) as conn:
        operation = await operation_store.operation(conn, operation_id)
    if operation is None:
        raise not_found(f"operation {operation_id}")
    return json_response(operation)


async def cancel_operation(request: web.Request) -> web.Response:
    operation_id = id_of(request)
    caller = caller_of(request)
    async with _state(request).db.transaction(caller) as conn:
        status = await operation_store.cancel(conn, operation_id, _decided_by(caller))
        operation = await operation_store.operation(conn, operation_id)
    if status is None or operation is None:
        raise not_found(f"operation {operation_id}")
    if status != "cancelled":
        raise conflict(f"operation {operation_id} is {status}: only a running operation is cancelled")
    get_logger().info("api operation cancelled", operation_id=operation_id, by=caller.name)
    return json_response(operation)


# --- endpoints --------------------------------------------------------------------------------------


def _keyring(state: ApiState) -> Any:
    if state.keyring is None:
        raise Problem(503, "no-encryption-keys", "Endpoint credentials cannot be sealed",
                      "the API has no encryption keys (WEBHOOK_WORKER_ENCRYPTION_KEYS or "
                      "security.encryption_keys_file)")
    return state.keyring


class EndpointQuery(Page):
    tenant: Text | None = self_service.TENANT_FILTER
    cursor: Id | None = Field(default=None, description="next_cursor of the previous page")


async def list_endpoints(request: web.Request) -> web.Response:
    query = query_of(request, EndpointQuery)
    async with _state(request).db.transaction(caller_of(request)) as conn:
        await self_service.narrow_to_tenant(conn, query.tenant)
        rows = await endpoint_store.page(conn, query.cursor, query.limit + 1)
    more = len(rows) > query.limit
    rows = rows[:query.limit]
    return json_response({"items": rows, "next_cursor": str(rows[-1]["id"]) if more else None})


async def create_endpoint(request: web.Request) -> web.Response:
    state = _state(request)
    body = body_of(request, endpoint_rules.EndpointCreate)
    caller = caller_of(request)
    endpoint_rules.refuse_scoped(body, caller.tenant_id)
    keyring = _keyring(state)
    try:
        async with state.db.transaction(caller) as conn:
            scope = await endpoint_rules.destination_scope(conn, tenant=body.tenant)
        await endpoint_rules.check_destination(body.url, state.config, scope, advise=caller.tenant_id is None)
        async with state.db.transaction(caller) as conn:
            registered = await endpoint_rules.settled(endpoint_store.register(conn, body, keyring))
    except psycopg.errors.InsufficientPrivilege as exc:  # a tenant not the scoped caller's own
        raise Problem(403, "forbidden", "The token may not do this", str(exc.diag.message_primary),
                      field="tenant") from None
    get_logger().info("api registered an endpoint", endpoint_id=registered.id, by=caller_of(request).name)
    async with state.db.transaction(caller_of(request)) as conn:
        row = await endpoint_store.details(conn, registered.id)
    return json_response({**(row or {}), "signing_secret": registered.signing_secret}, status=201,
                         location=f"/v1/endpoints/{registered.id}")


async def get_endpoint(request: web.Request) -> web.Response:
    async with _state(request).db.transaction(caller_of(request)) as conn:
        row = await endpoint_store.details(conn, await endpoint_rules.endpoint_named(conn, ref_of(request)))
    return json_response(row)


async def update_endpoint(request: web.Request) -> web.Response:
    state = _state(request)
    body = body_of(request, endpoint_rules.EndpointPatch)
    caller = caller_of(request)
    endpoint_rules.refuse_scoped(body, caller.tenant_id)
    keyring = _keyring(state)
    async with state.db.transaction(caller) as conn:
        endpoint_id = await endpoint_rules.endpoint_named(conn, ref_of(request))
        scope = None if body.url is None \
            else await endpoint_rules.destination_scope(conn, endpoint_id=endpoint_id)
    # the endpoint's tenant decides where it may deliver
    await endpoint_rules.check_destination(body.url, state.config, scope, advise=caller.tenant_id is None)
    async with state.db.transaction(caller) as conn:
        await endpoint_rules.settled(endpoint_store.update(conn, endpoint_id, body, keyring))
    async with state.db.transaction(caller_of(request)) as conn:
        row = await endpoint_store.details(conn, endpoint_id)
    return json_response(row)


class DeleteEndpointQuery(Query):
    drop_pending: bool = Field(
        default=False, description="make its waiting deliveries dead letters (category endpoint_deleted, "
                                   "not replayable) instead of refusing with 409")


async def delete_endpoint(request: web.Request) -> web.Response:
    drop_pending = query_of(request, DeleteEndpointQuery).drop_pending
    caller = caller_of(request)
    try:
        async with _state(request).db.transaction(caller) as conn:
            endpoint_id = await endpoint_rules.endpoint_named(conn, ref_of(request))
            dropped = await endpoint_store.delete(conn, endpoint_id, drop_pending, _decided_by(caller))
    except (psycopg.errors.ObjectInUse, psycopg.errors.ForeignKeyViolation) as exc:
        raise conflict(str(exc.diag.message_primary or "the endpoint still has deliveries")) from None
    if dropped is None:
        raise not_found(f"endpoint {request.match_info['id']}")
    get_logger().info("api deleted an endpoint", endpoint_id=endpoint_id, dropped=dropped, by=caller.name)
    return web.Response(status=204)


class HealthQuery(Query):
    hours: int = Field(default=HEALTH_WINDOW_HOURS, ge=1, le=MAX_HEALTH_WINDOW_HOURS, description="window")


async def endpoint_health(request: web.Request) -> web.Response:
    hours = query_of(request, HealthQuery).hours
    async with _state(request).db.transaction(caller_of(request)) as conn:
        endpoint_id = await endpoint_rules.endpoint_named(conn, ref_of(request))
        row = await endpoint_store.health(conn, endpoint_id, hours)
    return json_response(row)


class CircuitBody(Body):
    action: Literal["reset", "open", "close"]
    until: Timestamp | None = Field(default=None, description="only with action open")


async def endpoint_circuit(request: web.Request) -> web.Response:
    body = body_of(request, CircuitBody)
    if body.until is not None and body.action != "open":
        raise invalid("until", "only with action open")
    until = body.until
    caller = caller_of(request)
    async with _state(request).db.transaction(caller) as conn:
        endpoint_id = await endpoint_rules.endpoint_named(conn, ref_of(request))
        change = await endpoint_store.set_circuit(conn, endpoint_id, body.action, until, _decided_by(caller))
        health = await endpoint_store.health(conn, endpoint_id, HEALTH_WINDOW_HOURS)
    return json_response({"endpoint_id": endpoint_id, "change": change,
                          "circuit_state": health and health["circuit_state"]})


class ReasonBody(Body):
    reason: str | None = Field(default=None, min_length=1, max_length=endpoint_service.MAX_REASON_CHARS)


async def _set_active(request: web.Request, active: bool) -> web.Response:
    reason = body_of(request, ReasonBody).reason if not active else None
    caller = caller_of(request)
    async with _state(request).db.transaction(caller) as conn:
        endpoint_id = await endpoint_rules.endpoint_named(conn, ref_of(request))
        change = await endpoint_store.set_active(conn, endpoint_id, active, reason or "disabled over the API",
                                          _decided_by(caller))
    return json_response({"endpoint_id": endpoint_id, "active": active, "changed": change is not None})


async def enable_endpoint(request: web.Request) -> web.Response:
    return await _set_active(request, True)


async def disable_endpoint(request: web.Request) -> web.Response:
    return await _set_active(request, False)


async def rotate_secret(request: web.Request) -> web.Response:
    state = _state(request)
    body = body_of(request, endpoint_rules.SecretRotation)
    keyring = _keyring(state)
    secret = body.secret or signing.generate_secret()
    endpoint_rules.check_secret(secret)
    expire_at = None
    if body.expire_old_after_hours is not None:
        expire_at = datetime.now(UTC) + timedelta(hours=body.expire_old_after_hours)
    caller = caller_of(request)
    async with state.db.transaction(caller) as conn:
        endpoint_id = await endpoint_rules.endpoint_named(conn, ref_of(request))
    async with state.db.transaction(caller) as conn:
        active = await endpoint_store.rotate_secret(conn, endpoint_id, secret, expire_at, keyring,
                                                    _decided_by(caller))
    if not active:
        raise not_found(f"endpoint {request.match_info['id']}")
    # who rotated which endpoint's secret, never the secret (as a read is logged)
    get_logger().info("api rotated a signing secret", endpoint_id=endpoint_id, by=caller.name,
                      role=caller.role, old_expire_at=expire_at)
    return json_response({"endpoint_id": endpoint_id, "signing_secret": secret, "active_secrets": active,
                          "old_expire_at": expire_at})


# --- tenants ---------------------------------------------------------------------------------------


class TenantLimits(Body):
    """A tenant's limits and granted networks; a field given as null clears it."""

    rate_limit_per_second: float | None = Field(default=None, gt=0)
    rate_limit_burst: int | None = Field(default=None, ge=1, le=INTEGER_MAX)
    max_in_flight: int | None = Field(default=None, ge=1, le=INTEGER_MAX)
    max_endpoints: int | None = Field(default=None, ge=0, le=INTEGER_MAX)
    max_queued: int | None = Field(default=None, ge=0, le=BIGINT_MAX)
    allow_networks: list[str] | None = Field(
        default=None, max_length=MAX_GRANTED_NETWORKS,
        description="the private networks (CIDRs) its endpoints may reach besides public destinations; "
                    "replaces those granted before")

    @field_validator("allow_networks")
    @classmethod
    def _networks(cls, value: list[str] | None) -> list[str] | None:
        return None if value is None else granted_networks(value)

    def given(self) -> dict[str, Any]:
        return {key: getattr(self, key) for key in self.model_fields_set if key in TenantLimits.model_fields}


# a tenant's name: as an endpoint's, and without spaces
_NAME_CHAR = "\\s\\x00-\\x1f\\x7f-\\x9f"
TENANT_NAME_PATTERN = f"^[^{_NAME_CHAR}]*[^{_NAME_CHAR}0-9][^{_NAME_CHAR}]*$"


class TenantPatch(TenantLimits):
    model_config = ConfigDict(json_schema_extra=one_field_given)


class TenantCreate(TenantLimits):
    name: str = Field(min_length=1, max_length=tenant_rules.MAX_NAME,
                      json_schema_extra={"pattern": TENANT_NAME_PATTERN},
                      description="no spaces, not all digits; 'other' is reserved")

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        problem = tenant_rules.name_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value


async def list_tenants(request: web.Request) -> web.Response:
    async with _state(request).db.transaction(caller_of(request)) as conn:
        return json_response({"items": await tenant_store.listing(conn)})


async def create_tenant(request: web.Request) -> web.Response:
    body = body_of(request, TenantCreate)
    try:
        async with _state(request).db.transaction(caller_of(request)) as conn:
            await tenant_store.add(conn, body.name, body.given())
            row = await tenant_store.tenant(conn, body.name)
    except psycopg.errors.UniqueViolation:
        raise conflict(f"name: a tenant named {body.name!r} exists", field="name") from None
    get_logger().info("api added a tenant", tenant=body.name, by=caller_of(request).name)
    return json_response(row, status=201, location=None if row is None else f"/v1/tenants/{row['id']}")


async def get_tenant(request: web.Request) -> web.Response:
    async with _state(request).db.transaction(caller_of(request)) as conn:
        row = await tenant_store.tenant(conn, ref_of(request))
    if row is None:
        raise not_found(f"tenant {request.match_info['id']}")
    return json_response(row)


async def update_tenant(request: web.Request) -> web.Response:
    body = body_of(request, TenantPatch)
    limits = body.given()
    if not limits:
        raise invalid("(body)", "nothing to change: give at least one limit")
    async with _state(request).db.transaction(caller_of(request)) as conn:
        row = await tenant_store.tenant(conn, ref_of(request))
        if row is None:
            raise not_found(f"tenant {request.match_info['id']}")
        await tenant_store.update(conn, row["name"], limits)
        row = await tenant_store.tenant(conn, row["name"])
    return json_response(row)


# --- stats and config -------------------------------------------------------------------------------


async def stats(request: web.Request) -> web.Response:
    async with _state(request).db.transaction(caller_of(request)) as conn:
        return json_response(await delivery_store.statistics(conn))


async def get_config(request: web.Request) -> web.Response:
    async with _state(request).db.transaction(caller_of(request)) as conn:
        return json_response(await setting_store.read(conn))


# A real setting (a ratio, the jitter) is stored rounded to this many decimals: a value too small
# for PostgreSQL's real (5e-324) would be refused by the database as out of range.
REAL_DIGITS = 6
# The bounds of each setting, as webhooks.delivery_config's CHECK constraints hold them; the rules over
# several settings (lease_outlasts_timeout) and an interval's syntax are the database's to refuse.
SETTING_BOUNDS: dict[str, dict[str, float]] = {
    "max_attempts": {"ge": 1, "le": 100},
    "retry_jitter": {"ge": 0, "le": 1},  # stored rounded to REAL_DIGITS, as the other reals
    "max_deferrals": {"ge": 0, "le": INTEGER_MAX},
    "timeout_ms": {"ge": 100, "le": 300_000},
    "lease_seconds": {"ge": 1, "le": 3600},
    "claim_batch_size": {"ge": 1, "le": 10_000},
    "finish_batch_size": {"ge": 1, "le": 10_000},
    "rate_limit_per_second": {"gt": 0},
    "rate_limit_burst": {"ge": 1, "le": INTEGER_MAX},
    "max_in_flight": {"ge": 1, "le": INTEGER_MAX},
    "circuit_failure_ratio": {"ge": 10**-REAL_DIGITS, "le": 1},
    "circuit_window_seconds": {"ge": 1, "le": INTEGER_MAX},
    "circuit_min_attempts": {"ge": 1, "le": INTEGER_MAX},
    "circuit_sleep_seconds": {"ge": 1, "le": INTEGER_MAX},
    "circuit_max_sleep_seconds": {"ge": 1, "le": INTEGER_MAX},
    "circuit_probes": {"ge": 1, "le": INTEGER_MAX},
    "circuit_probe_success_ratio": {"ge": 10**-REAL_DIGITS, "le": 1},
}
# settings that may be cleared (null): the others are NOT NULL
NULLABLE_SETTINGS = {"rate_limit_per_second", "rate_limit_burst"}
SQL_TYPES: dict[str, Any] = {"integer": int, "real": float, "numeric": float, "boolean": bool,
                             "interval": str, "jsonb": JsonValue}


def _setting_field(key: str, sql_type: str) -> Any:
    kind: Any = SQL_TYPES[sql_type]
    bounds: dict[str, Any] = SETTING_BOUNDS.get(key, {})
    annotated: Any = Annotated[kind, Field(**bounds)]
    if sql_type == "interval":
        seconds: Any = Annotated[float, Field(ge=0, description="seconds")]
        minimum = setting_store.SETTING_MINIMUMS.get(key)
        if minimum is not None:
            # the bound documented, and checked with its reason (an interval's text: by the database)
            least = minimum.minimum.total_seconds()
            seconds = Annotated[float, Field(description="seconds", json_schema_extra={"minimum": least}),
                                AfterValidator(_at_least(least, minimum.reason))]
        annotated = seconds | Annotated[
            str, Field(min_length=1, description="a PostgreSQL interval such as '7 days'")]
    if key in NULLABLE_SETTINGS:
        annotated = annotated | None
    return (annotated, None)


def _at_least(least: float, reason: str) -> Callable[[float], float]:
    def check(value: float) -> float:
        if value < least:
            raise ValueError(reason)
        return value
    return check


def _retry_schedule(value: Any) -> Any:
    if value is not None:
        try:
            RetrySchedule.from_json(value, 0.0)
        except (ValueError, TypeError, AttributeError) as exc:
            raise ValueError(str(exc)) from None
    return value


CONFIG_READ_ONLY = ("retry_policy", "dead_letter_alert_threshold", "max_payload_bytes", "updated_at")

_CONFIG_FIELDS: dict[str, Any] = {
    **{key: _setting_field(key, sql_type) for key, sql_type in setting_store.SETTABLE.items()},
    # read-only columns GET /v1/config answers, so that its answer can be sent back unchanged
    **{key: (Annotated[JsonValue, Field(description="read-only: accepted only unchanged")], None)
       for key in CONFIG_READ_ONLY},
}
ConfigPatch = create_model(
    "ConfigPatch",
    __base__=Body,
    __doc__="settings to change, as `webhook-worker config set` names them",
    __validators__={"retry_schedule": field_validator("retry_schedule")(_retry_schedule)},
    **_CONFIG_FIELDS,
)
ConfigPatch.model_config["json_schema_extra"] = {"minProperties": 1}
ConfigPatch.model_rebuild(force=True)


async def patch_config(request: web.Request) -> web.Response:
    body = body_of(request, ConfigPatch)
    given = body.model_fields_set
    if not given:
        raise invalid("(body)", "nothing to change: give at least one setting")
    read_only = given - set(setting_store.SETTABLE)
    if read_only:
        # what GET answers can be sent back: a column no setting changes is ignored when unchanged
        async with _state(request).db.transaction(caller_of(request)) as conn:
            current = orjson.loads(orjson.dumps(await setting_store.read(conn), default=json_default))
        for key in sorted(read_only):
            if current.get(key) != getattr(body, key):
                raise invalid(key, "read-only")
    changes = {key: _setting_text(setting_store.SETTABLE[key], getattr(body, key))
               for key in given - read_only}
    try:
        async with _state(request).db.transaction(caller_of(request)) as conn:
            await setting_store.change(conn, changes)
            settings = await setting_store.read(conn)
    except (psycopg.errors.DataError, psycopg.errors.IntegrityError) as exc:
        message = setting_store.setting_refusal(exc)
        # the setting named by the refusal, or the only one given; a rule over several names them all
        named = exc.diag.column_name or exc.diag.constraint_name or ""
        field = next((key for key in changes if key in named), None)
        if field is None:
            field = next(iter(changes)) if len(changes) == 1 else "(body)"
        raise invalid(field, message) from None
    get_logger().info("api changed settings", keys=sorted(changes), by=caller_of(request).name)
    return json_response(settings)


def _setting_text(sql_type: str, value: Any) -> str | None:
    """A setting's value as the text its SQL type reads (its JSON type was checked by ConfigPatch)."""
    if value is None:
        return None
    if sql_type == "jsonb":
        return orjson.dumps(value).decode()
    if sql_type == "boolean":
        return "true" if value else "false"
    if sql_type == "interval":
        # seconds, as the setting reads; an interval's text ('7 days') is accepted too
        return value if isinstance(value, str) else f"{value} seconds"
    if sql_type == "real":
        return str(round(value, REAL_DIGITS))
    return str(value)


# --- the table ----------------------------------------------------------------------------------------


async def whoami(request: web.Request) -> web.Response:
    caller = caller_of(request)
    return json_response({"name": caller.name, "role": caller.role})


async def openapi_document(request: web.Request) -> web.Response:
    # written from ROUTES by worker.api.openapi, which the application holds (this module cannot
    # import it: it reads this one)
    return json_response(request.app[DOCUMENT])


TRACEPARENT_HEADER = Header("traceparent", {"type": "string", "pattern": TRACEPARENT_PATTERN},
                            "W3C trace context, carried to the receiver")
PUBLIC = ("producer", "reader", "admin", "tenant_admin")
A = answers

ROUTES: list[Route] = [
    Route("GET", "/v1/token", whoami, "The caller: the token's name and role", PUBLIC, {200: A.Caller}),
    Route("GET", "/v1/openapi.json", openapi_document, "This document (no token needed)", (),
          {200: A.Document}, public=True),
    Route("POST", "/v1/messages", publish,
          "Publish an event: 202 with the deliveries queued; the same idempotency key again: 200 with the "
          "existing ones, or 409 when it was used for another event type or payload. When only disabled "
          "endpoints subscribe, it is kept for them as dead letters (category disabled), replayable",
          PUBLISH, {200: A.Published, 202: A.Published}, body=MessageBody, headers=(TRACEPARENT_HEADER,),
          refusals=(409,), token_checked_by_handler=True),
    Route("POST", "/v1/messages/batch", publish_batch,
          "Publish up to 1000 events in one transaction, each judged alone: each gets its own result, in "
          "request order (POST /v1/messages's answer, or a problem with its index for that message alone: "
          "malformed, refused, or past the tenant's max_queued); 202 when any was queued. Messages are "
          "queued in order while they fit in their tenant's max_queued: from the first that does not, "
          "each later one gets 429 too, and the answer carries Retry-After; one that needs more rows "
          "than max_queued itself gets a 429 saying it can never fit",
          PUBLISH, {200: A.BatchPublished, 202: A.BatchPublished}, body=BatchBody,
          headers=(TRACEPARENT_HEADER,), token_checked_by_handler=True),
    *message_history.ROUTES,
    Route("GET", "/v1/deliveries", list_deliveries, "Deliveries, newest first (keyset pages)", READ,
          {200: A.DeliveryPage}, query=DeliveryQuery, refusals=(409,)),
    Route("GET", "/v1/deliveries/{id}", get_delivery, "A delivery with every attempt", READ,
          {200: A.DeliveryDetail}, path_id="id", refusals=(404,)),
    Route("POST", "/v1/deliveries/{id}/replay", replay_delivery,
          "Send a dead letter or delivered row again (same webhook-id); 409 when it is neither", ADMIN,
          {202: A.ReplayAccepted}, path_id="id", refusals=(404, 409)),
    Route("GET", "/v1/dead-letters", list_dead_letters, "Dead letters, oldest first (keyset pages)", READ,
          {200: A.DeliveryPage}, query=DeadLetterQuery, refusals=(409,)),
    Route("POST", "/v1/dead-letters/replay", replay_dead_letters,
          "Replay every dead letter matching the filter, in resumable steps: 202 with the operation", ADMIN,
          {202: A.Operation}, body=BulkReplayBody, refusals=(409,)),
    Route("GET", "/v1/operations/{id}", get_operation, "A bulk operation's progress", READ,
          {200: A.Operation}, path_id="id", refusals=(404,)),
    Route("POST", "/v1/operations/{id}/cancel", cancel_operation,
          "Stop a running operation after the step it is in (again: 200; already done or failed: 409)",
          ADMIN, {200: A.Operation}, path_id="id", refusals=(404, 409)),
    Route("GET", "/v1/endpoints", list_endpoints, "Endpoints by id (keyset pages)", READ,
          {200: A.EndpointPage}, query=EndpointQuery),
    Route("POST", "/v1/endpoints", create_endpoint,
          "Register an endpoint (the CLI's destination, header and sealing rules); the signing secret is "
          "shown once", ADMIN, {201: A.EndpointCreated}, body=endpoint_rules.EndpointCreate,
          refusals=(409, 503)),
    Route("GET", "/v1/endpoints/{id}", get_endpoint,
          "An endpoint, by id, name or tenant/name (409: a name more than one tenant holds)", READ,
          {200: A.EndpointDetail}, path_id="ref", refusals=(404, 409)),
    Route("PATCH", "/v1/endpoints/{id}", update_endpoint, "Change an endpoint's settings", ADMIN,
          {200: A.EndpointDetail}, body=endpoint_rules.EndpointPatch, path_id="ref",
          refusals=(404, 409, 503)),
    Route("DELETE", "/v1/endpoints/{id}", delete_endpoint,
          "Delete an endpoint; its delivered and dead-lettered rows and its audit stay as history under its"
          " id and name, never replayed. 409 while any of its deliveries is waiting (pending, retrying),"
          " unless drop_pending=true makes those dead letters (category endpoint_deleted, audited), and"
          " while any is being sent (disable it first: that ends within the lease)", ADMIN, {204: None},
          query=DeleteEndpointQuery, path_id="ref", refusals=(404, 409)),
    Route("GET", "/v1/endpoints/{id}/health", endpoint_health,
          "Circuit state and recent attempts by outcome and category", READ, {200: A.EndpointHealth},
          query=HealthQuery, path_id="ref", refusals=(404, 409)),
    Route("POST", "/v1/endpoints/{id}/circuit", endpoint_circuit,
          "Reset, open (until a time) or close the circuit", ADMIN, {200: A.CircuitChanged},
          body=CircuitBody, path_id="ref", refusals=(404, 409)),
    Route("POST", "/v1/endpoints/{id}/enable", enable_endpoint,
          "Enable (and reset the circuit); queued rows are sent", ADMIN, {200: A.ActiveChanged},
          path_id="ref", refusals=(404, 409)),
    Route("POST", "/v1/endpoints/{id}/disable", disable_endpoint,
          "Disable: no new deliveries, queued rows wait", ADMIN, {200: A.ActiveChanged}, body=ReasonBody,
          body_required=False, path_id="ref", refusals=(404, 409)),
    Route("POST", "/v1/endpoints/{id}/rotate-secret", rotate_secret,
          "Add a new signing secret (shown once); the old ones stay until expire_old_after_hours", ADMIN,
          {200: A.SecretRotated}, body=endpoint_rules.SecretRotation, body_required=False, path_id="ref",
          refusals=(404, 409, 503)),
    Route("GET", "/v1/tenants", list_tenants, "Tenants, their limits (null: none) and rows", FLEET_ADMIN,
          {200: A.TenantList}),
    Route("POST", "/v1/tenants", create_tenant, "Add a tenant", FLEET_ADMIN, {201: A.Tenant},
          body=TenantCreate,
          refusals=(409,)),
    Route("GET", "/v1/tenants/{id}", get_tenant, "A tenant, by name or id", FLEET_ADMIN, {200: A.Tenant},
          path_id="ref", refusals=(404,)),
    Route("PATCH", "/v1/tenants/{id}", update_tenant, "Change a tenant's limits; null clears one",
          FLEET_ADMIN,
          {200: A.Tenant}, body=TenantPatch, path_id="ref", refusals=(404,)),
    portal.ROUTE,
    Route("GET", "/v1/stats", stats, "Queue by status, oldest due, rows held back and why", READ,
          {200: A.Stats}),
    Route("GET", "/v1/config", get_config, "The fleet-wide defaults", FLEET_READ, {200: A.Settings}),
    Route("PATCH", "/v1/config", patch_config, "Change fleet-wide defaults (workers pick them up)",
          FLEET_ADMIN,
          {200: A.Settings}, body=ConfigPatch),
    *self_service.ROUTES,
]


def _router_path(path: str, paths: set[str]) -> str:
    """The path as aiohttp routes it: a `{id}` or `{name}` segment does not take the literal segment of
    a sibling route (`batch` is no message id), so GET /v1/messages/batch is a 405 whose Allow header
    lists only the methods declared for that path."""
    parts = path.split("/")
    for i, part in enumerate(parts):
        if not part.startswith("{"):
            continue
        siblings = sorted({other.split("/")[i] for other in paths
                           if other.split("/")[:i] == parts[:i] and len(other.split("/")) > i
                           and not other.split("/")[i].startswith("{")})
        if siblings:
            taken = "|".join(re.escape(sibling) for sibling in siblings)
            parts[i] = f"{{{part[1:-1]}:(?!(?:{taken})$)[^{{}}/]+}}"
    return "/".join(parts)


def add_routes(app: web.Application) -> None:
    paths = {route.path for route in ROUTES}
    for route in ROUTES:
        app.router.add_route(route.method, _router_path(route.path, paths), route.serve())
