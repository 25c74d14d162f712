"""Reclaiming messages: a message leaves with its last delivery however many sessions delete its
deliveries at once, a message any delivery still points at stays, and deleting sessions never
deadlock (sql/functions/retention.sql, release_messages())."""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg

from tests.support import HANG_SECONDS, add_endpoint, eventually, query
from worker import schema

# Every message no delivery points at (the reclaim's own check reads ranges; this reads them all).
ORPHANS = ("SELECT count(*) FROM webhooks.messages m WHERE NOT EXISTS"
           " (SELECT FROM webhooks.alert_delivery_queue q WHERE q.message_id = m.message_id)")
# Every delivery whose message is gone.
DANGLING = ("SELECT count(*) FROM webhooks.alert_delivery_queue q WHERE q.message_id IS NOT NULL"
            " AND NOT EXISTS (SELECT FROM webhooks.messages m WHERE m.message_id = q.message_id)")


def queue_event_due_tomorrow(db: str, endpoints: list[int], event_id: str = "evt-tomorrow") -> list[int]:
    """One event for these endpoints in one statement (one message), due tomorrow."""
    return [r[0] for r in query(
        db, "INSERT INTO webhooks.alert_delivery_queue"
            " (webhook_id, event_id, event_type, payload, next_retry_at)"
            " SELECT e, %s, 'alert.created', '{\"disk\": 91}', now() + interval '1 day'"
            " FROM unnest(%s::bigint[]) e ORDER BY e RETURNING delivery_id", (event_id, endpoints))]


