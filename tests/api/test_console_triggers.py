"""The console's Triggers page: each table trigger with its table, ops, deliveries in the last hour and
its running backfill's progress; an admin invokes one with the CSRF-checked form; a tenant's
administrator sees its tenant's and invokes nothing; a reader is refused; a backfill is cancelled from
the Operations page."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from markupsafe import escape

from tests.api.console_client import Browserless, ConsoleServer
from tests.api.server import api_config, make_token
from tests.api.test_console import logged_in
from tests.support import add_endpoint, eventually, query

ORDERS = "CREATE TABLE public.orders (id bigint PRIMARY KEY, tenant text, status text)"


@pytest.fixture
def console(db: str) -> Iterator[ConsoleServer]:
    server = ConsoleServer(api_config(db)).start()
    yield server
    server.stop()


def setup_triggers(db: str) -> int:
    """Two triggers (the default tenant's, acme's), rows queued by one, and a slow backfill of it left
    running after its first step: the backfill's operation id."""
    query(db, "SELECT webhooks.register_tenant('acme')")
    add_endpoint(db, "http://127.0.0.1:9/o", event_types=("order.*",))
    query(db, ORDERS)
    # the console invokes as webhooks_admin, which must be able to read the rows it sends
    query(db, "GRANT SELECT ON public.orders TO webhooks_admin")
    query(db, "SELECT webhooks.table_trigger_add('orders', 'public.orders', ARRAY['insert', 'update'],"
              " 'order.changed', p_when => 'status <> ''draft''')")
    query(db, "SELECT webhooks.table_trigger_add('acme-orders', 'public.orders', ARRAY['delete'],"
              " 'order.gone', p_tenant => 'acme')")
    query(db, "INSERT INTO public.orders (id, status) SELECT n, 'new' FROM generate_series(1, 3) n")
    [(backfill,)] = query(db, "SELECT webhooks.table_trigger_backfill('orders', p_rate => 0.01)")
    eventually(lambda: query(db, "SELECT processed FROM webhooks.api_operations WHERE id = %s",
                             (backfill,))[0][0], message="the backfill's first step")
    return backfill


def test_the_page_shows_each_trigger_and_an_admin_invokes_one_with_the_csrf_checked_form(console, db):
    backfill = setup_triggers(db)
    admin = logged_in(console, db, "admin")
    page = admin.get("/console/triggers")
    assert page.status == 200
    html = page.body.decode()
    assert '<th scope="row">orders</th>' in html and '<th scope="row">acme-orders</th>' in html
    assert "public.orders" in html and "insert, update" in html
    assert str(escape("when (status <> 'draft'::text)")) in html
    assert "<td>4</td>" in html  # 3 inserts and the backfill's first row, in the last hour
    assert f'<a href="/console/operations">#{backfill}</a> running: 1 queued, 1 read' in html
    assert 'href="/console/triggers" aria-current="page">Triggers</a>' in html
    # invoke: the CSRF token is checked, the row is queued as op manual
    assert admin.post("/console/triggers/orders/invoke", {"key": "2"}).status == 403
    answer = admin.post("/console/triggers/orders/invoke",
                        {"csrf": admin.csrf("/console/triggers"), "key": "2"})
    assert answer.status == 303, answer.body
    assert answer.headers["location"] == "/console/triggers?notice=trigger_invoked&n=1"
    notice = admin.get(answer.headers["location"]).body.decode()
    assert "The row is queued now, as op manual: 1 delivery(ies)." in notice
    manual = "SELECT payload -> 'key' FROM webhooks.deliveries WHERE payload ->> 'op' = 'manual'"
    assert query(db, manual) == [({"id": 2},)]
    # a key with no row, or not a key of its type, is refused in the database's words, nothing queued
    missing = admin.post("/console/triggers/orders/invoke", {"csrf": admin.csrf(), "key": "99"})
    assert missing.status == 404
    said = 'table trigger orders: public.orders has no row with key "99"'
    assert str(escape(said)) in missing.body.decode()
    wrong = admin.post("/console/triggers/orders/invoke", {"csrf": admin.csrf(), "key": "forty-two"})
    assert wrong.status == 422 and 'value="forty-two"' in wrong.body.decode()
    empty = admin.post("/console/triggers/orders/invoke", {"csrf": admin.csrf(), "key": " "})
    assert empty.status == 422
    assert len(query(db, manual)) == 1
    # the running backfill is on the Operations page, and cancelled there
    operations = admin.get("/console/operations").body.decode()
    assert 'backfill of <a href="/console/triggers">orders</a>' in operations
    cancelled = admin.post(f"/console/operations/{backfill}/cancel", {"csrf": admin.csrf()})
    assert cancelled.status == 303
    assert query(db, "SELECT status FROM webhooks.api_operations WHERE id = %s", (backfill,)) == [
        ("cancelled",)]
    assert f"#{backfill}</a> cancelled" in admin.get("/console/triggers").body.decode()


def test_a_tenants_administrator_sees_its_tenants_triggers_and_a_reader_none(console, db):
    setup_triggers(db)
    acme = Browserless(console)
    assert acme.login(make_token(db, "tenant_admin", tenant="acme")).status == 303
    html = acme.get("/console/triggers").body.decode()
    assert '<th scope="row">acme-orders</th>' in html and '<th scope="row">orders</th>' not in html
    assert "Invoke" not in html
    refused = acme.post("/console/triggers/acme-orders/invoke", {"csrf": acme.csrf(), "key": "1"})
    assert refused.status == 403 and "not invoke them" in refused.body.decode()
    reader = logged_in(console, db, "reader")
    refused = reader.get("/console/triggers")
    assert refused.status == 403 and "role reader may not see table triggers" in refused.body.decode()
    assert "/console/triggers" not in reader.get("/console/").body.decode()
