"""The /v1 routes: each a thin handler over the SQL functions, under the caller's database role."""

from __future__ import annotations

from aiohttp import web

from worker.api.app import allow, caller_of, json_response


@allow("producer", "reader", "admin")
async def whoami(request: web.Request) -> web.Response:
    caller = caller_of(request)
    return json_response({"name": caller.name, "role": caller.role})


def add_routes(app: web.Application) -> None:
    app.router.add_get("/v1/token", whoami)
