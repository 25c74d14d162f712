"""/v1/messages: publishing one event or a batch (the token checked in the publish's own statement, the
payloads against their types' schemas), and what was published, newest first, each message with its
deliveries per endpoint and their status."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import Any
from urllib.parse import urlencode

import orjson
import psycopg
from aiohttp import web
from pydantic import Field, JsonValue

from worker.api import answers
from worker.api.answers import Answer, DeliveryState
from worker.api.common import TENANT_FILTER, narrow_to_tenant, state_of
from worker.api.declare import Header, Route, body_of, id_of, query_of
from worker.api.inputs import (
    DEFAULT_PAGE,
    MAX_PAGE,
    SMALLINT,
    Body,
    Id,
    Query,
    Ref,
    Text,
    Timestamp,
    parse,
)
from worker.observability import get_logger
from worker.rules import event_types, wording
from worker.rules import tenants as tenant_rules
from worker.rules.schemas import SchemaUnusable
from worker.store import messages as message_store
from worker.web.context import (
    PUBLISH,
    READ,
    STATE,
    Publishing,
    caller_of,
    json_response,
)
from worker.web.problems import Problem, conflict, invalid, not_found, refused, unauthorized
from worker.web.schema_checks import Check, ChecksFailed, OverBudget, RequestChecks

# W3C trace context, as the queue's traceparent_w3c_format constraint accepts it.
TRACEPARENT_PATTERN = r"^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$"


TRACEPARENT = re.compile(TRACEPARENT_PATTERN)


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
    state = state_of(request)
    return state.schema_checks.for_request(state.config.api.schema_validation_budget_seconds)


class _ReadAfresh(Exception):
    """Entries of the catalogue kept from an earlier read refused a message: read them again before
    refusing it (they may be stale)."""


async def _refusals(request: web.Request, messages: Sequence[tuple[MessageBody, str]], pub: Publishing,
                    checks: RequestChecks) -> list[Problem | None]:
    """What each message (with its payload's JSON text) is refused for by its type's catalogue entry
    (or api.require_known_event_types), or None. Payloads are checked against their types' schemas
    off the event loop, within the request's budget (worker/web/schema_checks.py)."""
    require_known = state_of(request).config.api.require_known_event_types
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
    state = state_of(request)
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


class MessageDelivery(DeliveryState):
    """One delivery of a message: its state at one endpoint."""


class Message(Answer):
    message_id: int
    event_id: str
    event_type: str
    created_at: datetime
    traceparent: str | None
    source_ref: str | None
    deliveries: list[MessageDelivery] = Field(description="one per endpoint it was sent to, by endpoint id")


class MessageDetail(Message):
    metadata: JsonValue
    payload: JsonValue


class MessagePage(Answer):
    items: list[Message]
    next_cursor: str | None = Field(description="pass as `cursor` for the next page; null on the last")


class MessageQuery(Query):
    limit: int = Field(default=DEFAULT_PAGE, ge=1, le=MAX_PAGE, description="messages per page")
    tenant: Text | None = TENANT_FILTER
    event_type: Text | None = Field(default=None, description="exact event type")
    idempotency_key: Text | None = Field(
        default=None, description="the message of this event id, or whose delivery carries this key")
    since: Timestamp | None = Field(default=None, description="published at or after (inclusive)")
    until: Timestamp | None = Field(default=None, description="published before (exclusive)")
    cursor: Id | None = Field(default=None, description="next_cursor of the previous page")


async def list_messages(request: web.Request) -> web.Response:
    query = query_of(request, MessageQuery)
    filters = {"event_type": query.event_type, "idempotency_key": query.idempotency_key,
               "since": query.since, "until": query.until}
    async with request.app[STATE].db.transaction(caller_of(request)) as conn:
        await narrow_to_tenant(conn, query.tenant)
        rows = await message_store.page(conn, filters, query.cursor, query.limit + 1)
        more = len(rows) > query.limit
        rows = rows[:query.limit]
        deliveries = await message_store.deliveries(conn, [row["message_id"] for row in rows])
    for row in rows:
        row["deliveries"] = deliveries[row["message_id"]]
    cursor = str(rows[-1]["message_id"]) if more else None
    return json_response({"items": rows, "next_cursor": cursor})


async def get_message(request: web.Request) -> web.Response:
    message_id = id_of(request)
    async with request.app[STATE].db.transaction(caller_of(request)) as conn:
        row = await message_store.message(conn, message_id)
        if row is None:
            raise not_found(f"message {message_id}")
        row["deliveries"] = (await message_store.deliveries(conn, [message_id]))[message_id]
    return json_response(row)


TRACEPARENT_HEADER = Header("traceparent", {"type": "string", "pattern": TRACEPARENT_PATTERN},
                            "W3C trace context, carried to the receiver")


ROUTES: list[Route] = [
    Route("POST", "/v1/messages", publish,
          "Publish an event: 202 with the deliveries queued; the same idempotency key again: 200 with the "
          "existing ones, or 409 when it was used for another event type or payload. When only disabled "
          "endpoints subscribe, it is kept for them as dead letters (category disabled), replayable",
          PUBLISH, {200: answers.Published, 202: answers.Published}, body=MessageBody,
          headers=(TRACEPARENT_HEADER,), refusals=(409,), token_checked_by_handler=True),
    Route("POST", "/v1/messages/batch", publish_batch,
          "Publish up to 1000 events in one transaction, each judged alone: each gets its own result, in "
          "request order (POST /v1/messages's answer, or a problem with its index for that message alone: "
          "malformed, refused, or past the tenant's max_queued); 202 when any was queued. Messages are "
          "queued in order while they fit in their tenant's max_queued: from the first that does not, "
          "each later one gets 429 too, and the answer carries Retry-After; one that needs more rows "
          "than max_queued itself gets a 429 saying it can never fit",
          PUBLISH, {200: answers.BatchPublished, 202: answers.BatchPublished}, body=BatchBody,
          headers=(TRACEPARENT_HEADER,), token_checked_by_handler=True),
    Route("GET", "/v1/messages", list_messages,
          "What was published, newest first (keyset pages): each message once, whether published here or"
          " inserted with SQL, with its deliveries per endpoint and their status", READ, {200: MessagePage},
          query=MessageQuery),
    Route("GET", "/v1/messages/{id}", get_message,
          "A message: its payload and metadata, and its deliveries per endpoint", READ, {200: MessageDetail},
          path_id="id", refusals=(404,)),
]
