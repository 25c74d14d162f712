"""The console's handlers and its middleware: sessions, CSRF, roles and security headers per request."""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import jinja2
import psycopg
from aiohttp import web
from multidict import MultiDictProxy

from worker.console import forms, queries, sessions
from worker.observability import get_logger
from worker.rules import portal, wording
from worker.rules.classification import CATEGORIES
from worker.rules.event_types import MAX_DESCRIPTION_CHARS
from worker.rules.formats import FORMATS as BODY_FORMATS
from worker.rules.tokens import Caller
from worker.store import endpoints as endpoint_store
from worker.store import tokens as token_store
from worker.tables import endpoint_label
from worker.web.context import ADMIN, READ, STATE, ApiState, client_address
from worker.web.problems import Problem

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
PREFIX = "/console"
STATIC_DIR = Path(__file__).with_name("static")
CALLER = web.RequestKey("webhook_console_caller", Caller)
SESSION = web.RequestKey("webhook_console_session", str)
FORM = web.RequestKey("webhook_console_form", MultiDictProxy[Any])
TEMPLATES = web.AppKey("webhook_console_templates", jinja2.Environment)
# The name of the tenant a tenant administrator's session is kept to, shown on every page.
TENANT_NAME = web.RequestKey("webhook_console_tenant_name", str)
# The roles whose sessions may change things; a tenant_admin's changes are kept to its tenant by
# PostgreSQL (webhooks_tenant_admin under row-level security), not by the console.
CHANGERS = ADMIN
# Pages that need no session: the login form, the portal link's pages and the files they use.
PUBLIC = ("/console/login", "/console/portal", "/console/portal-ended", "/console/static/")
# No inline script or style anywhere, nothing from elsewhere, no framing, forms post only here.
CONTENT_SECURITY_POLICY = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
                           "form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cache-Control": "no-store",
}
# Fixed texts for the notice a page shows after a change: the query string carries a code, never text.
NOTICES = {
    "replayed": "{n} dead letter(s) put back in the queue.",
    "not_replayed": "Nothing replayed: no longer a dead letter (someone replayed it already?).",
    "not_replayed_deleted": "Nothing replayed: {n} of them belong to a deleted endpoint, whose rows are kept "
                            "as history and never sent again.",
    "replayed_some": "{n} dead letter(s) put back in the queue; the others belong to a deleted endpoint or "
                     "were replayed already.",
    "endpoint_deleted": "Endpoint {id} deleted; {n} waiting delivery(ies) became dead letters (category "
                        "endpoint_deleted, never sent again). Its finished rows stay as history.",
    "endpoint_changed": "Endpoint {id}: {action} done; the reason is recorded in its events.",
    "endpoint_unchanged": "Endpoint {id}: nothing to {action} (it already was).",
    "logged_out": "You are logged out.",
    "endpoint_added": "Endpoint {id} added. Reveal its signing secret below for the receiver to verify with.",
    "endpoint_edited": "Endpoint {id} changed.",
    "secret_rotated": "Endpoint {id}: a new signing secret; the old one keeps signing for 24 hours.",
    "test_sent": "A webhook.test event is queued to the endpoint: delivery {id}.",
    "session_ended": "Your session ended: it expired, or its token or link was revoked. Log in again.",
    "portal_logged_out": "You are logged out.",
    "portal_session_ended": "Your session ended: the link that opened it expired or was revoked.",
    "operation_started": "Operation {id} started: it replays each dead letter the filter matched, once.",
    "operation_cancelled": "Operation {id} cancelled: it stops after the step it is in.",
    "operation_finished": "Operation {id} had already ended: nothing to cancel.",
    "event_type_added": "Event type added to the catalogue.",
    "event_type_edited": "Event type changed.",
    "event_type_deprecated": "Event type deprecated: still accepted and delivered to its subscribers.",
    "event_type_current": "Event type current again.",
    "trigger_invoked": "The row is queued now, as op manual: {n} delivery(ies).",
}