def in_other_session(db: str, statement: str, params: Any = None) -> Callable[[], None]:
    """Run `statement` in a session of its own in a thread, and return once it is waiting on a lock
    or done; the returned callable joins the thread and raises what the statement raised."""
    errors: list[BaseException] = []
    started = threading.Event()
    pid: list[int] = []

    def run() -> None:
        try:
            with psycopg.connect(db, autocommit=True) as conn:
                pid.append(conn.info.backend_pid)
                started.set()
                conn.execute(statement, params)
        except BaseException as exc:  # noqa: BLE001 - handed to the test by finish()
            errors.append(exc)
            started.set()

    thread = threading.Thread(target=run)
    thread.start()
    assert started.wait(HANG_SECONDS)
    eventually(lambda: not thread.is_alive() or query(
        db, "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid[0],)) == [("Lock",)],
        message="the other session waiting on a lock or done")

    def finish() -> None:
        thread.join(HANG_SECONDS)
        assert not thread.is_alive(), "the other session never finished"
        if errors:
            raise errors[0]

    return finish


def test_two_sessions_deleting_the_two_deliveries_of_one_message_at_once_leave_no_message(db):
    endpoints = [add_endpoint(db, f"http://127.0.0.1:9/{i}") for i in range(2)]
    first, second = queue_event_due_tomorrow(db, endpoints)
    assert query(db, "SELECT count(*) FROM webhooks.messages") == [(1,)]
    with psycopg.connect(db) as session_a:
        session_a.execute("DELETE FROM webhooks.alert_delivery_queue WHERE delivery_id = %s", (first,))
        # session B deletes the other delivery while A's delete is not yet committed
        session_b = in_other_session(db, "DELETE FROM webhooks.alert_delivery_queue WHERE delivery_id = %s",
                                     (second,))
        session_a.commit()
    session_b()
    assert query(db, "SELECT count(*) FROM webhooks.alert_delivery_queue") == [(0,)]
    assert query(db, "SELECT count(*) FROM webhooks.messages") == [(0,)]


def test_an_event_queued_again_while_its_last_delivery_is_deleted_keeps_a_message_for_each_row(db):
    endpoints = [add_endpoint(db, f"http://127.0.0.1:9/{i}") for i in range(2)]
    [old] = queue_event_due_tomorrow(db, endpoints[:1])
    with psycopg.connect(db) as producer:
        # the same event (id, type, payload) for the other endpoint, in a transaction still open
        # while the old delivery, the last of its message, is deleted
        [(new,)] = producer.execute(
            "INSERT INTO webhooks.alert_delivery_queue (webhook_id, event_id, event_type, payload)"
            " VALUES (%s, 'evt-tomorrow', 'alert.created', '{\"disk\": 91}') RETURNING delivery_id",
            (endpoints[1],)).fetchall()
        deleting = in_other_session(db, "DELETE FROM webhooks.alert_delivery_queue WHERE delivery_id = %s",
                                    (old,))
        producer.commit()
    deleting()
    assert query(db, "SELECT payload FROM webhooks.deliveries WHERE delivery_id = %s", (new,)) == [
        ({"disk": 91},)]
    assert query(db, DANGLING) == [(0,)]
    query(db, "DELETE FROM webhooks.alert_delivery_queue WHERE delivery_id = %s", (new,))
    assert query(db, "SELECT count(*) FROM webhooks.messages") == [(0,)]


def test_a_message_stays_while_any_delivery_points_at_it_whatever_its_state(db):
    endpoints = [add_endpoint(db, f"http://127.0.0.1:9/{i}") for i in range(5)]
    ids = queue_event_due_tomorrow(db, endpoints)
    states = ["delivered", "pending", "retrying", "dead_letter", "delivering"]
    for delivery, state in zip(ids, states, strict=True):
        query(db, "UPDATE webhooks.alert_delivery_queue SET status = %s,"
                  " delivered_at = CASE WHEN %s = 'delivered' THEN now() - interval '8 days' END,"
                  " dead_lettered_at = CASE WHEN %s = 'dead_letter' THEN now() END,"
                  " lease_token = CASE WHEN %s = 'delivering' THEN gen_random_uuid() END,"
                  " locked_until = CASE WHEN %s = 'delivering' THEN now() + interval '1 hour' END"
                  " WHERE delivery_id = %s", (state, state, state, state, state, delivery))
    query(db, "SELECT * FROM webhooks.purge(1000)")
    for delivery in ids[1:]:
        assert query(db, "SELECT count(*) FROM webhooks.messages") == [(1,)]
        assert query(db, "SELECT payload FROM webhooks.deliveries WHERE delivery_id = %s", (delivery,)) == [
            ({"disk": 91},)]
        query(db, "DELETE FROM webhooks.alert_delivery_queue WHERE delivery_id = %s", (delivery,))
    assert query(db, "SELECT count(*) FROM webhooks.messages") == [(0,)]


def test_a_retried_insert_of_a_key_whose_row_is_being_deleted_keeps_its_payload(db):
    # The key is taken when the insert's trigger runs, so no message is made or borrowed for a row
    # that ON CONFLICT will drop; if the old row's delete commits first, the row is inserted after
    # all, carrying its payload itself.
    endpoint = add_endpoint(db, "http://127.0.0.1:9/x")
    [old] = queue_event_due_tomorrow(db, [endpoint], event_id="order-1")
    insert = ("INSERT INTO webhooks.alert_delivery_queue (webhook_id, event_id, event_type, payload)"
              " VALUES (%s, 'order-1', 'alert.created', '{\"disk\": 91}')"
              " ON CONFLICT (webhook_id, idempotency_key) DO NOTHING")
    with psycopg.connect(db) as purging:
        purging.execute("DELETE FROM webhooks.alert_delivery_queue WHERE delivery_id = %s", (old,))
        retried = in_other_session(db, insert, (endpoint,))
        purging.commit()
    retried()
    assert query(db, "SELECT payload FROM webhooks.deliveries") == [({"disk": 91},)]
    assert query(db, DANGLING) == [(0,)]
    assert query(db, "SELECT count(*) FROM webhooks.messages") == [(0,)]
    # and a retry while the row stands makes nothing
    query(db, insert, (endpoint,))
    assert query(db, "SELECT count(*) FROM webhooks.alert_delivery_queue") == [(1,)]
    assert query(db, "SELECT count(*) FROM webhooks.messages") == [(0,)]


def test_purges_racing_over_fanned_out_messages_leave_no_orphan_and_never_deadlock(db):
    # Two sessions purge small batches of delivered rows as fast as they can while a producer keeps
    # adding events for three endpoints, each delivery delivered at a random time in the past, so
    # the deliveries of one message fall into batches the two purges take at the same moment.
    endpoints = [add_endpoint(db, f"http://127.0.0.1:9/{i}") for i in range(3)]
    query(db, "UPDATE webhooks.delivery_config SET delivered_retention = interval '1 hour'")
    deadlocks = "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()"
    [(deadlocks_before,)] = query(db, deadlocks)
    events, per_statement = 600, 20
    produced = threading.Event()
    errors: list[BaseException] = []
    purged = [0, 0]

    def produce() -> None:
        rng = random.Random(7)
        try:
            with psycopg.connect(db, autocommit=True) as conn:
                for start in range(0, events, per_statement):
                    rows = [(e, f"evt-{n}", json.dumps({"n": n}), rng.uniform(2, 3))
                            for n in range(start, start + per_statement) for e in endpoints]
                    conn.execute(
                        "INSERT INTO webhooks.alert_delivery_queue"
                        " (webhook_id, event_id, event_type, payload, status, attempts, delivered_at)"
                        " SELECT r.e, r.id, 'alert.created', r.p::jsonb, 'delivered', 1,"
                        "        now() - make_interval(secs => r.h * 3600)"
                        " FROM unnest(%s::bigint[], %s::text[], %s::text[], %s::float8[]) AS r(e, id, p, h)",
                        [list(column) for column in zip(*rows, strict=True)])
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            produced.set()

    def purge(slot: int) -> None:
        try:
            with psycopg.connect(db, autocommit=True) as conn:
                while True:
                    done = produced.is_set()
                    [(rows, _, _)] = conn.execute("SELECT * FROM webhooks.purge(7)").fetchall()
                    purged[slot] += rows
                    if done and rows == 0:
                        return
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=produce)] + [
        threading.Thread(target=purge, args=(slot,)) for slot in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(HANG_SECONDS * 4)
    assert not any(thread.is_alive() for thread in threads)
    assert errors == []
    assert sum(purged) == events * len(endpoints) and min(purged) > 0
    assert query(db, "SELECT count(*) FROM webhooks.alert_delivery_queue") == [(0,)]
    assert query(db, ORPHANS) == [(0,)]
    assert query(db, deadlocks) == [(deadlocks_before,)]


def test_a_message_spans_fewer_than_a_thousand_delivery_ids_however_an_insert_orders_its_rows(db):
    # Reclaiming reads a message's range through the queue's primary key: an INSERT that queues
    # each event to one endpoint after another (the rows of one event 1,200 ids apart) gets more
    # messages, never a range the reclaim would have to read for long.
    endpoints = [add_endpoint(db, f"http://127.0.0.1:9/{i}") for i in range(2)]
    query(db, "INSERT INTO webhooks.alert_delivery_queue (webhook_id, event_id, event_type, payload)"
              " SELECT e, 'evt-' || n, 'alert.created', jsonb_build_object('n', n)"
              " FROM unnest(%s::bigint[]) e, generate_series(1, 1200) n ORDER BY e, n", (endpoints,))
    [(widest, count)] = query(db, "SELECT max(last_delivery_id - first_delivery_id), count(*)"
                                  " FROM webhooks.messages")
    assert widest < 1000 and count == 2400
    # the same rows in event order share a message per event
    query(db, "DELETE FROM webhooks.alert_delivery_queue")
    assert query(db, "SELECT count(*) FROM webhooks.messages") == [(0,)]
    query(db, "INSERT INTO webhooks.alert_delivery_queue (webhook_id, event_id, event_type, payload)"
              " SELECT e, 'evt-' || n, 'alert.created', jsonb_build_object('n', n)"
              " FROM unnest(%s::bigint[]) e, generate_series(1, 1200) n ORDER BY n, e", (endpoints,))
    assert query(db, "SELECT max(last_delivery_id - first_delivery_id), count(*) FROM webhooks.messages") == [
        (1, 1200)]


def test_two_workers_purging_fanned_out_messages_at_a_steady_rate_leave_no_orphan_and_no_deadlock(
        db, receiver, spawn):
    # The workers' own housekeeping, as deployed, with a retention short enough and batches small
    # enough that both purge deliveries of the same messages at once while the producer goes on.
    endpoints = [add_endpoint(db, receiver.url(f"/{i}")) for i in range(3)]
    query(db, "UPDATE webhooks.delivery_config SET delivered_retention = interval '0.3 seconds'")
    deadlocks = "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()"
    [(deadlocks_before,)] = query(db, deadlocks)
    workers = [spawn(db, housekeeping={"interval_seconds": 0.2, "purge_batch_size": 5}) for _ in range(2)]
    events, rate = 240, 60.0
    with psycopg.connect(db, autocommit=True) as producer:
        started = time.monotonic()
        for n in range(events):
            time.sleep(max(0.0, started + n / rate - time.monotonic()))
            producer.execute("SELECT webhooks.publish('alert.created', %s::jsonb)", (json.dumps({"n": n}),))
    sizes = []

    def emptied() -> bool:
        [(rows, messages)] = query(db, "SELECT (SELECT count(*) FROM webhooks.alert_delivery_queue),"
                                       " (SELECT count(*) FROM webhooks.messages)")
        sizes.append(messages)
        return len(receiver.requests) >= events * len(endpoints) and rows == 0 and messages == 0

    eventually(emptied, progress=lambda: (len(receiver.requests), sizes[-1] if sizes else None),
               message="every event delivered and purged, with its message")
    assert query(db, ORPHANS) == [(0,)]
    assert query(db, deadlocks) == [(deadlocks_before,)]
    purged = [sum(int(line.get("purged_delivered", 0)) for line in w.log_lines()) for w in workers]
    assert sum(purged) == events * len(endpoints) and min(purged) > 0, purged
    assert not any(w.logged("housekeeping failed") for w in workers)  # a deadlock fails a round


def test_a_message_made_for_a_row_that_lost_a_key_race_is_swept_once_its_transaction_ended(db):
    # Two producers insert the same key at once: the second's insert trigger runs before the first
    # commits, makes a message, and then ON CONFLICT DO NOTHING skips the row. No delivery ever
    # points at that message; retention's sweep (purge()) deletes it, and nothing else.
    endpoint = add_endpoint(db, "http://127.0.0.1:9/x")
    insert = ("INSERT INTO webhooks.alert_delivery_queue (webhook_id, event_type, payload, idempotency_key)"
              " VALUES (%s, 'order.paid', %s::jsonb, 'order-42') ON CONFLICT (webhook_id, idempotency_key)"
              " DO NOTHING")
    queue_event_due_tomorrow(db, [endpoint], event_id="evt-other")
    with psycopg.connect(db) as first:
        first.execute(insert, (endpoint, '{"try": 1}'))
        second = in_other_session(db, insert, (endpoint, '{"try": 2}'))
        first.commit()
    second()
    assert query(db, ORPHANS) == [(1,)]
    for _ in range(4):  # the sweep's bound, then the transaction id after it, then the sweep
        query(db, "SELECT * FROM webhooks.purge(1000)")
    assert query(db, ORPHANS) == [(0,)]
    assert query(db, "SELECT payload FROM webhooks.deliveries ORDER BY delivery_id") == [
        ({"disk": 91},), ({"try": 1},)]
    assert query(db, "SELECT count(*) FROM webhooks.messages") == [(2,)]
    # every message of an ended transaction has been looked at once; the next ones will be
    assert query(db, "SELECT swept_through >= (SELECT max(message_id) FROM webhooks.messages)"
                     " FROM webhooks.message_sweep") == [(True,)]


def test_migrating_gives_each_stored_message_its_range_and_deletes_the_orphans_the_count_left(db):
    # The database as the counting release left it: messages without ranges, two of them pointed
    # at by no delivery (left behind by concurrent purges), migration 025 not yet applied.
    endpoints = [add_endpoint(db, f"http://127.0.0.1:9/{i}") for i in range(2)]
    for n in range(3):
        query(db, "SELECT webhooks.publish('alert.created', %s::jsonb)", (json.dumps({"n": n}),))
    stored = "SELECT message_id, first_delivery_id, last_delivery_id FROM webhooks.messages ORDER BY 1"
    ranges = query(db, stored)
    query(db, "INSERT INTO webhooks.messages (event_id, event_type, payload)"
              " SELECT 'evt-left-' || n, 'alert.created', '{}' FROM generate_series(1, 2) n")
    # that release had no table triggers, whose summary reads the ranges
    query(db, "DROP VIEW webhooks.table_trigger_summary CASCADE")
    query(db, "ALTER TABLE webhooks.messages DROP COLUMN first_delivery_id, DROP COLUMN last_delivery_id")
    query(db, "DROP TABLE webhooks.message_sweep")
    query(db, "DELETE FROM webhooks.schema_migrations WHERE name = 'message_reclaim'")
    notices: list[str] = []
    assert schema.migrate(db, on_notice=notices.append) == ["migrations/025_message_reclaim.sql"]
    assert notices == ["deleted 2 message(s) no delivery pointed at (left by concurrent purges)"]
    assert query(db, stored) == ranges
    assert len(ranges) == 3 and all(last - first == len(endpoints) - 1 for _, first, last in ranges)
    assert query(db, ORPHANS) == [(0,)]
    # and the reclaim goes on from there
    query(db, "DELETE FROM webhooks.alert_delivery_queue")
    assert query(db, "SELECT count(*) FROM webhooks.messages") == [(0,)]
