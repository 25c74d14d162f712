"""Routes for self-service, each declared once: an endpoint's signing secrets and test events, the
event-type catalogue, tokens over HTTP, and the `?tenant=` filter of the lists."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from typing import Any, Literal
from urllib.parse import quote

import psycopg
from aiohttp import web
from pydantic import Field, JsonValue

from worker import encryption
from worker.api.answers import Answer
from worker.api.declare import Route, body_of, ref_of
from worker.api.endpoints import endpoint_named
from worker.api.inputs import Body
from worker.observability import get_logger
from worker.rules import event_types
from worker.rules import self_service as secrets_service
from worker.rules import tokens as token_rules
from worker.rules.tokens import Role
from worker.store import deliveries as delivery_store
from worker.store import endpoints as endpoint_store
from worker.store import tenants as tenant_store
from worker.store import tokens as token_store
from worker.store.event_types import deprecate, get, rows, unmatched_subscriptions, upsert
from worker.web.context import ADMIN, FLEET_ADMIN, READ, STATE, ApiState, caller_of, json_response
from worker.web.problems import Problem, conflict, invalid, not_found, refused
from worker.web.schema_checks import with_problems

# --- what the routes answer (one model per answer body; the OpenAPI document is written from them) ---


class SigningSecret(Answer):
    secret: str
    expires_at: datetime | None = Field(description="when a rotated-out secret stops being used")


class SigningSecrets(Answer):
    endpoint_id: int
    signing_secret: str = Field(description="the newest: what requests are signed with")
    secrets: list[SigningSecret] = Field(description="every secret in use, newest first")


class TestEventSent(Answer):
    delivery_id: int
    endpoint_id: int
    event_type: Literal["webhook.test"]
    status: Literal["pending"]


class EventTypeAnswer(Answer):
    name: str
    description: str
    # `schema` is a BaseModel attribute: the field is named apart and written as `schema`
    json_schema: JsonValue = Field(alias="schema", description="the JSON Schema of its payloads; null: any")
    deprecated: bool
    problem: str | None = Field(description="why its schema cannot be used (stored before the rules a "
                                            "schema is written by): publishes of the type are refused "
                                            "until it is replaced; null: none")


class CataloguedType(EventTypeAnswer):
    created_at: datetime
    updated_at: datetime


class UnmatchedSubscription(Answer):
    endpoint_id: int
    endpoint_name: str
    pattern: str
    problem: Literal["unknown", "deprecated"] = Field(
        description="unknown: no catalogued type matches; deprecated: only deprecated ones do")


class EventTypeList(Answer):
    items: list[CataloguedType]
    unmatched_subscriptions: list[UnmatchedSubscription] = Field(
        description="the caller's endpoints' subscriptions that match no current type")


class Token(Answer):
    name: str
    role: Role
    tenant: str | None
    state: Literal["active", "expired", "revoked"]
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None


class TokenList(Answer):
    items: list[Token]


class TokenCreated(Answer):
    name: str
    role: Role
    tenant: str | None
    expires_at: datetime | None
    token: str = Field(description="shown once: only its hash is stored")


class TokenRevoked(Answer):
    name: str
    state: Literal["revoked"]


def _state(request: web.Request) -> ApiState:
    return request.app[STATE]


def keyring_of(state: ApiState) -> encryption.Keyring:
    if state.keyring is None:
        raise Problem(503, "no-encryption-keys", "Endpoint credentials cannot be sealed",
                      "the API has no encryption keys (WEBHOOK_WORKER_ENCRYPTION_KEYS or "
                      "security.encryption_keys_file)")
    return state.keyring


# `?tenant=NAME` on the lists (routes.py's query models)
TENANT_FILTER: Any = Field(default=None, description="that tenant's rows only (a token kept to a tenant: "
                                                     "its own; another tenant is refused)")


async def narrow_to_tenant(conn: psycopg.AsyncConnection[Any], name: str | None) -> None:
    """`?tenant=NAME` on a list: the rest of the transaction sees that tenant's rows only, as a token
    kept to it would (row-level security and the views). A token already kept to a tenant finds no
    other (the tenants table shows it its own), so the filter never widens what it sees."""
    if name is None:
        return
    tenant_id = await tenant_store.tenant_id(conn, name)
    if tenant_id is None:
        raise invalid("tenant", "no tenant with this name")
    await tenant_store.keep_to(conn, tenant_id)


# --- an endpoint's signing secrets and test events -----------------------------------------------------


async def read_secret(request: web.Request) -> web.Response:
    """What an endpoint's requests are signed with now: the receiver needs it to verify them."""
    state, caller = _state(request), caller_of(request)
    keyring = keyring_of(state)
    async with state.db.transaction(caller) as conn:
        endpoint_id = await endpoint_named(conn, ref_of(request))
    plaintext = not state.config.security.require_sealed
    try:
        async with state.db.transaction(caller) as conn:
            found = await endpoint_store.signing_secrets(conn, keyring, endpoint_id, plaintext)
    except encryption.DecryptionError as exc:
        # the message names the purpose and the key, never the value
        raise Problem(503, "secret-unreadable", "The signing secret cannot be opened", str(exc)) from None
    if not found:
        raise not_found(f"endpoint {request.match_info['id']}")
    # who read which endpoint's secret, never the secret: the log is the audit trail of reads
    get_logger().info("api read a signing secret", endpoint_id=endpoint_id, by=caller.name,
                      role=caller.role)
    return json_response({
        "endpoint_id": endpoint_id, "signing_secret": found[0].secret,
        "secrets": [{"secret": s.secret, "expires_at": s.expires_at} for s in found]})