def templates() -> jinja2.Environment:
    environment = jinja2.Environment(
        loader=jinja2.PackageLoader("worker.console", "templates"),
        autoescape=True, undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    environment.filters["when"] = _when
    environment.filters["age"] = _age
    environment.filters["segment"] = _segment
    environment.globals["endpoint_label"] = endpoint_label  # as the CLI's lists name an endpoint
    environment.globals["max_reason"] = forms.MAX_REASON_LENGTH
    environment.globals["max_description"] = MAX_DESCRIPTION_CHARS  # the catalogue's, as upsert() checks
    environment.globals["categories"] = CATEGORIES  # the one list, as the API checks it
    return environment


def _when(value: Any) -> str:
    return "–" if value is None else value.strftime("%Y-%m-%d %H:%M:%S %Z")


def _segment(value: Any) -> str:
    """A value as one segment of a page's path (an event type's name may hold '/', '?' or '#')."""
    return quote(str(value), safe="")


def _age(seconds: float | None) -> str:
    if not seconds:
        return "none due"
    seconds = int(seconds)
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    return f"{seconds // 3600} h {seconds % 3600 // 60} min"


def notice(query: Any) -> str | None:
    text = NOTICES.get(query.get("notice", ""))
    if text is None:
        return None
    values = {k: query.get(k, "") for k in ("n", "id", "action")}
    if not all(v.isalnum() or v == "" for v in values.values()):
        return None
    return text.format(**values)


def render(request: web.Request, template: str, status: int = 200, **context: Any) -> web.Response:
    caller = request.get(CALLER)
    session = request.get(SESSION)
    context.setdefault("page", "")
    context.setdefault("tenant_name", request.get(TENANT_NAME))
    page = request.app[TEMPLATES].get_template(template).render(
        prefix=PREFIX, caller=caller, is_admin=caller is not None and caller.role in CHANGERS,
        csrf=sessions.csrf_token(session) if session else "", notice=notice(request.query), **context)
    return web.Response(text=page, status=status, content_type="text/html", charset="utf-8")


def see_other(path: str, **query: Any) -> web.Response:
    location = PREFIX + path + (("?" + urlencode(query)) if query else "")
    return web.Response(status=303, headers={"Location": location})


def error_page(request: web.Request, status: int, title: str, detail: str) -> web.Response:
    return render(request, "error.html", status=status, title=title, detail=detail)


@web.middleware
async def console_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        response = await _checked(request, handler)
    except forms.FieldError as exc:
        response = error_page(request, 422, "A field is invalid", str(exc))
    except Problem as problem:
        response = error_page(request, problem.status, problem.title, problem.detail or problem.title)
        response.headers.update(problem.headers)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        response = error_page(request, exc.status, exc.reason,
                              f"{request.method} {request.path}: {exc.reason}")
    except psycopg.OperationalError:
        # the route's pattern, not the path: a portal link's path is its secret
        route = request.match_info.route.resource
        get_logger().warning("console database unreachable",
                             route=route.canonical if route is not None else "(no route)")
        response = error_page(request, 503, "The database is unreachable", "Try again shortly.")
    except psycopg.Error as exc:
        # The type only: a database message can quote the values of the statement.
        get_logger().error("console database call failed", path=request.path, error=type(exc).__name__)
        response = error_page(request, 500, "The database refused this",
                              f"{type(exc).__name__}; see the log.")
    response.headers.update(SECURITY_HEADERS)
    return response


async def _checked(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every page but the login needs a live session; every POST a CSRF token; changes an admin."""
    if request.path.startswith(PUBLIC):
        return await handler(request)
    state = request.app[STATE]
    session_id = request.cookies.get(sessions.COOKIE, "")
    caller = None
    if session_id:
        # A miss (a malformed, unknown or ended session) counts against the address as a failed
        # login does, so session ids are guessed no faster than tokens; a malformed one is refused
        # without asking the database.
        key = sessions.session_hash(session_id) if sessions.well_formed(session_id) else None
        verdict = await state.check_credential(client_address(request), key,
                                               lambda: _session_caller(state, session_id))
        caller = verdict.found
    if caller is None:
        # A revoked or expired token lands here on its very next request, told why; a portal
        # link's customer on the page meant for them.
        customer = bool(request.cookies.get(sessions.PORTAL_COOKIE))
        said = ({"notice": "portal_session_ended" if customer else "session_ended"} if session_id else {})
        response = see_other("/portal-ended" if customer else "/login", **said)
        if session_id:
            response.del_cookie(sessions.COOKIE, path=sessions.COOKIE_PATH)
        return response
    request[CALLER] = caller
    request[SESSION] = session_id
    if caller.tenant_id is not None:
        async with state.db.transaction(caller) as conn:
            request[TENANT_NAME] = await queries.tenant_name(conn, caller.tenant_id)
    if request.method == "POST":
        form = await request.post()
        if not sessions.same_secret(sessions.csrf_token(session_id), _text(form.get("csrf"))):
            return error_page(request, 403, "Form refused",
                              "csrf: the form's CSRF token is missing or wrong; reload the page and retry.")
        if request.path != PREFIX + "/logout" and caller.role not in CHANGERS:
            return error_page(request, 403, "Not allowed",
                              f"role {caller.role} may look but not change anything; it needs admin.")
        request[FORM] = form
    return await handler(request)


async def _session_caller(state: ApiState, session_id: str) -> Caller | None:
    async with state.db.connection() as conn:
        return await token_store.session_caller(conn, sessions.session_hash(session_id))


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


# --- login ----------------------------------------------------------------------------------------


def _secure(request: web.Request) -> bool:
    return sessions.cookie_is_secure(request.scheme, request.headers.get("X-Forwarded-Proto"))


async def login_form(request: web.Request, error: str | None = None, status: int = 200) -> web.Response:
    login_csrf = sessions.new_secret()
    response = render(request, "login.html", status=status, login_csrf=login_csrf, error=error)
    response.set_cookie(sessions.LOGIN_COOKIE, login_csrf, **sessions.cookie_options(_secure(request), 3600))
    return response


async def login_page(request: web.Request) -> web.Response:
    return await login_form(request)


async def login(request: web.Request) -> web.Response:
    state = request.app[STATE]
    form = await request.post()
    if not sessions.same_secret(request.cookies.get(sessions.LOGIN_COOKIE), _text(form.get("csrf"))):
        return await login_form(request, "The login form expired or did not come from this page; retry.", 403)
    token = _text(form.get("token")).strip()
    if not token:
        return await login_form(request, "token: paste an admin or reader token.", 422)
    try:
        caller = await state.verify_token(token, client_address(request))
    except Problem as problem:
        response = await login_form(request, problem.detail or problem.title, problem.status)
        response.headers.update(problem.headers)
        return response
    if caller.role not in READ:
        return await login_form(request, f"A {caller.role} token cannot open the console: use a reader, "
                                         "admin or tenant_admin token.", 403)
    session_id = sessions.new_secret()
    async with state.db.connection() as conn:
        opened = await token_store.start_session(conn, sessions.session_hash(session_id), token,
                                                 sessions.LIFETIME)
    if opened is None:
        return await login_form(request, "The token stopped being valid; use another.", 401)
    get_logger().info("console login", name=opened.name, role=opened.role)
    response = see_other("/")
    response.set_cookie(sessions.COOKIE, session_id, **sessions.cookie_options(
        _secure(request), int(sessions.LIFETIME.total_seconds())))
    response.del_cookie(sessions.LOGIN_COOKIE, path=sessions.COOKIE_PATH)
    response.del_cookie(sessions.PORTAL_COOKIE, path=sessions.COOKIE_PATH)
    return response


async def logout(request: web.Request) -> web.Response:
    async with request.app[STATE].db.connection() as conn:
        await token_store.end_session(conn, sessions.session_hash(request[SESSION]))
    if request.cookies.get(sessions.PORTAL_COOKIE):
        response = see_other("/portal-ended", notice="portal_logged_out")
    else:
        response = see_other("/login", notice="logged_out")
    response.del_cookie(sessions.COOKIE, path=sessions.COOKIE_PATH)
    return response


# --- portal links ---------------------------------------------------------------------------------


async def portal_page(request: web.Request, error: str | None = None, status: int = 200) -> web.Response:
    """What a portal link shows: a button that opens the session. Opening it on the GET would let a
    link preview (a chat's unfurler, a mail scanner) use up the one opening before the person does."""
    link = request.match_info.get("link", "")
    login_csrf = sessions.new_secret()
    response = render(request, "portal.html", status=status, login_csrf=login_csrf, link=link, error=error)
    if error is None:  # an error page has no form, and the form's cookie stays as it was
        response.set_cookie(sessions.LOGIN_COOKIE, login_csrf,
                            **sessions.cookie_options(_secure(request), 3600))
    return response


async def portal_open(request: web.Request) -> web.Response:
    state = request.app[STATE]
    form = await request.post()
    if not sessions.same_secret(request.cookies.get(sessions.LOGIN_COOKIE), _text(form.get("csrf"))):
        return await portal_page(request, "The form expired or did not come from this page; open the link "
                                          "again.", 403)
    link = _text(form.get("link")).strip()
    session_id = sessions.new_secret()

    async def lookup() -> Caller | None:
        async with state.db.connection() as conn:
            return await token_store.open_portal_link(conn, link, sessions.session_hash(session_id))

    # a wrong link counts against the address as a failed login does
    key = portal.link_hash(link) if portal.well_formed(link) else None
    verdict = await state.check_credential(client_address(request), key, lookup)
    if verdict.found is None:
        if verdict.retry_after is not None:
            response = await portal_page(request, "Too many failed attempts from this address; wait and "
                                                  "retry.", 429)
            response.headers["Retry-After"] = str(verdict.retry_after)
            return response
        return await portal_page(request, "This link is not valid: it was used already, expired, or was "
                                          "revoked.", 401)
    opened = verdict.found
    get_logger().info("console portal link opened", name=opened.name, role=opened.role,
                      tenant_id=opened.tenant_id)
    response = see_other("/")
    response.set_cookie(sessions.COOKIE, session_id, **sessions.cookie_options(
        _secure(request), int(portal.MAX_LIFETIME.total_seconds())))
    response.set_cookie(sessions.PORTAL_COOKIE, "1", **sessions.cookie_options(
        _secure(request), int(sessions.PORTAL_COOKIE_AGE.total_seconds())))
    response.del_cookie(sessions.LOGIN_COOKIE, path=sessions.COOKIE_PATH)
    return response


async def portal_ended(request: web.Request) -> web.Response:
    """Where a portal link's customer lands once the session it opened has ended: what to do next
    (ask for a new link), not the operators' token login."""
    return render(request, "portal_ended.html")


# --- pages ----------------------------------------------------------------------------------------


async def _viewer(request: web.Request) -> Caller:
    """The caller, kept to the tenant of `?tenant=NAME` as a scoped token is (the views then show
    only its rows); a scoped caller's own tenant cannot be widened."""
    caller: Caller = request[CALLER]
    name = forms.tenant_filter(request.query)
    if name is None:
        return caller
    async with request.app[STATE].db.transaction(caller) as conn:
        found = await queries.tenant_id(conn, name)
    if found is None:
        raise forms.FieldError("tenant", "no tenant with this name")
    return dataclasses.replace(caller, tenant_id=found)


async def overview(request: web.Request) -> web.Response:
    async with request.app[STATE].db.transaction(await _viewer(request)) as conn:
        facts = await queries.overview(conn)
    return render(request, "overview.html", page="overview", **facts)


async def _endpoint_filter(conn: psycopg.AsyncConnection[Any], ref: str | None) -> int | None:
    """The endpoint a page's filter names (an id, a name or tenant/name), or a FieldError saying
    why it names none."""
    if ref is None:
        return None
    found = await queries.endpoint_ref(conn, ref)
    if isinstance(found, str):
        raise forms.FieldError("endpoint", found)
    if found is None:
        raise forms.FieldError("endpoint", f"no endpoint named {wording.quoted(ref[:60])}")
    return found


async def dead_letters(request: web.Request) -> web.Response:
    filters = forms.dead_letter_filters(request.query)
    viewer = await _viewer(request)
    async with request.app[STATE].db.transaction(viewer) as conn:
        endpoint_id = await _endpoint_filter(conn, filters["endpoint"])
        rows = await queries.dead_letters(conn, {k: v for k, v in filters.items() if k != "endpoint"}
                                       | {"webhook_id": endpoint_id})
        choices = await queries.filter_choices(conn)
    return render(request, "dead_letters.html", page="dead_letters", rows=rows, filters=filters,
                  choices=choices, limit=queries.PAGE_ROWS, tenant=forms.tenant_filter(request.query))


async def replay_selected(request: web.Request) -> web.Response:
    form = request[FORM]
    ids = forms.selected_ids([_text(v) for v in form.getall("delivery_id", [])])
    # back to the list as it was filtered (the form carries the filters it was shown with)
    kept = {**forms.dead_letter_filters(form), "tenant": forms.tenant_filter(form)}
    async with request.app[STATE].db.transaction(request[CALLER]) as conn:
        replayed, of_deleted = await queries.replay(conn, ids)
    get_logger().info("console replay", name=request[CALLER].name, selected=len(ids), replayed=replayed)
    said, n = replay_notice(len(ids), replayed, of_deleted)
    return see_other("/dead-letters", **{k: v for k, v in kept.items() if v}, notice=said, n=n)


def replay_notice(selected: int, replayed: int, of_deleted: int) -> tuple[str, int]:
    """The notice after a replay, and its count: why fewer than selected went back, when they did."""
    if replayed == selected:
        return "replayed", replayed
    if replayed:
        return "replayed_some", replayed
    return ("not_replayed_deleted", of_deleted) if of_deleted else ("not_replayed", 0)


async def deliveries(request: web.Request) -> web.Response:
    """Find any delivery, whatever its status: by id, idempotency key, event type, status, endpoint, time."""
    found = forms.delivery_search(request.query)
    rows = None
    async with request.app[STATE].db.transaction(await _viewer(request)) as conn:
        choices = await queries.filter_choices(conn)
        if any(v is not None for v in found.values()):
            endpoint_id = await _endpoint_filter(conn, found["endpoint"])
            rows = await queries.search_deliveries(conn, found, endpoint_id)
    return render(request, "deliveries.html", page="deliveries", rows=rows, found=found, choices=choices,
                  statuses=forms.STATUSES, limit=queries.PAGE_ROWS, query=request.query)


async def replay_matching(request: web.Request) -> web.Response:
    """Replay every dead letter the page's filter matches, as a bulk operation the API's runner steps
    (webhooks.api_start_replay, as POST /v1/dead-letters/replay): its progress is on the Operations page."""
    form = request[FORM]
    filters = forms.dead_letter_filters(form)
    tenant = forms.tenant_filter(form)
    caller = request[CALLER]
    viewer = caller
    if tenant is not None:
        async with request.app[STATE].db.transaction(caller) as conn:
            found = await queries.tenant_id(conn, tenant)
        if found is None:
            raise forms.FieldError("tenant", "no tenant with this name")
        viewer = dataclasses.replace(caller, tenant_id=found)
    async with request.app[STATE].db.transaction(viewer) as conn:
        endpoint_id = await _endpoint_filter(conn, filters["endpoint"])
        operation_id = await queries.start_replay(
            conn, {"webhook_id": endpoint_id, "event_type": filters["event_type"],
                   "category": filters["category"]}, f"{caller.name} (console)")
    request.app[STATE].operations_wakeup.set()
    get_logger().info("console bulk replay started", name=caller.name, operation_id=operation_id)
    return see_other("/operations", notice="operation_started", id=operation_id)


async def delivery(request: web.Request) -> web.Response:
    delivery_id = forms.identifier("delivery_id", request.match_info["delivery_id"])
    async with request.app[STATE].db.transaction(request[CALLER]) as conn:
        row = await queries.delivery(conn, delivery_id)
    if row is None:
        return error_page(request, 404, "Not found", f"delivery {delivery_id}: not found")
    payload, cut = queries.payload_text(row["payload"])
    return render(request, "delivery.html", page="dead_letters", row=row, payload=payload, payload_cut=cut,
                  settled=row["status"] in ("delivered", "dead_letter"))


async def replay_one(request: web.Request) -> web.Response:
    delivery_id = forms.identifier("delivery_id", request.match_info["delivery_id"])
    async with request.app[STATE].db.transaction(request[CALLER]) as conn:
        replayed, of_deleted = await queries.replay(conn, [delivery_id])
    get_logger().info("console replay", name=request[CALLER].name, selected=1, replayed=replayed)
    said, n = replay_notice(1, replayed, of_deleted)
    return see_other(f"/deliveries/{delivery_id}", notice=said, n=n)


async def endpoints(request: web.Request) -> web.Response:
    async with request.app[STATE].db.transaction(await _viewer(request)) as conn:
        rows = await endpoint_store.summaries(conn, queries.PAGE_ROWS)
        events = await queries.endpoint_events(conn)
    return render(request, "endpoints.html", page="endpoints", rows=rows, events=events,
                  formats=BODY_FORMATS)


async def endpoint_action(request: web.Request) -> web.Response:
    endpoint_id = forms.identifier("endpoint_id", request.match_info["endpoint_id"])
    form = request[FORM]
    action = forms.endpoint_action(_text(form.get("action")))
    reason = forms.reason(_text(form.get("reason")))
    caller = request[CALLER]
    try:
        async with request.app[STATE].db.transaction(caller) as conn:
            if not await endpoint_store.stored(conn, endpoint_id):
                return error_page(request, 404, "Not found", f"endpoint {endpoint_id}: not found")
            change = await queries.endpoint_action(conn, endpoint_id, action, reason,
                                                   f"{caller.name} (console)")
    except psycopg.errors.RaiseException as exc:
        return error_page(request, 409, "The current state refuses this", str(exc.diag.message_primary))
    get_logger().info("console endpoint change", name=caller.name, endpoint_id=endpoint_id, action=action,
                      changed=change is not None)
    return see_other("/endpoints", notice="endpoint_changed" if change else "endpoint_unchanged",
                     id=endpoint_id, action=action)


async def operations(request: web.Request) -> web.Response:
    async with request.app[STATE].db.transaction(await _viewer(request)) as conn:
        rows = await queries.operations_page(conn)
    return render(request, "operations.html", page="operations", rows=rows)


async def cancel_operation(request: web.Request) -> web.Response:
    operation_id = forms.identifier("operation_id", request.match_info["operation_id"])
    caller = request[CALLER]
    async with request.app[STATE].db.transaction(caller) as conn:
        status = await queries.cancel_operation(conn, operation_id, f"{caller.name} (console)")
    if status is None:
        return error_page(request, 404, "Not found", f"operation {operation_id}: not found")
    get_logger().info("console operation cancel", name=caller.name, operation_id=operation_id, status=status)
    said = "operation_cancelled" if status == "cancelled" else "operation_finished"
    return see_other("/operations", notice=said, id=operation_id)


def add_routes(app: web.Application) -> None:
    app.router.add_get("/", overview, name="overview")
    app.router.add_get("/login", login_page)
    app.router.add_post("/login", login)
    app.router.add_post("/logout", logout)
    app.router.add_get("/portal/{link}", portal_page)
    app.router.add_post("/portal", portal_open)
    app.router.add_get("/portal-ended", portal_ended)
    app.router.add_get("/dead-letters", dead_letters)
    app.router.add_post("/dead-letters/replay", replay_selected)
    app.router.add_post("/dead-letters/replay-matching", replay_matching)
    app.router.add_get("/deliveries", deliveries)
    app.router.add_get("/deliveries/{delivery_id}", delivery)
    app.router.add_post("/deliveries/{delivery_id}/replay", replay_one)
    app.router.add_get("/endpoints", endpoints)
    app.router.add_post("/endpoints/{endpoint_id}", endpoint_action)
    app.router.add_get("/operations", operations)
    app.router.add_post("/operations/{operation_id}/cancel", cancel_operation)
    app.router.add_static("/static/", STATIC_DIR)
