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


def _queue_tuples_read(conn: psycopg.Connection) -> int:
    conn.execute("SELECT pg_stat_force_next_flush()")
    conn.execute("SELECT pg_stat_clear_snapshot()")
    return conn.execute(
        "SELECT coalesce(t.seq_tup_read, 0) + (SELECT coalesce(sum(i.idx_tup_read), 0)"
        " FROM pg_stat_user_indexes i WHERE i.relid = t.relid) FROM pg_stat_user_tables t"
        " WHERE t.relid = 'webhooks.alert_delivery_queue'::regclass").fetchone()[0]


def test_the_deliveries_of_a_page_of_messages_are_read_without_reading_the_queue(db):
    # GET /v1/messages asks for a page's deliveries at once; with many messages stored, reading the
    # queue for them took seconds. Rows in flight are found too.
    endpoint = add_endpoint(db, "http://127.0.0.1:9/page", max_in_flight=1000)
    query(db, "INSERT INTO webhooks.alert_delivery_queue (webhook_id, event_type, payload)"
              " SELECT %s, 'alert.created', jsonb_build_object('n', g) FROM generate_series(1, 3000) g",
              (endpoint,))
    in_flight = [r[0] for r in query(db, "SELECT delivery_id FROM webhooks.acquire('w', 3, 60)")]
    query(db, "UPDATE webhooks.alert_delivery_queue SET status = 'delivered', delivered_at = now(),"
              " attempts = 1 WHERE delivery_id > (SELECT max(delivery_id) - 1000"
              " FROM webhooks.alert_delivery_queue)")
    query(db, "ANALYZE webhooks.alert_delivery_queue")
    page = [r[0] for r in query(db, "SELECT message_id FROM webhooks.alert_delivery_queue"
                                    " WHERE delivery_id = ANY(%s) OR delivery_id > (SELECT"
                                    " max(delivery_id) - 7 FROM webhooks.alert_delivery_queue)",
                                (in_flight,))]
    with psycopg.connect(db, autocommit=True) as conn:
        before = _queue_tuples_read(conn)
        found = conn.execute("SELECT delivery_id, status FROM webhooks.message_deliveries"
                             " WHERE message_id = ANY(%s) ORDER BY delivery_id", (page,)).fetchall()
        read = _queue_tuples_read(conn) - before
    assert len(found) == 10 and {d for d, s in found if s == "delivering"} == set(in_flight)
    assert read <= 50, f"read {read} queue rows for a page of 10 messages"


def test_a_page_of_deliveries_is_estimated_as_the_rows_it_reads(db):
    # Joined to the one-row delivery_config (never analyzed: taken for 320 rows), a page of 1,000
    # deliveries was costed past jit_above_cost and spent 100 ms compiling a plan that ran in 2.
    endpoint = add_endpoint(db, "http://127.0.0.1:9/estimate")
    query(db, "INSERT INTO webhooks.alert_delivery_queue (webhook_id, event_type, payload)"
              " SELECT %s, 'alert.created', jsonb_build_object('n', g) FROM generate_series(1, 2000) g",
              (endpoint,))
    query(db, "ANALYZE webhooks.alert_delivery_queue")
    page = [r[0] for r in query(db, "SELECT message_id FROM webhooks.messages ORDER BY 1 DESC LIMIT 1000")]
    [[plan]] = query(db, "EXPLAIN (FORMAT JSON) SELECT * FROM webhooks.message_deliveries"
                         " WHERE message_id = ANY(%s) ORDER BY message_id, endpoint_id, delivery_id", (page,))
    assert plan[0]["Plan"]["Plan Rows"] <= 2 * len(page)
