"""Messages: what a producer published is stored once, however many endpoints it goes to; each
delivery row keeps only its state and a pointer, and its payload reads back through
webhooks.deliveries. Retention removes a message with the last delivery that needs it."""

from __future__ import annotations

import json

import psycopg
import pytest

from tests.support import PRODUCER_LOGIN, add_endpoint, eventually, login_as, query

PAYLOAD = {"alert_id": 7, "title": "Disk almost full", "pad": "x" * 900}


def messages(db: str) -> list[tuple[int, int, str]]:
    """(message id, deliveries pointing at it, event type) of every message."""
    return query(db, "SELECT m.message_id, (SELECT count(*) FROM webhooks.alert_delivery_queue q"
                     " WHERE q.message_id = m.message_id), m.event_type FROM webhooks.messages m ORDER BY 1")


def test_an_event_fanned_out_to_five_endpoints_stores_its_payload_once(db):
    endpoints = [add_endpoint(db, f"http://127.0.0.1:9/{i}") for i in range(5)]
    assert query(db, "SELECT webhooks.publish('alert.created', %s::jsonb, 'disk-7')",
                 (json.dumps(PAYLOAD),)) == [(5,)]
    [(message, deliveries, _)] = messages(db)
    assert deliveries == 5
    rows = query(db, "SELECT webhook_id, message_id, payload, metadata, source_ref, delivery_id"
                     " FROM webhooks.alert_delivery_queue ORDER BY webhook_id")
    assert [(r[0], r[1]) for r in rows] == [(e, message) for e in endpoints]
    # the range of delivery ids retention reads to find whether any is left
    assert query(db, "SELECT first_delivery_id, last_delivery_id FROM webhooks.messages") == [
        (min(r[5] for r in rows), max(r[5] for r in rows))]
    # the delivery rows hold none of it; the view reads it back for each
    assert {r[2:5] for r in rows} == {(None, None, None)}
    assert query(db, "SELECT DISTINCT payload FROM webhooks.deliveries") == [(PAYLOAD,)]
    [(stored,)] = query(db, "SELECT sum(pg_column_size(payload)) FROM webhooks.messages")
    [(one,)] = query(db, "SELECT pg_column_size(%s::jsonb)", (json.dumps(PAYLOAD),))
    assert stored == one


def test_a_producers_retried_insert_makes_no_second_message_or_delivery(db):
    endpoint = add_endpoint(db, "http://127.0.0.1:9/x")
    producer = login_as(db, PRODUCER_LOGIN, "webhooks_producer")
    insert = ("INSERT INTO webhooks.alert_delivery_queue (webhook_id, event_type, payload, idempotency_key)"
              " VALUES (%s, 'order.paid', %s::jsonb, 'order-42') ON CONFLICT (webhook_id, idempotency_key)"
              " DO NOTHING RETURNING delivery_id")
    with psycopg.connect(producer, autocommit=True) as conn:
        first = conn.execute(insert, (endpoint, json.dumps({"order": 42}))).fetchall()
        again = conn.execute(insert, (endpoint, json.dumps({"order": 42}))).fetchall()
    assert len(first) == 1 and again == []
    assert [m[1:] for m in messages(db)] == [(1, "order.paid")]
    assert query(db, "SELECT payload FROM webhooks.deliveries") == [({"order": 42},)]


def test_enqueue_with_the_same_key_answers_the_first_delivery_and_stores_one_message(db):
    endpoint = add_endpoint(db, "http://127.0.0.1:9/x")
    call = "SELECT webhooks.enqueue(%s, 'order.paid', '{\"order\": 1}', 'k-1')"
    assert query(db, call, (endpoint,)) == query(db, call, (endpoint,))
    assert [m[1:] for m in messages(db)] == [(1, "order.paid")]


def test_an_insert_without_a_payload_is_refused_naming_the_column(db):
    endpoint = add_endpoint(db, "http://127.0.0.1:9/x")
    with pytest.raises(psycopg.errors.NotNullViolation) as refused:
        query(db, "INSERT INTO webhooks.alert_delivery_queue (webhook_id, event_type) VALUES (%s, 'a')",
              (endpoint,))
    assert refused.value.diag.column_name == "payload"
    assert messages(db) == []


def test_the_worker_sends_the_messages_payload_to_every_endpoint(db, receiver, spawn):
    endpoints = [add_endpoint(db, receiver.url(f"/{i}")) for i in range(3)]
    query(db, "SELECT webhooks.publish('alert.created', %s::jsonb)", (json.dumps(PAYLOAD),))
    spawn(db)
    eventually(lambda: len(receiver.requests) >= len(endpoints), message="every endpoint got the event")
    assert {r.path for r in receiver.requests} == {f"/{i}" for i in range(3)}
    assert all(json.loads(r.body) == PAYLOAD for r in receiver.requests)


def test_a_message_goes_with_the_last_delivery_that_needs_it(db):
    endpoints = [add_endpoint(db, f"http://127.0.0.1:9/{i}") for i in range(2)]
    query(db, "SELECT webhooks.publish('alert.created', '{\"a\": 1}')")
    lone = query(db, "SELECT webhooks.enqueue(%s, 'alert.lone', '{\"b\": 2}')", (endpoints[0],))[0][0]
    query(db, "UPDATE webhooks.alert_delivery_queue SET status = 'delivered',"
              " delivered_at = now() - interval '8 days' WHERE event_type = 'alert.created'"
              " AND webhook_id = %s", (endpoints[0],))
    query(db, "SELECT * FROM webhooks.purge(1000)")
    # the other endpoint's delivery still needs the fanned-out message
    assert [m[1:] for m in messages(db)] == [(1, "alert.created"), (1, "alert.lone")]
    query(db, "UPDATE webhooks.alert_delivery_queue SET status = 'delivered',"
              " delivered_at = now() - interval '8 days' WHERE event_type = 'alert.created'")
    query(db, "SELECT * FROM webhooks.purge(1000)")
    assert [m[1:] for m in messages(db)] == [(1, "alert.lone")]
    query(db, "UPDATE webhooks.alert_delivery_queue SET status = 'dead_letter', dead_lettered_at = now()"
              " WHERE delivery_id = %s", (lone,))
    assert query(db, "SELECT webhooks.purge_dead_letters()") == [(1,)]
    assert messages(db) == []
