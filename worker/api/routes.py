"""The /v1 route table: every route of the resource modules, each declared once, in the order the
router matches them and the OpenAPI document lists them."""

from __future__ import annotations

import re

from aiohttp import web

from worker.api import (
    answers,
    deliveries,
    endpoints,
    event_types,
    messages,
    operations,
    settings,
    tenants,
    tokens,
    triggers,
)
from worker.api.declare import Route
from worker.rules.tokens import ROLES
from worker.web.context import DOCUMENT, json_response


async def openapi_document(request: web.Request) -> web.Response:
    # written from ROUTES by worker.api.openapi, which the application holds (this module cannot
    # import it: it reads this one)
    return json_response(request.app[DOCUMENT])



ROUTES: list[Route] = [
    Route("GET", "/v1/token", tokens.whoami, "The caller: the token's name and role", ROLES,
          {200: answers.Caller}),
    Route("GET", "/v1/openapi.json", openapi_document, "This document (no token needed)", (),
          {200: answers.Document}, public=True),
    *messages.ROUTES,
    *deliveries.ROUTES,
    *operations.ROUTES,
    *endpoints.ROUTES,
    *tenants.ROUTES,
    *settings.ROUTES,
    *endpoints.SECRET_ROUTES,
    *event_types.ROUTES,
    *triggers.ROUTES,
    *tokens.ROUTES,
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
