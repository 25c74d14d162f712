"""The operator console: server-rendered pages under /console/ of `webhook-worker api`."""

from __future__ import annotations

from aiohttp import web

from worker.console import endpoint_pages, event_type_pages, trigger_pages
from worker.console.pages import TEMPLATES, add_routes, console_middleware, templates
from worker.web.context import STATE, ApiState


def create_console_app(state: ApiState) -> web.Application:
    """The sub-application the API mounts at /console/."""
    app = web.Application(middlewares=[console_middleware])
    app[STATE] = state
    app[TEMPLATES] = templates()
    endpoint_pages.add_routes(app)  # first: /endpoints/new before /endpoints/{endpoint_id}
    event_type_pages.add_routes(app)
    trigger_pages.add_routes(app)
    add_routes(app)
    return app
