"""Endpoint registration and changes over HTTP: worker.rules.endpoints' models and worker.store.endpoints,
their problems as problem documents; the endpoint a path or a filter names."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

import psycopg
from pydantic import Field

from worker import names
from worker.api.inputs import Body
from worker.config import Config
from worker.rules import endpoints as service
from worker.rules import signing
from worker.store import endpoints as endpoint_store
from worker.store.database import Conn
from worker.web.problems import Problem, conflict, invalid, not_found

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
