"""POST /v1/tenants/{id}/portal-link: a one-time console link for a tenant's administrator."""

from __future__ import annotations

from datetime import datetime, timedelta

from aiohttp import web
from pydantic import Field

from worker import portal
from worker.api import queries
from worker.api.answers import Answer
from worker.api.context import FLEET_ADMIN, STATE, caller_of, json_response
from worker.api.declare import Route, body_of, ref_of
from worker.api.inputs import Body
from worker.api.problems import not_found
from worker.console.sessions import cookie_is_secure
from worker.observability import get_logger


class PortalLinkBody(Body):
    expires_in_seconds: float = Field(default=portal.DEFAULT_LIFETIME.total_seconds(), gt=0,
                                      le=portal.MAX_LIFETIME.total_seconds(),
                                      description="the link, and the session it opens, end after this")


class PortalLink(Answer):
    url: str = Field(description="opens the console once, as the tenant's administrator (shown once)")
    tenant: str
    token_name: str = Field(description="the tenant_admin token behind it: revoking it ends the session")
    expires_at: datetime


def base_url(request: web.Request) -> str:
    """Where the caller reached the API: the link is for a person who reaches it the same way (behind
    a proxy that says so, over https)."""
    secure = cookie_is_secure(request.scheme, request.headers.get("X-Forwarded-Proto"))
    return f"{'https' if secure else 'http'}://{request.host}"


async def create_portal_link(request: web.Request) -> web.Response:
    tenant = ref_of(request)
    lifetime = timedelta(seconds=body_of(request, PortalLinkBody).expires_in_seconds)
    caller = caller_of(request)
    async with request.app[STATE].db.transaction(caller) as conn:
        found = await queries.tenant(conn, tenant)  # by name or id, as GET /v1/tenants/{id}
        if found is None:
            raise not_found(f"tenant {tenant}")
        link = await portal.create_async(conn, str(found["name"]), lifetime, base_url(request))
    get_logger().info("api made a portal link", tenant=link.tenant, token_name=link.token_name,
                      by=caller.name)
    return json_response({"url": link.url, "tenant": link.tenant, "token_name": link.token_name,
                          "expires_at": link.expires_at}, status=201)


ROUTE = Route("POST", "/v1/tenants/{id}/portal-link", create_portal_link,
              "A one-time console link for the tenant's administrator (role tenant_admin): it opens the "
              "console once, until it expires; the session ends with it", FLEET_ADMIN, {201: PortalLink},
              body=PortalLinkBody, body_required=False, path_id="ref", refusals=(404,))