async def send_test_event(request: web.Request) -> web.Response:
    """A `webhook.test` event to this endpoint alone; its delivery is followed like any other."""
    caller = caller_of(request)
    try:
        async with _state(request).db.transaction(caller) as conn:
            endpoint_id = await endpoint_named(conn, ref_of(request))
            delivery_id = await delivery_store.send_test_event(conn, endpoint_id)
    except psycopg.errors.NoDataFound:
        raise not_found(f"endpoint {request.match_info['id']}") from None
    except psycopg.Error as exc:
        refusal = secrets_service.refusal_of(exc)
        if refusal is None:
            raise
        raise refused(**dataclasses.asdict(refusal)) from None
    get_logger().info("api sent a test event", endpoint_id=endpoint_id, delivery_id=delivery_id,
                      by=caller.name)
    return json_response({"delivery_id": delivery_id, "endpoint_id": endpoint_id,
                          "event_type": "webhook.test", "status": "pending"},
                         status=202, location=f"/v1/deliveries/{delivery_id}")


# --- the event-type catalogue ---------------------------------------------------------------------


class EventTypeBody(Body):
    description: str = Field(default="", max_length=event_types.MAX_DESCRIPTION_CHARS)
    # `schema` is a BaseModel attribute: the field is named apart and read and written as `schema`
    json_schema: JsonValue = Field(default=None, alias="schema",
                                   description="a JSON Schema (draft 2020-12) the payloads follow; null: any")
    deprecated: bool | None = Field(default=None, description="absent: as it was (a new type: false)")


class DeprecateBody(Body):
    """Optional: without it, the type is deprecated."""

    deprecated: bool = Field(default=True, description="false: current again")


def _type_name(request: web.Request) -> str:
    name = ref_of(request)
    problem = event_types.name_problem(name)
    if problem is not None:
        raise invalid("name", problem)
    return name


async def _event_type(found: event_types.EventType) -> dict[str, Any]:
    [found] = await with_problems([found])
    return {"name": found.name, "description": found.description, "schema": found.schema,
            "deprecated": found.deprecated, "problem": found.problem}


def _where(name: str) -> str:
    return "/v1/event-types/" + quote(name, safe="")


async def list_event_types(request: web.Request) -> web.Response:
    """The catalogue, and the caller's endpoints' subscriptions no current type matches."""
    async with _state(request).db.transaction(caller_of(request)) as conn:
        items = await rows(conn)
        unmatched = [{"endpoint_id": row["webhook_id"], "endpoint_name": row["endpoint_name"],
                      "pattern": row["pattern"], "problem": row["problem"]}
                     for row in await unmatched_subscriptions(conn)]
    entries = await with_problems([event_types.from_row(item) for item in items])
    for item, entry in zip(items, entries, strict=True):
        item["problem"] = entry.problem
    return json_response({"items": items, "unmatched_subscriptions": unmatched})


async def get_event_type(request: web.Request) -> web.Response:
    name = ref_of(request)
    async with _state(request).db.transaction(caller_of(request)) as conn:
        found = await get(conn, name)
    if found is None:
        raise not_found(f"event type {name}")
    return json_response(await _event_type(found))


async def put_event_type(request: web.Request) -> web.Response:
    name = _type_name(request)
    body = body_of(request, EventTypeBody)

    try:
        async with _state(request).db.transaction(caller_of(request)) as conn:
            created = await upsert(conn, name, body.description, body.json_schema, body.deprecated)
            found = await get(conn, name)
    except event_types.EventTypeError as exc:
        field, _, detail = str(exc).partition(": ")
        raise invalid(field, detail) from None
    assert found is not None
    get_logger().info("api set an event type", event_type=name, created=created, by=caller_of(request).name)
    return json_response(await _event_type(found), status=201 if created else 200,
                         location=_where(name) if created else None)


