"""/v1/tenants: tenants, their limits and granted networks, and a one-time console link for a tenant's
administrator."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import psycopg
from aiohttp import web
from pydantic import ConfigDict, Field, field_validator

from worker.api import answers
from worker.api.answers import Answer
from worker.api.common import state_of
from worker.api.declare import Route, body_of, ref_of
from worker.api.inputs import (
    BIGINT_MAX,
    INTEGER_MAX,
    Body,
    one_field_given,
)
from worker.observability import get_logger
from worker.rules import forwarded, portal
from worker.rules import tenants as tenant_rules
from worker.rules.destinations import MAX_GRANTED_NETWORKS, granted_networks
from worker.store import tenants as tenant_store
from worker.web.context import (
    FLEET_ADMIN,
    STATE,
    caller_of,
    json_response,
)
from worker.web.problems import conflict, invalid, not_found


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
    async with state_of(request).db.transaction(caller_of(request)) as conn:
        return json_response({"items": await tenant_store.listing(conn)})


async def create_tenant(request: web.Request) -> web.Response:
    body = body_of(request, TenantCreate)
    try:
        async with state_of(request).db.transaction(caller_of(request)) as conn:
            await tenant_store.add(conn, body.name, body.given())
            row = await tenant_store.tenant(conn, body.name)
    except psycopg.errors.UniqueViolation:
        raise conflict(f"name: a tenant named {body.name!r} exists", field="name") from None
    get_logger().info("api added a tenant", tenant=body.name, by=caller_of(request).name)
    return json_response(row, status=201, location=None if row is None else f"/v1/tenants/{row['id']}")


async def get_tenant(request: web.Request) -> web.Response:
    async with state_of(request).db.transaction(caller_of(request)) as conn:
        row = await tenant_store.tenant(conn, ref_of(request))
    if row is None:
        raise not_found(f"tenant {request.match_info['id']}")
    return json_response(row)


async def update_tenant(request: web.Request) -> web.Response:
    body = body_of(request, TenantPatch)
    limits = body.given()
    if not limits:
        raise invalid("(body)", "nothing to change: give at least one limit")
    async with state_of(request).db.transaction(caller_of(request)) as conn:
        row = await tenant_store.tenant(conn, ref_of(request))
        if row is None:
            raise not_found(f"tenant {request.match_info['id']}")
        await tenant_store.update(conn, row["name"], limits)
        row = await tenant_store.tenant(conn, row["name"])
    return json_response(row)


class PortalLinkBody(Body):
    expires_in_seconds: float = Field(default=portal.DEFAULT_LIFETIME.total_seconds(), gt=0,
                                      le=portal.MAX_LIFETIME.total_seconds(),
                                      description="the link, and the session it opens, end after this")


class PortalLink(Answer):
    url: str = Field(description="opens the console once, as the tenant's administrator (shown once)")
    tenant: str
    token_name: str = Field(description="the tenant_admin token behind it: revoking it ends the session")
    expires_at: datetime
    warning: str | None = Field(default=None, description="set when the link points at the address the "
                                                          "request arrived at, for want of api.public_url")


def base_url(request: web.Request) -> tuple[str, str | None]:
    """Where people reach the API, the origin of the link, and a warning when it is only a guess:
    api.public_url; else what a trusted proxy in front says (api.trusted_proxies); else the address
    this request arrived at, which is the API's own. Never the request's Host header from anyone
    else: a link made from it could point anywhere (a phishing host, with a valid secret)."""
    state = request.app[STATE]
    if state.config.api.public_url is not None:
        return state.config.api.public_url, None
    headers = request.headers
    proxied = forwarded.forwarded_origin(request.remote, state.trusted_proxies, request.scheme,
                                         headers.get("Host"), headers.getall("X-Forwarded-Proto", []),
                                         headers.getall("X-Forwarded-Host", []))
    if proxied is not None:
        return proxied, None
    sockname = request.transport.get_extra_info("sockname") if request.transport is not None else None
    host, port = (sockname[0], sockname[1]) if sockname else (state.config.api.host, state.config.api.port)
    base = f"{request.scheme}://{f'[{host}]' if ':' in str(host) else host}:{port}"
    return base, (f"the link points at {base}, where this request arrived; set api.public_url to where "
                  "people reach the API (or list the proxy in front in api.trusted_proxies)")


async def create_portal_link(request: web.Request) -> web.Response:
    tenant = ref_of(request)
    lifetime = timedelta(seconds=body_of(request, PortalLinkBody).expires_in_seconds)
    caller = caller_of(request)
    async with request.app[STATE].db.transaction(caller) as conn:
        found = await tenant_store.tenant(conn, tenant)  # by name or id, as GET /v1/tenants/{id}
        if found is None:
            raise not_found(f"tenant {tenant}")
        base, warning = base_url(request)
        link = await tenant_store.create_portal_link(conn, str(found["name"]), lifetime, base)
    get_logger().info("api made a portal link", tenant=link.tenant, token_name=link.token_name,
                      by=caller.name)
    if warning is not None:
        get_logger().warning("api portal link without api.public_url", link_origin=base)
    return json_response({"url": link.url, "tenant": link.tenant, "token_name": link.token_name,
                          "expires_at": link.expires_at, "warning": warning}, status=201)


ROUTES: list[Route] = [
    Route("GET", "/v1/tenants", list_tenants, "Tenants, their limits (null: none) and rows", FLEET_ADMIN,
          {200: answers.TenantList}),
    Route("POST", "/v1/tenants", create_tenant, "Add a tenant", FLEET_ADMIN, {201: answers.Tenant},
          body=TenantCreate,
          refusals=(409,)),
    Route("GET", "/v1/tenants/{id}", get_tenant, "A tenant, by name or id", FLEET_ADMIN,
          {200: answers.Tenant}, path_id="ref", refusals=(404,)),
    Route("PATCH", "/v1/tenants/{id}", update_tenant, "Change a tenant's limits; null clears one",
          FLEET_ADMIN,
          {200: answers.Tenant}, body=TenantPatch, path_id="ref", refusals=(404,)),
    Route("POST", "/v1/tenants/{id}/portal-link", create_portal_link,
              "A one-time console link for the tenant's administrator (role tenant_admin): it opens the "
              "console once, until it expires; the session ends with it", FLEET_ADMIN, {201: PortalLink},
              body=PortalLinkBody, body_required=False, path_id="ref", refusals=(404,)),
]
