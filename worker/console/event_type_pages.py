"""The console's event-type catalogue: the list (with the endpoint subscriptions no current type
matches), a page per type with its JSON Schema and the subscriptions that match it, and what an
unscoped administrator does there (add, edit, deprecate), each through worker/store/event_types.py as the
CLI and the API do, under the caller's database role."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

from aiohttp import web

from worker.console import forms, queries
from worker.console.pages import CALLER, FORM, error_page, render, see_other
from worker.observability import get_logger
from worker.rules import event_types, wording
from worker.rules.tokens import Caller
from worker.store import event_types as catalogue_store
from worker.web.context import FLEET_ADMIN, READ, STATE
from worker.web.schema_checks import with_problems


class _Exists(Exception):
    """The add form named a type already catalogued: the transaction is rolled back, nothing replaced."""


def may_change(caller: Caller | None) -> bool:
    """Whether a session may change the catalogue: the roles of the API's PUT and deprecate routes
    (the catalogue is the deployment's, so not a tenant's administrator)."""
    return caller is not None and caller.role in FLEET_ADMIN


def path_of(name: str) -> str:
    """A type's page, its name one path segment (a name may hold '/', '?', '#' or spaces)."""
    return "/event-types/" + quote(name, safe="")


def _reader(request: web.Request) -> Caller:
    caller: Caller = request[CALLER]
    if caller.role not in READ:  # every console role reads it, as GET /v1/event-types allows
        raise web.HTTPForbidden()
    return caller


def _refused(request: web.Request) -> web.Response:
    role = request[CALLER].role
    return error_page(request, 403, "Not allowed",
                      f"role {role} may read the event-type catalogue but not change it: the catalogue is "
                      "the deployment's, changed with an admin token (one not kept to a tenant).")


def _schema_text(schema: Any) -> str:
    return "" if schema is None else json.dumps(schema, indent=2, ensure_ascii=False)


def _not_catalogued(request: web.Request, name: str) -> web.Response:
    return error_page(request, 404, "Not found", f"event type {wording.quoted(name)}: not in the catalogue")


async def catalogue(request: web.Request, typed: dict[str, Any] | None = None, error: str | None = None,
                    status: int = 200) -> web.Response:
    """The list; after a refused add, again with the form as it was typed and the error."""
    caller = _reader(request)
    async with request.app[STATE].db.transaction(caller) as conn:
        types = await with_problems(await catalogue_store.listing(conn))
        unmatched = await catalogue_store.unmatched_subscriptions(conn)
        subscriptions = await catalogue_store.subscriptions_by_type(conn, queries.SHOWN_SUBSCRIPTIONS)
    return render(request, "event_types.html", status=status, page="event_types", types=types,
                  unmatched=unmatched, subscriptions=subscriptions, may_change=may_change(caller),
                  typed=typed or forms.event_type_form({}), error=error,
                  shown_subscriptions=queries.SHOWN_SUBSCRIPTIONS)


async def event_type_page(request: web.Request, typed: dict[str, Any] | None = None, error: str | None = None,
                          status: int = 200) -> web.Response:
    """A type's page; after a refused change, again with the form as it was typed and the error."""
    caller = _reader(request)
    name = request.match_info["name"]
    async with request.app[STATE].db.transaction(caller) as conn:
        found = await catalogue_store.get(conn, name)
        subscriptions = [] if found is None \
            else await catalogue_store.subscriptions(conn, name, queries.PAGE_ROWS)
    if found is None:
        return _not_catalogued(request, name)
    await with_problems([found])
    if typed is None:
        typed = {"name": found.name, "description": found.description, "schema": _schema_text(found.schema),
                 "deprecated": found.deprecated}
    return render(request, "event_type.html", status=status, page="event_types", found=found,
                  schema=_schema_text(found.schema), subscriptions=subscriptions,
                  reserved=event_types.reserved_problem(found.name) is not None,
                  may_change=may_change(caller), typed=typed, error=error, limit=queries.PAGE_ROWS)


def _schema(typed: dict[str, Any]) -> Any:
    """The form's schema: an empty field is none (any payload), anything else must be JSON."""
    return event_types.schema_from_text(typed["schema"]) if typed["schema"].strip() else None


async def add_event_type(request: web.Request) -> web.Response:
    caller = request[CALLER]
    if not may_change(caller):
        return _refused(request)
    form = request[FORM]
    typed = forms.event_type_form(form)
    name = typed["name"]

    try:
        schema = _schema(typed)
        async with request.app[STATE].db.transaction(caller) as conn:
            created = await catalogue_store.upsert(conn, name, typed["description"], schema,
                                                   typed["deprecated"])
            if not created:
                raise _Exists  # rolls the replacement back: adding never overwrites a type's schema
    except event_types.EventTypeError as exc:
        return await catalogue(request, typed, str(exc), 422)
    except _Exists:
        exists = f"name: the event type {wording.quoted(name)} exists; change it on its page"
        return await catalogue(request, typed, exists, 409)
    get_logger().info("console event type added", name=caller.name, event_type=name)
    return see_other(path_of(name), notice="event_type_added")


async def edit_event_type(request: web.Request) -> web.Response:
    caller = request[CALLER]
    if not may_change(caller):
        return _refused(request)
    name = request.match_info["name"]
    form = request[FORM]
    typed = {**forms.event_type_form(form), "name": name}

    try:
        schema = _schema(typed)
        async with request.app[STATE].db.transaction(caller) as conn:
            changed = await catalogue_store.get(conn, name) is not None
            if changed:
                await catalogue_store.upsert(conn, name, typed["description"], schema, typed["deprecated"])
    except event_types.EventTypeError as exc:
        field, _, problem = str(exc).partition(": ")
        if field == "name":  # the path's name (a worker's own type): the page has no form to show it on
            raise forms.FieldError(field, problem) from None
        return await event_type_page(request, typed, str(exc), 422)
    if not changed:
        return _not_catalogued(request, name)
    get_logger().info("console event type changed", name=caller.name, event_type=name)
    return see_other(path_of(name), notice="event_type_edited")


async def deprecate_event_type(request: web.Request) -> web.Response:
    caller = request[CALLER]
    if not may_change(caller):
        return _refused(request)
    name = request.match_info["name"]
    form = request[FORM]
    deprecated = forms.deprecated(form)
    try:
        async with request.app[STATE].db.transaction(caller) as conn:
            found = await catalogue_store.deprecate(conn, name, deprecated)
    except event_types.EventTypeError as exc:
        raise forms.FieldError("name", str(exc).partition(": ")[2]) from None
    if not found:
        return _not_catalogued(request, name)
    get_logger().info("console event type deprecated", name=caller.name, event_type=name,
                      deprecated=deprecated)
    return see_other(path_of(name), notice="event_type_deprecated" if deprecated else "event_type_current")


def add_routes(app: web.Application) -> None:
    app.router.add_get("/event-types", catalogue)
    app.router.add_post("/event-types", add_event_type)
    app.router.add_get("/event-types/{name}", event_type_page)
    app.router.add_post("/event-types/{name}", edit_event_type)
    app.router.add_post("/event-types/{name}/deprecate", deprecate_event_type)
