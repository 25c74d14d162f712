"""The event-type catalogue and test events in SQL and through their Python calls: who may read and
change the catalogue, subscriptions that match no type, a 'webhook.test' to one endpoint alone that
a worker delivers signed, and producers still unable to queue that type by any way in."""

from __future__ import annotations

import json

import psycopg
import pytest

from tests.support import (
    PRODUCER_LOGIN,
    READER_LOGIN,
    BlockingConnection,
    add_endpoint,
    api_dsn,
    eventually,
    login_as,
    query,
    statuses,
)
from worker.rules import signing
from worker.rules.event_types import EventType, EventTypeError
from worker.store import deliveries as delivery_store
from worker.store import event_types

INVOICE_SCHEMA = {"type": "object", "required": ["invoice_id"],
                  "properties": {"invoice_id": {"type": "string"}}}


def test_the_catalogue_is_listed_added_to_replaced_and_deprecated(db):
    with BlockingConnection(db) as conn:
        # the worker's own types are there from the start
        assert {t.name for t in conn.run(event_types.listing)} == {
            "webhook.test", "webhook.endpoint.disabled", "webhook.endpoint.enabled",
            "webhook.endpoint.dead_letters", "webhook.endpoint.secret_rotated", "webhook.circuit.opened",
            "webhook.circuit.closed"}
        assert conn.run(event_types.upsert, "invoice.paid", "An invoice was paid", INVOICE_SCHEMA) is True
        assert conn.run(event_types.get, "invoice.paid") == EventType(
            "invoice.paid", "An invoice was paid", INVOICE_SCHEMA, False)
        assert conn.run(event_types.upsert, "invoice.paid", "Paid in full") is False  # replaced: no schema
        assert conn.run(event_types.get, "invoice.paid") == EventType(
            "invoice.paid", "Paid in full", None, False)
        assert conn.run(event_types.deprecate, "invoice.paid") is True
        assert conn.run(event_types.get, "invoice.paid").deprecated is True
        # an upsert that says nothing of deprecation keeps it
        conn.run(event_types.upsert, "invoice.paid", "Paid in full", INVOICE_SCHEMA)
        assert conn.run(event_types.get, "invoice.paid").deprecated is True
        assert "invoice.paid" not in {t.name for t in conn.run(event_types.listing, include_deprecated=False)}
        assert conn.run(event_types.deprecate, "nothing.such") is False
        assert conn.run(event_types.get, "nothing.such") is None


def test_a_bad_name_description_or_schema_is_refused_naming_the_field_and_nothing_is_written(db):
    with BlockingConnection(db) as conn:
        for call, message in (
            (lambda: conn.run(event_types.upsert, "order.*"), "name: must not contain '*'"),
            (lambda: conn.run(event_types.upsert, "webhook.mine"), "name: types starting with 'webhook.'"),
            (lambda: conn.run(event_types.upsert, "order.created", "x" * 2001), "description: at most 2000"),
            (lambda: conn.run(event_types.upsert, "order.created", "", {"type": 7}),
             "schema: at /type: 7 is not"),
            (lambda: conn.run(event_types.deprecate, "webhook.test"), "name: types starting with 'webhook.'"),
        ):
            with pytest.raises(EventTypeError) as caught:
                call()
            assert str(caught.value).startswith(message), caught.value
    assert query(db, "SELECT count(*) FROM webhooks.event_types"
                     " WHERE NOT starts_with(name, 'webhook.')") == [(0,)]
    # SQL holds its part of the rule for whoever calls the functions directly
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        query(db, "SELECT webhooks.deprecate_event_type('webhook.test')")
    with pytest.raises(psycopg.errors.CheckViolation):
        query(db, "SELECT webhooks.upsert_event_type('order.created', '', '[1]')")


def test_every_role_reads_the_catalogue_and_only_an_admin_changes_it(db):
    query(db, "SELECT webhooks.upsert_event_type('invoice.paid', '', %s)", (json.dumps(INVOICE_SCHEMA),))
    for login, group in ((PRODUCER_LOGIN, "webhooks_producer"), (READER_LOGIN, "webhooks_reader")):
        with BlockingConnection(login_as(db, login, group)) as conn:
            assert conn.run(event_types.get, "invoice.paid").schema == INVOICE_SCHEMA
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute("SELECT webhooks.upsert_event_type('invoice.paid', 'mine')")
    for role in ("webhooks_tenant_admin", "webhooks_admin"):
        with BlockingConnection(api_dsn(db), autocommit=False) as conn:
            conn.execute(f"SET LOCAL ROLE {role}")
            conn.execute("SELECT set_config('webhooks.tenant', '1', true)")
            assert len(conn.run(event_types.listing)) == 8  # invoice.paid and the worker's seven
            if role == "webhooks_tenant_admin":
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    conn.execute("SELECT webhooks.upsert_event_type('invoice.paid', 'mine')")
            else:
                assert conn.run(event_types.upsert, "invoice.paid", "the admin's") is False
            conn.commit()
    assert query(db, "SELECT description FROM webhooks.event_types WHERE name = 'invoice.paid'") == [
        ("the admin's",)]


