"""Endpoint registration and changes over HTTP: worker.endpoints' models and service, its problems
as problem documents."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from pydantic import Field

from worker import endpoints as service
from worker import signing
from worker.api.inputs import Body
from worker.api.problems import Problem, conflict, invalid
from worker.config import Config

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
    await settled(asyncio.to_thread(service.check_destination, url, config, scope, advise))
