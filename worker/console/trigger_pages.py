"""The console's Triggers page: each table trigger with its table, ops, state, deliveries in the last
hour and its running backfill's progress, and an admin's invoke form, through worker/store/triggers.py
as the CLI and GET /v1/triggers read them, under the caller's database role."""

from __future__ import annotations

import psycopg
from aiohttp import web

from worker.console import forms
from worker.console.pages import CALLER, FORM, error_page, render, see_other
from worker.observability import get_logger
from worker.rules.tokens import Caller
from worker.store import triggers as trigger_store
from worker.web.context import ADMIN, FLEET_ADMIN, STATE


def may_invoke(caller: Caller | None) -> bool:
    """Whether a session may invoke a trigger: an admin not kept to a tenant (a table's rows are the
    deployment's, read as the schema owner), as `triggers invoke` needs webhooks_admin."""
    return caller is not None and caller.role in FLEET_ADMIN


async def triggers(request: web.Request, error: str | None = None, typed: dict[str, str] | None = None,
                   status: int = 200) -> web.Response:
    """The list; after a refused invoke, again with the key as it was typed and why."""
    caller: Caller = request[CALLER]
    if caller.role not in ADMIN:  # as GET /v1/triggers: admins, and a tenant's administrator
        return error_page(request, 403, "Not allowed",
                          f"role {caller.role} may not see table triggers: they are shown to admin and"
                          " tenant_admin tokens.")
    async with request.app[STATE].db.transaction(caller) as conn:
        rows = await trigger_store.listing(conn)
    return render(request, "triggers.html", status=status, page="triggers", rows=rows,
                  may_invoke=may_invoke(caller), error=error, typed=typed or {})


async def invoke(request: web.Request) -> web.Response:
    caller = request[CALLER]
    if not may_invoke(caller):
        return error_page(request, 403, "Not allowed",
                          f"role {caller.role} may see table triggers but not invoke them: that needs an"
                          " admin token not kept to a tenant.")
    name = request.match_info["name"]
    key = forms.trigger_key(str(request[FORM].get("key", "")))
    try:
        async with request.app[STATE].db.transaction(caller) as conn:
            made = await trigger_store.invoke(conn, name, key)
    except psycopg.errors.NoDataFound as exc:
        return await triggers(request, str(exc.diag.message_primary), {name: key}, 404)
    except (psycopg.errors.InvalidParameterValue, psycopg.errors.InsufficientPrivilege,
            psycopg.errors.UndefinedTable) as exc:
        refused = str(exc.diag.message_primary)
        hint = exc.diag.message_hint
        return await triggers(request, f"{refused}. {hint}" if hint else refused, {name: key}, 422)
    get_logger().info("console table trigger invoked", name=caller.name, trigger=name, deliveries=made)
    return see_other("/triggers", notice="trigger_invoked", n=made)


def add_routes(app: web.Application) -> None:
    app.router.add_get("/triggers", triggers)
    app.router.add_post("/triggers/{name}/invoke", invoke)
