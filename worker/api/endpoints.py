"""/v1/endpoints: registration and changes (worker.rules.endpoints' models, stored by
worker.store.endpoints, their problems as problem documents), reads, health, circuits, enabling and
disabling, deletion, signing secrets rotated and read, and test events; the endpoint a path or a
filter names."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable
from datetime import UTC, datetime, timedelta
from typing import Literal, TypeVar

import psycopg
from aiohttp import web
from pydantic import Field

from worker import encryption, names
from worker.api import answers
from worker.api.answers import Answer
from worker.api.common import TENANT_FILTER, Page, decided_by, keyring_of, narrow_to_tenant, state_of
from worker.api.declare import Route, body_of, query_of, ref_of
from worker.api.inputs import (
    Body,
    Id,
    Query,
    Text,
    Timestamp,
)
from worker.config import Config
from worker.observability import get_logger
from worker.rules import endpoints as endpoint_service
from worker.rules import endpoints as service
from worker.rules import self_service as secrets_service
from worker.rules import signing
from worker.store import deliveries as delivery_store
from worker.store import endpoints as endpoint_store
from worker.store.database import Conn
from worker.web.context import (
    ADMIN,
    READ,
    caller_of,
    json_response,
)
from worker.web.problems import Problem, conflict, invalid, not_found, refused

T = TypeVar("T")
# The request bodies: the service's models (one shape: what GET answers can be sent back).
EndpointCreate = service.EndpointCreate
EndpointPatch = service.EndpointUpdate



class SecretRotation(Body):
    secret: str | None = Field(default=None, repr=False)
    expire_old_after_hours: float | None = Field(default=None, gt=0, le=24 * 365)


def refuse_scoped(body: service.EndpointFields, tenant_id: int | None) -> None:
    """A caller kept to one tenant never marks an endpoint for every tenant's operational events
    (SQL refuses it too for a session scoped to a tenant: the trigger refuse_scoped_all_tenants).
    Only admin tokens reach these routes, and they are never scoped today; a tenant admin would be."""
    if body.operational_all_tenants and tenant_id is not None:
        raise Problem(403, "forbidden", "The token may not do this",
                      "operational_all_tenants: a token scoped to a tenant cannot mark an endpoint for "
                      "every tenant's operational events", field="operational_all_tenants")


def check_secret(secret: str, field: str = "secret") -> None:
    problem = signing.secret_problem(secret)
    if problem is not None:
        raise invalid(field, problem)


def problem(found: service.EndpointProblem) -> Problem:
    """The service's problem as a problem document: 409 for a conflict, else 422 naming the field."""
    detail = found.detail + (f"; to deliver there, {found.hint}" if found.hint else "")
    if found.conflict:
        return conflict(f"{found.field}: {detail}", field=found.field)
    return invalid(found.field, detail)


async def settled(work: Awaitable[T]) -> T:
    """The result of a service call, its EndpointProblem answered as a problem document."""
    try:
        return await work
    except service.EndpointProblem as found:
        raise problem(found) from None


async def check_destination(url: str | None, config: Config, scope: service.DestinationScope | None,
                            advise: bool) -> None:
    """The service's destination rules for an endpoint of `scope`'s tenant, in a thread (DNS),
    before any transaction opens; a name that does not resolve yet is accepted (deliveries fail as
    `dns` until it does). `advise`: the caller is no tenant's, and a refusal says how to allow the
    address."""
    if url is None:
        return
    if scope is None:  # an endpoint the caller does not see (answered 404 before this)
        raise invalid("url", "no endpoint to check the destination for")
    await settled(asyncio.to_thread(service.check_destination, url, config, scope, advise, names.addresses))


async def endpoint_id(conn: Conn, name_or_id: str, field: str | None = None) -> int | None:
    """The endpoint an id, a name or `tenant/name` names (webhooks.endpoint_ref()); a name several
    tenants hold, to a caller that is no tenant's, is a conflict (409) asking for the id or
    `tenant/name`, naming `field` if the name came in one."""
    try:
        return await endpoint_store.endpoint_ref(conn, name_or_id)
    except psycopg.errors.TooManyRows as exc:
        raise conflict(str(exc.diag.message_primary), field=field) from None


async def endpoint_named(conn: Conn, name_or_id: str) -> int:
    """The endpoint a path names, by id, by name or as `tenant/name` (as the CLI's ENDPOINT
    arguments); one the caller cannot see (another tenant's) is a missing one: 404."""
    found = await endpoint_id(conn, name_or_id)
    if found is None:
        raise not_found(f"endpoint {name_or_id}")
    return found


async def destination_scope(conn: Conn, tenant: str | None = None, endpoint_id: int | None = None
                            ) -> service.DestinationScope | None:
    """Where an endpoint registered in `tenant`, or the endpoint `endpoint_id`, may deliver
    (worker.store.endpoints.destination_scope, on the request's connection)."""
    return await settled(endpoint_store.destination_scope(conn, tenant, endpoint_id))


class EndpointQuery(Page):
    tenant: Text | None = TENANT_FILTER
    cursor: Id | None = Field(default=None, description="next_cursor of the previous page")


