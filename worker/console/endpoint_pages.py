"""The console's endpoint page and what an administrator (a tenant's too) does there: add, edit,
rotate and reveal the signing secret, send a test event; each through the endpoint service and the
SQL functions the CLI and the API call, under the caller's database role."""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import UTC, datetime, timedelta

import psycopg
from aiohttp import web

from worker import names
from worker.console import forms, queries
from worker.console.pages import CALLER, FORM, error_page, render, see_other
from worker.encryption import Keyring
from worker.observability import get_logger
from worker.rules import endpoints as service
from worker.rules import self_service, signing
from worker.store import deliveries as delivery_store
from worker.store import endpoints as endpoint_store
from worker.web.context import STATE
from worker.web.problems import refused

# A rotated-out secret keeps signing this long, so a receiver has time to switch.
OLD_SECRET_HOURS = 24


def _keyring(request: web.Request) -> Keyring:
    keyring = request.app[STATE].keyring
    if keyring is None:
        raise forms.FieldError("(keys)", "the API has no encryption keys: endpoint changes are refused")
    return keyring


def _refused(found: service.EndpointProblem) -> forms.FieldError:
    hint = f"; to deliver there, {found.hint}" if found.hint else ""
    return forms.FieldError(found.field, found.detail + hint)


async def endpoint_page(request: web.Request, revealed: list[self_service.SigningSecret] | None = None
                        ) -> web.Response:
    endpoint_id = forms.identifier("endpoint_id", request.match_info["endpoint_id"])
    async with request.app[STATE].db.transaction(request[CALLER]) as conn:
        facts = await queries.endpoint_page(conn, endpoint_id)
    if facts is None:
        return error_page(request, 404, "Not found", f"endpoint {endpoint_id}: not found")
    return render(request, "endpoint.html", page="endpoints", revealed=revealed, formats=service.BODY_FORMATS,
                  **facts)


async def add_endpoint(request: web.Request) -> web.Response:
    form = request[FORM]
    fields = forms.endpoint_fields(form, creating=True)
    keyring = _keyring(request)
    state = request.app[STATE]
    caller = request[CALLER]
    try:
        body = service.parse(service.EndpointCreate, fields)
        async with state.db.transaction(caller) as conn:
            scope = await endpoint_store.destination_scope(conn, body.tenant)
        assert scope is not None  # (a tenant, or an error: every registration has one)
        await asyncio.to_thread(service.check_destination, body.url, state.config, scope,
                                caller.tenant_id is None, names.addresses)
        async with state.db.transaction(caller) as conn:
            registered = await endpoint_store.register(conn, body, keyring)
    except service.EndpointProblem as found:
        raise _refused(found) from None
    get_logger().info("console endpoint added", name=request[CALLER].name, endpoint_id=registered.id)
    return see_other(f"/endpoints/{registered.id}", notice="endpoint_added", id=registered.id)


async def edit_endpoint(request: web.Request) -> web.Response:
    endpoint_id = forms.identifier("endpoint_id", request.match_info["endpoint_id"])
    form = request[FORM]
    fields = forms.endpoint_fields(form, creating=False)
    keyring = _keyring(request)
    state = request.app[STATE]

    caller = request[CALLER]
    try:
        body = service.parse(service.EndpointUpdate, fields)
        if body.url is not None:
            # where the endpoint's tenant may deliver
            async with state.db.transaction(caller) as conn:
                scope = await endpoint_store.destination_scope(conn, endpoint_id=endpoint_id)
            if scope is None:
                return error_page(request, 404, "Not found", f"endpoint {endpoint_id}: not found")
            await asyncio.to_thread(service.check_destination, body.url, state.config, scope,
                                    caller.tenant_id is None, names.addresses)
        async with state.db.transaction(caller) as conn:
            changed = await endpoint_store.update(conn, endpoint_id, body, keyring) \
                if await endpoint_store.visible(conn, endpoint_id) else None
    except service.EndpointProblem as found:
        raise _refused(found) from None
    if changed is None:
        return error_page(request, 404, "Not found", f"endpoint {endpoint_id}: not found")
    get_logger().info("console endpoint changed", name=request[CALLER].name, endpoint_id=endpoint_id,
                      fields=changed)
    return see_other(f"/endpoints/{endpoint_id}", notice="endpoint_edited", id=endpoint_id)


async def rotate_secret(request: web.Request) -> web.Response:
    endpoint_id = forms.identifier("endpoint_id", request.match_info["endpoint_id"])
    keyring = _keyring(request)
    secret = signing.generate_secret()
    old_expire_at = datetime.now(UTC) + timedelta(hours=OLD_SECRET_HOURS)

    caller = request[CALLER]

    async with request.app[STATE].db.transaction(caller) as conn:
        rotated = await endpoint_store.rotate_secret(conn, endpoint_id, secret, old_expire_at, keyring,
                                                     f"{caller.name} (console)") \
            if await endpoint_store.visible(conn, endpoint_id) else None
    if rotated is None:
        return error_page(request, 404, "Not found", f"endpoint {endpoint_id}: not found")
    get_logger().info("console secret rotated", name=request[CALLER].name, endpoint_id=endpoint_id)
    return see_other(f"/endpoints/{endpoint_id}", notice="secret_rotated", id=endpoint_id)