def test_subscriptions_that_match_no_catalogued_type_or_only_deprecated_ones_are_found(db):
    for name in ("invoice.paid", "invoice.voided", "legacy.ping"):
        query(db, "SELECT webhooks.upsert_event_type(%s)", (name,))
    query(db, "SELECT webhooks.deprecate_event_type('legacy.ping')")
    acme = query(db, "SELECT webhooks.register_tenant('acme')")[0][0]
    ours = add_endpoint(db, "http://127.0.0.1:9/a", name="ours", tenant="acme",
                        event_types=("invoice.*", "invoce.paid", "legacy.ping", "webhook.circuit.opened"))
    theirs = add_endpoint(db, "http://127.0.0.1:9/b", name="theirs", event_types=("*", "orders.*"))
    with BlockingConnection(db) as conn:
        assert conn.run(event_types.unmatched_subscriptions) == [
            {"webhook_id": ours, "endpoint_name": "ours", "pattern": "invoce.paid", "problem": "unknown"},
            {"webhook_id": ours, "endpoint_name": "ours", "pattern": "legacy.ping", "problem": "deprecated"},
            {"webhook_id": theirs, "endpoint_name": "theirs", "pattern": "orders.*", "problem": "unknown"}]
    # a tenant's administrator sees its own endpoints' only
    with BlockingConnection(api_dsn(db), autocommit=False) as conn:
        conn.execute("SET LOCAL ROLE webhooks_tenant_admin")
        conn.execute("SELECT set_config('webhooks.tenant', %s, true)", (str(acme),))
        assert [r["endpoint_name"] for r in conn.run(event_types.unmatched_subscriptions)] == ["ours", "ours"]


def test_a_test_event_goes_to_the_one_endpoint_and_is_delivered_signed(db, receiver, spawn):
    secret = signing.generate_secret()
    target = add_endpoint(db, receiver.url("/target"), name="target", secret=secret,
                          event_types=("invoice.paid",))
    bystander = add_endpoint(db, receiver.url("/bystander"), name="bystander",
                             event_types=("*", "webhook.test"))
    with BlockingConnection(db) as conn:
        delivery = conn.run(delivery_store.test_event, "target")
        assert conn.run(delivery_store.test_event, "nobody") is None
        # each call is a new event
        again = conn.run(delivery_store.test_event, str(target))
    assert delivery is not None and again is not None and again != delivery
    rows = query(db, "SELECT delivery_id, webhook_id, event_type, payload->>'endpoint', idempotency_key"
                     " FROM webhooks.deliveries ORDER BY delivery_id")
    assert [r[:4] for r in rows] == [(delivery, target, "webhook.test", "target"),
                                     (again, target, "webhook.test", "target")]
    assert rows[0][4] != rows[1][4]
    spawn(db)
    eventually(lambda: set(statuses(db, [delivery, again]).values()) == {"delivered"}, message="delivered")
    requests = receiver.to("/target")
    assert {r.delivery_id for r in requests} == {delivery, again}
    for request in requests:
        assert request.headers["webhook-event-type"] == "webhook.test"
        signing.verify(secret, request.headers, request.body)
        assert json.loads(request.body)["type"] == "webhook.test"
    assert receiver.to("/bystander") == []
    assert query(db, "SELECT outcome FROM webhooks.alert_delivery_log WHERE delivery_id = %s",
                 (delivery,)) == [("delivered",)]
    assert bystander != target


def test_producers_still_cannot_queue_a_test_event_by_any_way_in(db):
    endpoint = add_endpoint(db, "http://127.0.0.1:9/x", name="x")
    producer = login_as(db, PRODUCER_LOGIN, "webhooks_producer")
    for statement in (
        "INSERT INTO webhooks.alert_delivery_queue (webhook_id, event_type, payload)"
        f" VALUES ({endpoint}, 'webhook.test', '{{}}')",
        f"SELECT webhooks.enqueue({endpoint}, 'webhook.test', '{{}}')",
        "SELECT webhooks.publish('webhook.test', '{}')",
        "SELECT * FROM webhooks.api_publish('webhook.test', '{}', 'x')",
        "SELECT webhooks.send_test_event('x')",
    ):
        with psycopg.connect(producer, autocommit=True) as conn, pytest.raises(
                psycopg.errors.InsufficientPrivilege):
            conn.execute(statement)
    assert query(db, "SELECT count(*) FROM webhooks.alert_delivery_queue") == [(0,)]
    # the API's roles: the admins send them, the reader not
    with BlockingConnection(api_dsn(db), autocommit=False) as conn:
        conn.execute("SET LOCAL ROLE webhooks_reader")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT webhooks.send_test_event('x')")
    with BlockingConnection(api_dsn(db), autocommit=False) as conn:
        conn.execute("SET LOCAL ROLE webhooks_tenant_admin")
        conn.execute("SELECT set_config('webhooks.tenant', '1', true)")
        assert conn.execute("SELECT webhooks.send_test_event('x')")[0][0] > 0
        conn.commit()
    assert query(db, "SELECT event_type FROM webhooks.alert_delivery_queue") == [("webhook.test",)]
