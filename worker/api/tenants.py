"""POST /v1/tenants/{id}/portal-link: a one-time console link for a tenant's administrator."""

from __future__ import annotations

from datetime import datetime, timedelta

from aiohttp import web
from pydantic import Field

from worker.api.answers import Answer
from worker.api.declare import Route, body_of, ref_of
from worker.api.inputs import Body
from worker.observability import get_logger
from worker.rules import forwarded, portal
from worker.store import tenants as tenant_store
from worker.web.context import FLEET_ADMIN, STATE, caller_of, json_response
from worker.web.problems import not_found


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


ROUTE = Route("POST", "/v1/tenants/{id}/portal-link", create_portal_link,
              "A one-time console link for the tenant's administrator (role tenant_admin): it opens the "
              "console once, until it expires; the session ends with it", FLEET_ADMIN, {201: PortalLink},
              body=PortalLinkBody, body_required=False, path_id="ref", refusals=(404,))