async def list_endpoints(request: web.Request) -> web.Response:
    query = query_of(request, EndpointQuery)
    async with state_of(request).db.transaction(caller_of(request)) as conn:
        await narrow_to_tenant(conn, query.tenant)
        rows = await endpoint_store.page(conn, query.cursor, query.limit + 1)
    more = len(rows) > query.limit
    rows = rows[:query.limit]
    return json_response({"items": rows, "next_cursor": str(rows[-1]["id"]) if more else None})


async def create_endpoint(request: web.Request) -> web.Response:
    state = state_of(request)
    body = body_of(request, EndpointCreate)
    caller = caller_of(request)
    refuse_scoped(body, caller.tenant_id)
    keyring = keyring_of(state)
    try:
        async with state.db.transaction(caller) as conn:
            scope = await destination_scope(conn, tenant=body.tenant)
        await check_destination(body.url, state.config, scope, advise=caller.tenant_id is None)
        async with state.db.transaction(caller) as conn:
            registered = await settled(endpoint_store.register(conn, body, keyring))
    except psycopg.errors.InsufficientPrivilege as exc:  # a tenant not the scoped caller's own
        raise Problem(403, "forbidden", "The token may not do this", str(exc.diag.message_primary),
                      field="tenant") from None
    get_logger().info("api registered an endpoint", endpoint_id=registered.id, by=caller_of(request).name)
    async with state.db.transaction(caller_of(request)) as conn:
        row = await endpoint_store.details(conn, registered.id)
    return json_response({**(row or {}), "signing_secret": registered.signing_secret}, status=201,
                         location=f"/v1/endpoints/{registered.id}")


async def get_endpoint(request: web.Request) -> web.Response:
    async with state_of(request).db.transaction(caller_of(request)) as conn:
        row = await endpoint_store.details(conn, await endpoint_named(conn, ref_of(request)))
    return json_response(row)


async def update_endpoint(request: web.Request) -> web.Response:
    state = state_of(request)
    body = body_of(request, EndpointPatch)
    caller = caller_of(request)
    refuse_scoped(body, caller.tenant_id)
    keyring = keyring_of(state)
    async with state.db.transaction(caller) as conn:
        endpoint_id = await endpoint_named(conn, ref_of(request))
        scope = None if body.url is None \
            else await destination_scope(conn, endpoint_id=endpoint_id)
    # the endpoint's tenant decides where it may deliver
    await check_destination(body.url, state.config, scope, advise=caller.tenant_id is None)
    async with state.db.transaction(caller) as conn:
        await settled(endpoint_store.update(conn, endpoint_id, body, keyring))
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
        async with state_of(request).db.transaction(caller) as conn:
            endpoint_id = await endpoint_named(conn, ref_of(request))
            dropped = await endpoint_store.delete(conn, endpoint_id, drop_pending, decided_by(caller))
    except (psycopg.errors.ObjectInUse, psycopg.errors.ForeignKeyViolation) as exc:
        raise conflict(str(exc.diag.message_primary or "the endpoint still has deliveries")) from None
    if dropped is None:
        raise not_found(f"endpoint {request.match_info['id']}")
    get_logger().info("api deleted an endpoint", endpoint_id=endpoint_id, dropped=dropped, by=caller.name)
    return web.Response(status=204)


HEALTH_WINDOW_HOURS = 24
MAX_HEALTH_WINDOW_HOURS = 24 * 31


class HealthQuery(Query):
    hours: int = Field(default=HEALTH_WINDOW_HOURS, ge=1, le=MAX_HEALTH_WINDOW_HOURS, description="window")


async def endpoint_health(request: web.Request) -> web.Response:
    hours = query_of(request, HealthQuery).hours
    async with state_of(request).db.transaction(caller_of(request)) as conn:
        endpoint_id = await endpoint_named(conn, ref_of(request))
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
    async with state_of(request).db.transaction(caller) as conn:
        endpoint_id = await endpoint_named(conn, ref_of(request))
        change = await endpoint_store.set_circuit(conn, endpoint_id, body.action, until, decided_by(caller))
        health = await endpoint_store.health(conn, endpoint_id, HEALTH_WINDOW_HOURS)
    return json_response({"endpoint_id": endpoint_id, "change": change,
                          "circuit_state": health and health["circuit_state"]})


class ReasonBody(Body):
    reason: str | None = Field(default=None, min_length=1, max_length=endpoint_service.MAX_REASON_CHARS)


async def _set_active(request: web.Request, active: bool) -> web.Response:
    reason = body_of(request, ReasonBody).reason if not active else None
    caller = caller_of(request)
    async with state_of(request).db.transaction(caller) as conn:
        endpoint_id = await endpoint_named(conn, ref_of(request))
        change = await endpoint_store.set_active(conn, endpoint_id, active, reason or "disabled over the API",
                                          decided_by(caller))
    return json_response({"endpoint_id": endpoint_id, "active": active, "changed": change is not None})


async def enable_endpoint(request: web.Request) -> web.Response:
    return await _set_active(request, True)


async def disable_endpoint(request: web.Request) -> web.Response:
    return await _set_active(request, False)