async def reveal_secret(request: web.Request) -> web.Response:
    """The secrets the endpoint's requests are signed with now, on the page (a POST: never in a link,
    a history entry or a cache)."""
    endpoint_id = forms.identifier("endpoint_id", request.match_info["endpoint_id"])
    keyring = _keyring(request)
    state = request.app[STATE]
    allow_plaintext = not state.config.security.require_sealed
    async with state.db.transaction(request[CALLER]) as conn:
        revealed = await endpoint_store.signing_secrets(conn, keyring, endpoint_id, allow_plaintext)
    if revealed is None:
        return error_page(request, 404, "Not found", f"endpoint {endpoint_id}: not found")
    get_logger().info("console secret revealed", name=request[CALLER].name, endpoint_id=endpoint_id)
    return await endpoint_page(request, revealed)


async def send_test_event(request: web.Request) -> web.Response:
    endpoint_id = forms.identifier("endpoint_id", request.match_info["endpoint_id"])
    try:
        async with request.app[STATE].db.transaction(request[CALLER]) as conn:
            delivery_id = await delivery_store.test_event(conn, str(endpoint_id))
    except self_service.RefusedTestEvent as exc:
        # answered as the API answers it (the page, its status and Retry-After)
        raise refused(**dataclasses.asdict(exc.refusal)) from None
    if delivery_id is None:
        return error_page(request, 404, "Not found", f"endpoint {endpoint_id}: not found")
    get_logger().info("console test event", name=request[CALLER].name, endpoint_id=endpoint_id,
                      delivery_id=delivery_id)
    return see_other(f"/deliveries/{delivery_id}", notice="test_sent", id=delivery_id)


async def delete_page(request: web.Request) -> web.Response:
    """The confirmation step: what deleting the endpoint keeps, refuses and drops, and its form."""
    endpoint_id = forms.identifier("endpoint_id", request.match_info["endpoint_id"])
    async with request.app[STATE].db.transaction(request[CALLER]) as conn:
        facts = await queries.endpoint_page(conn, endpoint_id)
        rows = None if facts is None else await queries.endpoint_rows(conn, endpoint_id)
    if facts is None or rows is None:
        return error_page(request, 404, "Not found", f"endpoint {endpoint_id}: not found")
    return render(request, "endpoint_delete.html", page="endpoints", endpoint=facts["endpoint"], rows=rows)


async def delete_endpoint(request: web.Request) -> web.Response:
    """Deletes it once its name is typed back, as `endpoints delete [--drop-pending]` and DELETE
    /v1/endpoints/{id}[?drop_pending=true] do (webhooks.api_delete_endpoint)."""
    endpoint_id = forms.identifier("endpoint_id", request.match_info["endpoint_id"])
    form = request[FORM]
    drop_pending = forms.checked(form.get("drop_pending"))
    typed = form.get("confirm_name")
    caller = request[CALLER]
    try:
        async with request.app[STATE].db.transaction(caller) as conn:
            facts = await queries.endpoint_page(conn, endpoint_id)
            if facts is None:
                return error_page(request, 404, "Not found", f"endpoint {endpoint_id}: not found")
            name = facts["endpoint"]["name"]
            if not isinstance(typed, str) or typed.strip() != name:
                raise forms.FieldError("confirm_name", f"type the endpoint's name, {name}, to delete it")
            dropped = await queries.delete_endpoint(conn, endpoint_id, drop_pending,
                                                    f"{caller.name} (console)")
    except psycopg.errors.ObjectInUse as exc:
        return error_page(request, 409, "The endpoint's deliveries refuse this",
                          str(exc.diag.message_primary))
    if dropped is None:
        return error_page(request, 404, "Not found", f"endpoint {endpoint_id}: not found")
    get_logger().info("console endpoint deleted", name=caller.name, endpoint_id=endpoint_id, dropped=dropped)
    return see_other("/endpoints", notice="endpoint_deleted", id=endpoint_id, n=dropped)


def add_routes(app: web.Application) -> None:
    app.router.add_post("/endpoints/new", add_endpoint)
    app.router.add_get("/endpoints/{endpoint_id}", endpoint_page)
    app.router.add_post("/endpoints/{endpoint_id}/edit", edit_endpoint)
    app.router.add_post("/endpoints/{endpoint_id}/rotate-secret", rotate_secret)
    app.router.add_post("/endpoints/{endpoint_id}/secret", reveal_secret)
    app.router.add_post("/endpoints/{endpoint_id}/test", send_test_event)
    app.router.add_get("/endpoints/{endpoint_id}/delete", delete_page)
    app.router.add_post("/endpoints/{endpoint_id}/delete", delete_endpoint)