async def deprecate_event_type(request: web.Request) -> web.Response:
    name = _type_name(request)
    body = body_of(request, DeprecateBody)

    async with _state(request).db.transaction(caller_of(request)) as conn:
        found = await get(conn, name) if await deprecate(conn, name, body.deprecated) else None
    if found is None:
        raise not_found(f"event type {name}")
    return json_response(await _event_type(found))


# --- tokens -----------------------------------------------------------------------------------------


class TokenCreate(Body):
    name: str = Field(min_length=1, max_length=token_rules.MAX_NAME_LENGTH)
    role: Role
    tenant: str | None = Field(default=None, min_length=1,
                               description="the tenant it is kept to (required for tenant_admin; "
                                           "never for admin)")
    expires_in_days: float | None = Field(default=None, gt=0, le=token_rules.MAX_EXPIRES_DAYS)


async def list_tokens(request: web.Request) -> web.Response:
    async with _state(request).db.transaction(caller_of(request)) as conn:
        tokens = await token_store.listing(conn)
    return json_response({"items": tokens})


async def create_token(request: web.Request) -> web.Response:
    body = body_of(request, TokenCreate)
    problem = token_rules.name_problem(body.name)
    if problem is not None:
        raise invalid("name", problem)
    problem = token_rules.scope_problem(body.role, body.tenant)
    if problem is not None:
        raise invalid("tenant", problem)
    expires_at = None if body.expires_in_days is None \
        else datetime.now(UTC) + timedelta(days=body.expires_in_days)
    caller = caller_of(request)
    try:
        async with _state(request).db.transaction(caller) as conn:
            token = await token_store.create(conn, body.name, body.role, expires_at, body.tenant)
    except psycopg.errors.UniqueViolation:
        raise conflict(f"name: a token named {body.name!r} exists", field="name") from None
    except psycopg.errors.NoDataFound:
        raise invalid("tenant", "no tenant with this name") from None
    get_logger().info("api created a token", token=body.name, role=body.role, tenant=body.tenant,
                      by=caller.name)
    return json_response({"name": body.name, "role": body.role, "tenant": body.tenant,
                          "expires_at": expires_at, "token": token}, status=201)


async def revoke_token(request: web.Request) -> web.Response:
    name = ref_of(request)
    caller = caller_of(request)
    async with _state(request).db.transaction(caller) as conn:
        revoked = await token_store.revoke(conn, name)
    if not revoked:
        raise not_found(f"token {name} (no active token with this name)")
    get_logger().info("api revoked a token", token=name, by=caller.name)
    return json_response({"name": name, "state": "revoked"})


ROUTES: list[Route] = [
    Route("GET", "/v1/endpoints/{id}/secret", read_secret,
          "The secrets the endpoint's requests are signed with now, newest first (what its receiver "
          "verifies with); each read is logged, never the secret", ADMIN, {200: SigningSecrets},
          path_id="ref", refusals=(404, 409, 503)),
    Route("POST", "/v1/endpoints/{id}/test", send_test_event,
          "Send a webhook.test event to this endpoint alone: 202 with its delivery; 409 when the endpoint "
          "is disabled; 429 (Retry-After) past its test events a minute or its tenant's max_queued",
          ADMIN, {202: TestEventSent}, path_id="ref", refusals=(404, 409, 429)),
    Route("GET", "/v1/event-types", list_event_types,
          "The event-type catalogue, and the caller's endpoints' subscriptions that match no current type",
          READ, {200: EventTypeList}),
    Route("GET", "/v1/event-types/{name}", get_event_type, "An event type", READ, {200: EventTypeAnswer},
          path_id="name", refusals=(404,)),
    Route("PUT", "/v1/event-types/{name}", put_event_type,
          "Add an event type (201), or replace its description and schema (200)", FLEET_ADMIN,
          {200: EventTypeAnswer, 201: EventTypeAnswer}, body=EventTypeBody, path_id="name"),
    Route("POST", "/v1/event-types/{name}/deprecate", deprecate_event_type,
          "Mark an event type deprecated (or, with deprecated false, current again)", FLEET_ADMIN,
          {200: EventTypeAnswer}, body=DeprecateBody, body_required=False, path_id="name", refusals=(404,)),
    Route("GET", "/v1/tokens", list_tokens, "API tokens (never the tokens themselves)", FLEET_ADMIN,
          {200: TokenList}),
    Route("POST", "/v1/tokens", create_token, "Create a token: shown once, in this answer", FLEET_ADMIN,
          {201: TokenCreated}, body=TokenCreate, refusals=(409,)),
    Route("POST", "/v1/tokens/{name}/revoke", revoke_token, "Revoke a token: it stops at once", FLEET_ADMIN,
          {200: TokenRevoked}, path_id="name", refusals=(404,)),
]