async def rotate_secret(request: web.Request) -> web.Response:
    state = state_of(request)
    body = body_of(request, SecretRotation)
    keyring = keyring_of(state)
    secret = body.secret or signing.generate_secret()
    check_secret(secret)
    expire_at = None
    if body.expire_old_after_hours is not None:
        expire_at = datetime.now(UTC) + timedelta(hours=body.expire_old_after_hours)
    caller = caller_of(request)
    async with state.db.transaction(caller) as conn:
        endpoint_id = await endpoint_named(conn, ref_of(request))
    async with state.db.transaction(caller) as conn:
        active = await endpoint_store.rotate_secret(conn, endpoint_id, secret, expire_at, keyring,
                                                    decided_by(caller))
    if not active:
        raise not_found(f"endpoint {request.match_info['id']}")
    # who rotated which endpoint's secret, never the secret (as a read is logged)
    get_logger().info("api rotated a signing secret", endpoint_id=endpoint_id, by=caller.name,
                      role=caller.role, old_expire_at=expire_at)
    return json_response({"endpoint_id": endpoint_id, "signing_secret": secret, "active_secrets": active,
                          "old_expire_at": expire_at})


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


async def read_secret(request: web.Request) -> web.Response:
    """What an endpoint's requests are signed with now: the receiver needs it to verify them."""
    state, caller = state_of(request), caller_of(request)
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
        async with state_of(request).db.transaction(caller) as conn:
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


ROUTES: list[Route] = [
    Route("GET", "/v1/endpoints", list_endpoints, "Endpoints by id (keyset pages)", READ,
          {200: answers.EndpointPage}, query=EndpointQuery),
    Route("POST", "/v1/endpoints", create_endpoint,
          "Register an endpoint (the CLI's destination, header and sealing rules); the signing secret is "
          "shown once", ADMIN, {201: answers.EndpointCreated}, body=EndpointCreate,
          refusals=(409, 503)),
    Route("GET", "/v1/endpoints/{id}", get_endpoint,
          "An endpoint, by id, name or tenant/name (409: a name more than one tenant holds)", READ,
          {200: answers.EndpointDetail}, path_id="ref", refusals=(404, 409)),
    Route("PATCH", "/v1/endpoints/{id}", update_endpoint, "Change an endpoint's settings", ADMIN,
          {200: answers.EndpointDetail}, body=EndpointPatch, path_id="ref",
          refusals=(404, 409, 503)),
    Route("DELETE", "/v1/endpoints/{id}", delete_endpoint,
          "Delete an endpoint; its delivered and dead-lettered rows and its audit stay as history under its"
          " id and name, never replayed. 409 while any of its deliveries is waiting (pending, retrying),"
          " unless drop_pending=true makes those dead letters (category endpoint_deleted, audited), and"
          " while any is being sent (disable it first: that ends within the lease)", ADMIN, {204: None},
          query=DeleteEndpointQuery, path_id="ref", refusals=(404, 409)),
    Route("GET", "/v1/endpoints/{id}/health", endpoint_health,
          "Circuit state and recent attempts by outcome and category", READ, {200: answers.EndpointHealth},
          query=HealthQuery, path_id="ref", refusals=(404, 409)),
    Route("POST", "/v1/endpoints/{id}/circuit", endpoint_circuit,
          "Reset, open (until a time) or close the circuit", ADMIN, {200: answers.CircuitChanged},
          body=CircuitBody, path_id="ref", refusals=(404, 409)),
    Route("POST", "/v1/endpoints/{id}/enable", enable_endpoint,
          "Enable (and reset the circuit); queued rows are sent", ADMIN, {200: answers.ActiveChanged},
          path_id="ref", refusals=(404, 409)),
    Route("POST", "/v1/endpoints/{id}/disable", disable_endpoint,
          "Disable: no new deliveries, queued rows wait", ADMIN, {200: answers.ActiveChanged},
          body=ReasonBody, body_required=False, path_id="ref", refusals=(404, 409)),
    Route("POST", "/v1/endpoints/{id}/rotate-secret", rotate_secret,
          "Add a new signing secret (shown once); the old ones stay until expire_old_after_hours", ADMIN,
          {200: answers.SecretRotated}, body=SecretRotation, body_required=False, path_id="ref",
          refusals=(404, 409, 503)),
]


# listed after the settings in the route table (and the OpenAPI document)
SECRET_ROUTES: list[Route] = [
    Route("GET", "/v1/endpoints/{id}/secret", read_secret,
          "The secrets the endpoint's requests are signed with now, newest first (what its receiver "
          "verifies with); each read is logged, never the secret", ADMIN, {200: SigningSecrets},
          path_id="ref", refusals=(404, 409, 503)),
    Route("POST", "/v1/endpoints/{id}/test", send_test_event,
          "Send a webhook.test event to this endpoint alone: 202 with its delivery; 409 when the endpoint "
          "is disabled; 429 (Retry-After) past its test events a minute or its tenant's max_queued",
          ADMIN, {202: TestEventSent}, path_id="ref", refusals=(404, 409, 429)),
]
