"""The SQL functions on a real PostgreSQL: claim, finish, fencing, idempotent enqueue, release."""

import json
import threading

import psycopg
import pytest

from tests.support import HANG_SECONDS, add_endpoint, enqueue, eventually, query, worker_dsn

OK = {"outcome": "delivered", "http_status": 200, "latency_ms": 3}


def acquire(dsn, worker, batch=10, lease=30):
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute("SELECT delivery_id, lease_token, attempt FROM webhooks.acquire(%s, %s, %s)",
                           (worker, batch, lease))
        return cur.fetchall()


def finish(dsn, worker, *outcomes):
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute("SELECT delivery_id, applied, status FROM webhooks.finish(%s, %s)",
                            (worker, json.dumps(list(outcomes)))).fetchall()


def outcome(claimed, **fields):
    delivery_id, token, attempt = claimed
    return {"delivery_id": delivery_id, "lease_token": str(token), "attempt": attempt, **fields}


def row(dsn, delivery_id, columns="status, attempts"):
    return query(dsn, f"SELECT {columns} FROM webhooks.alert_delivery_queue WHERE delivery_id = %s",
                 (delivery_id,))[0]


def test_plain_insert_gets_an_idempotency_key_equal_to_its_event_id(db):
    endpoint = add_endpoint(db, "http://127.0.0.1:9/x")
    [delivery] = enqueue(db, endpoint)
    event_id, key, status = row(db, delivery, "event_id, idempotency_key, status")
    assert key == event_id and event_id.startswith("evt_") and status == "pending"


def test_claim_takes_due_rows_by_priority_then_age(db):
    endpoint = add_endpoint(db, "http://127.0.0.1:9/x")
    low = enqueue(db, endpoint, count=2)
    later = enqueue(db, endpoint, deliver_after=3600)
    query(db, "UPDATE webhooks.alert_delivery_queue SET priority = 5 WHERE delivery_id = %s RETURNING 1",
          (low[1],))
    claimed = [c[0] for c in acquire(db, "w", batch=10)]
    assert claimed == [low[1], low[0]]
    assert row(db, later[0]) == ("pending", 0)
    assert row(db, low[0]) == ("delivering", 1)  # the attempt is counted at claim time


def _health_row_writes(conn):
    conn.execute("SELECT pg_stat_force_next_flush()")
    conn.execute("SELECT pg_stat_clear_snapshot()")
    return conn.execute("SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables"
                        " WHERE relid = 'webhooks.webhook_health_metrics'::regclass").fetchone()


def test_a_claim_that_leaves_no_endpoint_waiting_keeps_the_line_and_writes_its_state_rows_heap_only(db):
    # The line (last_claimed_at, which an index is keyed on) moves only when an endpoint that may
    # send was left waiting; otherwise the state row's update is heap-only, and nothing is written
    # for an endpoint that got nothing.
    lone = add_endpoint(db, "http://127.0.0.1:9/lone", max_in_flight=2)
    enqueue(db, lone, count=4)
    with psycopg.connect(db, autocommit=True) as conn:
        def claim(batch):
            return [r[0] for r in conn.execute(
                "SELECT webhook_id FROM webhooks.acquire('w', %s, 30)", (batch,)).fetchall()]
        before = _health_row_writes(conn)
        assert claim(1) == [lone]
        assert claim(1) == [lone]
        writes = _health_row_writes(conn)
        assert (writes[0] - before[0], writes[1] - before[1]) == (2, 2), "two updates, both heap-only"
        assert claim(1) == [], "at its cap"
        assert _health_row_writes(conn) == writes, "a claim that took nothing wrote nothing"
        [[placed]] = conn.execute("SELECT last_claimed_at FROM webhooks.webhook_health_metrics"
                                  " WHERE webhook_id = %s", (lone,)).fetchall()
        assert placed is None
        # two endpoints that may send and one claim a time: the line moves, round-robin
        query(db, "UPDATE webhooks.endpoints SET max_in_flight = 100 WHERE id = %s RETURNING 1", (lone,))
        other = add_endpoint(db, "http://127.0.0.1:9/other")
        enqueue(db, other, count=3)
        assert [claim(1) for _ in range(4)] == [[lone], [other], [lone], [other]]


def test_finish_applies_under_the_same_lease(db):
    endpoint = add_endpoint(db, "http://127.0.0.1:9/x")
    enqueue(db, endpoint)
    [claimed] = acquire(db, "w")
    assert finish(db, "w", outcome(claimed, **OK)) == [(claimed[0], True, "delivered")]
    assert row(db, claimed[0], "status, delivered_at IS NOT NULL, lease_token") == ("delivered", True, None)
    log = query(db, "SELECT attempt, outcome, http_status, stale, worker_id FROM webhooks.alert_delivery_log")
    assert log == [(1, "delivered", 200, False, "w")]
    health = query(db, "SELECT total_attempts, successes, health_status FROM webhooks.webhook_health_metrics")
    assert health == [(1, 1, "healthy")]


def test_lease_fencing_a_late_finish_changes_nothing_but_is_logged_as_stale(db):
    endpoint = add_endpoint(db, "http://127.0.0.1:9/x")
    [delivery] = enqueue(db, endpoint)
    [first] = acquire(db, "worker-a", lease=1)
    # B can claim the row only once A's lease has really expired in database time.
    second = eventually(lambda: acquire(db, "worker-b", lease=60), interval=0.1,
                        message="the row is claimable again after A's lease")
    [second] = second
    assert second[0] == delivery and second[2] == 2 and second[1] != first[1]

    assert finish(db, "worker-a", outcome(first, **OK)) == [(delivery, False, "stale")]
    assert row(db, delivery, "status, attempts, locked_by") == ("delivering", 2, "worker-b")

    assert finish(db, "worker-b", outcome(second, outcome="retry", retry_after_s=60, http_status=500,
                                          failure_category="http_5xx")) == [(delivery, True, "retrying")]
    assert row(db, delivery, "status, failure_category") == ("retrying", "http_5xx")
    log = query(db, "SELECT attempt, outcome, stale, worker_id FROM webhooks.alert_delivery_log"
                    " ORDER BY log_id")
    assert log == [(1, "lease_expired", False, "worker-a"), (1, "delivered", True, "worker-a"),
                   (2, "retry", False, "worker-b")]


def test_a_finish_batch_answers_each_outcome_in_its_order_applied_or_stale(db):
    endpoint = add_endpoint(db, "http://127.0.0.1:9/x")
    enqueue(db, endpoint, count=3)
    first, second, third = sorted(acquire(db, "w", batch=3))
    # the second row's lease ends (released at a shutdown): its outcome arrives too late
    query(db, "SELECT webhooks.release('w', %s)",
          (json.dumps([{"delivery_id": second[0], "lease_token": str(second[1])}]),))

    results = finish(db, "w", outcome(third, **OK), outcome(second, **OK),
                     outcome(first, outcome="retry", retry_after_s=60, http_status=503,
                             failure_category="http_5xx"))

    assert results == [(third[0], True, "delivered"), (second[0], False, "stale"),
                       (first[0], True, "retrying")]
    statuses = [row(db, claimed[0], "status")[0] for claimed in (first, second, third)]
    assert statuses == ["retrying", "pending", "delivered"]


def test_a_finish_sent_again_after_its_answer_was_lost_is_answered_as_applied_and_written_once(db):
    # A crash or a cut connection can lose the answer to a finish the database committed; the
    # worker then sends the same batch again. It must not read as stale, log twice or count twice.
    endpoint = add_endpoint(db, "http://127.0.0.1:9/x")
    enqueue(db, endpoint, count=2)
    delivered, retried = sorted(acquire(db, "w", batch=2))
    batch = [outcome(delivered, **OK),
             outcome(retried, outcome="retry", retry_after_s=60, http_status=500,
                     failure_category="http_5xx")]
    first = finish(db, "w", *batch)
    assert first == [(delivered[0], True, "delivered"), (retried[0], True, "retrying")]

    assert finish(db, "w", *batch) == first
    log = query(db, "SELECT delivery_id, outcome, stale FROM webhooks.alert_delivery_log ORDER BY log_id")
    assert log == [(delivered[0], "delivered", False), (retried[0], "retry", False)]
    health = query(db, "SELECT total_attempts, successes FROM webhooks.webhook_health_metrics")
    assert health == [(2, 1)]
    # another worker's outcome under that lease is still a late one, not a repeat
    assert finish(db, "other", outcome(delivered, **OK)) == [(delivered[0], False, "stale")]


def test_a_lease_token_is_only_ever_held_by_a_row_in_flight(db):
    # finish() fences on the token alone: a row that is not delivering must not carry one.
    endpoint = add_endpoint(db, "http://127.0.0.1:9/x")
    [delivery] = enqueue(db, endpoint)
    acquire(db, "w", batch=1)
    with pytest.raises(psycopg.errors.CheckViolation, match="lease_token_only_while_delivering"):
        query(db, "UPDATE webhooks.alert_delivery_queue SET status = 'retrying', locked_until = NULL"
                  " WHERE delivery_id = %s", (delivery,))


def test_last_attempt_lost_to_an_expired_lease_is_a_dead_letter(db):
    endpoint = add_endpoint(db, "http://127.0.0.1:9/x", max_attempts=1)
    [delivery] = enqueue(db, endpoint)
    acquire(db, "crashed", lease=1)
    eventually(lambda: row(db, delivery, "status")[0] == "delivering" and
               query(db, "SELECT webhooks.reap_expired_leases()")[0][0] == 1,
               interval=0.1, message="the expired lease is reaped")
    assert row(db, delivery, "status, dead_letter_reason") == ("dead_letter", "lease expired")


def test_retry_past_max_attempts_is_a_dead_letter_with_every_attempt_logged(db):
    endpoint = add_endpoint(db, "http://127.0.0.1:9/x", max_attempts=2)
    [delivery] = enqueue(db, endpoint)
    fail = {"outcome": "retry", "retry_after_s": 0, "http_status": 500, "failure_category": "http_5xx"}
    [first] = acquire(db, "w")
    assert finish(db, "w", outcome(first, **fail))[0][2] == "retrying"
    [second] = acquire(db, "w")
    assert finish(db, "w", outcome(second, **fail))[0][2] == "dead_letter"
    # the outcomes carried no error text, so the reason is the bare cause
    assert row(db, delivery, "attempts, dead_letter_reason") == (2, "attempts exhausted")
    assert query(db, "SELECT attempt, outcome FROM webhooks.alert_delivery_log ORDER BY log_id") == [
        (1, "retry"), (2, "dead_letter")]
    assert query(db, "SELECT failures, consecutive_failures FROM webhooks.webhook_health_metrics") == [
        (2, 2)]


def test_a_deferral_gives_the_attempt_back(db):
    endpoint = add_endpoint(db, "http://127.0.0.1:9/x")
    [delivery] = enqueue(db, endpoint)
    [claimed] = acquire(db, "w")
    finish(db, "w", outcome(claimed, outcome="deferred", retry_after_s=30, http_status=429,
                            failure_category="rate_limited"))
    assert row(db, delivery, "status, attempts, deferrals, next_retry_at > now() + interval '25 s'") == (
        "retrying", 0, 1, True)


def test_410_dead_letters_and_disables_the_endpoint(db):
    endpoint = add_endpoint(db, "http://127.0.0.1:9/x")
    [gone, waiting] = enqueue(db, endpoint, count=2)
    [claimed, other] = acquire(db, "w")
    finish(db, "w", outcome(claimed, outcome="dead_letter", http_status=410, failure_category="http_4xx",
                            reason="HTTP 410 Gone", disable_endpoint=True))
    assert query(db, "SELECT active, disabled_reason FROM webhooks.endpoints") == [
        (False, f"HTTP 410 Gone on delivery {gone}")]
    query(db, "SELECT webhooks.release('w', %s)", (json.dumps([
        {"delivery_id": other[0], "lease_token": str(other[1])}]),))
    assert acquire(db, "w") == []  # a disabled endpoint's rows wait
    assert row(db, waiting, "status, attempts") == ("pending", 0)


def test_release_gives_the_attempt_back(db):
    endpoint = add_endpoint(db, "http://127.0.0.1:9/x")
    [delivery] = enqueue(db, endpoint)
    [claimed] = acquire(db, "w")
    released = query(db, "SELECT webhooks.release('w', %s)", (json.dumps([
        {"delivery_id": claimed[0], "lease_token": str(claimed[1])}]),))
    assert released == [(1,)]
    assert row(db, delivery, "status, attempts, lease_token") == ("pending", 0, None)
    assert query(db, "SELECT outcome FROM webhooks.alert_delivery_log") == [("released",)]


@pytest.mark.parametrize("how", ["enqueue", "on_conflict"])
def test_concurrent_duplicate_enqueue_commits_both_transactions_and_queues_one(db, how):
    endpoint = add_endpoint(db, "http://127.0.0.1:9/x")
    query(db, "CREATE TABLE app_alerts (id serial PRIMARY KEY, note text) ")
    insert = {
        "enqueue": "SELECT webhooks.enqueue(%s, 'alert.created', '{}', 'alert-42')",
        "on_conflict": "INSERT INTO webhooks.alert_delivery_queue"
                       " (webhook_id, event_type, payload, idempotency_key)"
                       " VALUES (%s, 'alert.created', '{}', 'alert-42')"
                       " ON CONFLICT (webhook_id, idempotency_key) DO NOTHING",
    }[how]
    errors = []
    second_started = threading.Event()

    def second_producer():
        try:
            with psycopg.connect(db) as conn:
                conn.execute("INSERT INTO app_alerts (note) VALUES ('second')")
                second_started.set()
                conn.execute(insert, (endpoint,))  # waits for the first transaction's key
                conn.commit()
        except Exception as exc:  # noqa: BLE001 - reported through the assertion below
            errors.append(exc)
            second_started.set()

    with psycopg.connect(db) as first:
        first.execute("INSERT INTO app_alerts (note) VALUES ('first')")
        first.execute(insert, (endpoint,))
        thread = threading.Thread(target=second_producer)
        thread.start()
        second_started.wait(HANG_SECONDS)
        # the second producer is now blocked on the same key (or about to be)
        eventually(lambda: query(db, "SELECT count(*) FROM pg_stat_activity"
                                     " WHERE wait_event_type = 'Lock'"
                                     " AND datname = current_database()")[0][0],
                   message="second producer waits on the key")
        first.commit()
    thread.join(HANG_SECONDS)
    assert errors == []
    assert query(db, "SELECT note FROM app_alerts ORDER BY id") == [("first",), ("second",)]
    assert query(db, "SELECT count(*) FROM webhooks.alert_delivery_queue") == [(1,)]
    if how == "enqueue":
        assert query(db, "SELECT webhooks.enqueue(%s, 'alert.created', '{}', 'alert-42')", (endpoint,)) == \
            query(db, "SELECT delivery_id FROM webhooks.alert_delivery_queue")


def dead_letter(dsn, endpoint, category, count=1, event_type="alert.created"):
    ids = enqueue(dsn, endpoint, count=count, event_type=event_type)
    for claimed in acquire(dsn, "w", batch=count):
        finish(dsn, "w", outcome(claimed, outcome="dead_letter", failure_category=category,
                                 http_status=400 if category == "http_4xx" else None))
    return ids


def test_filtered_replay_resets_matching_dead_letters_and_counts_them(db):
    first = add_endpoint(db, "http://127.0.0.1:9/a")
    second = add_endpoint(db, "http://127.0.0.1:9/b")
    dead_letter(db, first, "http_4xx", count=3)
    dead_letter(db, first, "internal", count=2)
    dead_letter(db, second, "http_4xx", count=4, event_type="billing.paid")

    def replay(**filters):
        names = ", ".join(f"p_{k} => %({k})s" for k in filters)
        return query(db, f"SELECT webhooks.replay_dead_letters({names})", filters)[0][0]

    assert replay(webhook_id=first, failure_category="internal") == 2
    assert replay(event_type="billing.paid", limit=3) == 3
    assert replay(event_type="billing.paid") == 1
    assert replay(until=query(db, "SELECT now() - interval '1 hour'")[0][0]) == 0
    assert replay() == 3
    assert replay() == 0
    assert query(db, "SELECT status, attempts, replays, count(*) FROM webhooks.alert_delivery_queue"
                     " GROUP BY 1, 2, 3") == [("pending", 0, 1, 9)]
    assert query(db, "SELECT count(*) FROM webhooks.alert_delivery_log WHERE outcome = 'replayed'") == [(9,)]


def test_queue_statistics_count_every_status_and_the_oldest_due_row(db):
    endpoint = add_endpoint(db, "http://127.0.0.1:9/a")
    for key in ("a", "b", "c"):
        query(db, "SELECT webhooks.enqueue(%s, 'alert.created', '{}', %s)", (endpoint, key))
    query(db, "UPDATE webhooks.alert_delivery_queue SET next_retry_at = now() - interval '90 seconds'"
              " WHERE idempotency_key = 'a'")
    query(db, "UPDATE webhooks.alert_delivery_queue SET next_retry_at = now() + interval '1 hour'"
              " WHERE idempotency_key = 'b'")
    [claimed] = acquire(db, "w", batch=1)  # the oldest due row, 'a'
    finish(db, "w", outcome(claimed, **OK))
    [claimed] = acquire(db, "w", batch=1)  # 'c', now in flight

    stats = {status: (count, age) for status, count, age in query(
        db, "SELECT status, deliveries, oldest_due_age_seconds FROM webhooks.queue_statistics")}
    assert {status: count for status, (count, _) in stats.items()} == {
        "pending": 1, "delivering": 1, "retrying": 0, "delivered": 1, "dead_letter": 0}
    assert stats["pending"][1] is None  # its one row is due in an hour
    assert stats["delivered"][1] is None and stats["retrying"][1] is None

    query(db, "UPDATE webhooks.alert_delivery_queue SET next_retry_at = now() - interval '30 seconds'"
              " WHERE idempotency_key = 'b'")
    [(sample,)] = query(db, "SELECT webhooks.queue_stats(100, '10 seconds')")
    assert sample["depth"] == {"pending": 1, "delivering": 1, "retrying": 0, "delivered": 1, "dead_letter": 0}
    assert 29 <= sample["oldest_due_age_seconds"] < 90
    # another worker asking within the interval gets nothing: one sample per interval for the fleet
    assert query(db, "SELECT webhooks.queue_stats(100, '10 seconds')") == [(None,)]


def test_lookups_by_id_by_key_and_history(db):
    first = add_endpoint(db, "http://127.0.0.1:9/a", name="first")
    second = add_endpoint(db, "http://127.0.0.1:9/b", name="second")
    query(db, "SELECT webhooks.enqueue(%s, 'alert.created', '{}', 'alert-7'),"
              " webhooks.enqueue(%s, 'alert.created', '{}', 'alert-7')", (first, second))
    [claimed] = acquire(db, "w", batch=1)
    finish(db, "w", outcome(claimed, **OK))

    by_key = query(db, "SELECT endpoint_name, status, max_attempts FROM webhooks.delivery_by_key('alert-7')")
    assert by_key == [("first", "delivered", 10), ("second", "pending", 10)]
    assert query(db, "SELECT idempotency_key, endpoint FROM webhooks.delivery(%s)", (claimed[0],)) == [
        ("alert-7", "http://127.0.0.1:9")]
    assert query(db, "SELECT attempt, outcome, http_status FROM webhooks.delivery_history(%s)",
                 (claimed[0],)) == [(1, "delivered", 200)]


def test_an_attempts_audit_row_enters_one_b_tree_the_one_a_deliverys_history_is_read_through(db):
    # every B-tree without a predicate costs each attempt's row an entry (about 70 bytes of WAL);
    # the history of a delivery is read through (delivery_id, logged_at), nothing reads log_id
    indexes = query(db, "SELECT c.relname, pg_get_indexdef(i.indexrelid) FROM pg_index i"
                        " JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_am a ON a.oid = c.relam"
                        " WHERE i.indrelid = 'webhooks.alert_delivery_log'::regclass"
                        " AND a.amname = 'btree' AND i.indpred IS NULL")
    assert [(name, definition.split(" USING ")[1]) for name, definition in indexes] == [
        ("alert_delivery_log_delivery", "btree (delivery_id, logged_at)")]


def test_an_events_deliveries_are_found_by_key_through_the_idempotency_index(db):
    first = add_endpoint(db, "http://127.0.0.1:9/a", name="first")
    second = add_endpoint(db, "http://127.0.0.1:9/b", name="second")
    query(db, "SELECT webhooks.publish('alert.created', '{}')")
    [(event_id,)] = query(db, "SELECT DISTINCT event_id FROM webhooks.alert_delivery_queue")

    by_key = "SELECT webhook_id FROM webhooks.delivery_by_key(%s, %s)"
    assert query(db, by_key, (event_id, None)) == [(first,), (second,)]
    assert query(db, by_key, (event_id, second)) == [(second,)]
    with psycopg.connect(db, autocommit=True) as conn:
        # a three-row table is read whole whatever its indexes; forbid that to see which index is used
        conn.execute("SET enable_seqscan = off")
        plan = "\n".join(r[0] for r in conn.execute(
            "EXPLAIN SELECT * FROM webhooks.delivery_by_key(%s)", (event_id,)).fetchall())
    assert "alert_delivery_queue_idempotency" in plan
    assert "webhook_id = ANY" in plan, plan


def test_dead_letters_past_the_threshold_become_an_operational_event(db):
    failing = add_endpoint(db, "http://127.0.0.1:9/a", name="failing")
    ops = add_endpoint(db, "http://127.0.0.1:9/ops", name="ops", event_types=("webhook.endpoint.*",))
    everything = add_endpoint(db, "http://127.0.0.1:9/all", name="everything")  # '*' is not enough
    query(db, "UPDATE webhooks.delivery_config SET dead_letter_alert_threshold = 3")
    enqueue(db, failing, count=4)
    for claimed in acquire(db, "w", batch=4):
        finish(db, "w", outcome(claimed, outcome="dead_letter", http_status=400, failure_category="http_4xx"))
    events = query(db, "SELECT change, reason FROM webhooks.endpoint_events WHERE webhook_id = %s",
                   (failing,))
    assert events == [("dead_letters", "3 new dead letters")]  # one finish per row: it trips at 3
    queued = query(db, "SELECT webhook_id, event_type, payload ->> 'endpoint_name'"
                       " FROM webhooks.deliveries WHERE event_type LIKE 'webhook.%%'")
    assert queued == [(ops, "webhook.endpoint.dead_letters", "failing")]
    assert everything not in [q[0] for q in queued]


def test_endpoints_at_their_cap_do_not_crowd_out_one_with_room(db):
    capped = [add_endpoint(db, f"http://127.0.0.1:9/{n}", max_in_flight=1) for n in range(2)]
    roomy = add_endpoint(db, "http://127.0.0.1:9/roomy", max_in_flight=1)
    for endpoint in (*capped, roomy):
        enqueue(db, endpoint, count=2)
    first = acquire(db, "w", batch=3)  # one row each; every endpoint is now at its cap
    assert len(first) == 3
    [roomy_row] = [c for c in first if row(db, c[0], "webhook_id")[0] == roomy]
    finish(db, "w", outcome(roomy_row, **OK))  # only the last endpoint has room again
    # Two claims of at most two endpoints each: the capped ones are looked at first, then must
    # make way, so the endpoint with room is served by the second claim at the latest.
    claimed = acquire(db, "w", batch=2) + acquire(db, "w", batch=2)
    assert [row(db, c[0], "webhook_id")[0] for c in claimed] == [roomy]


@pytest.mark.parametrize("batch", [4, 6, 9])
def test_a_claim_across_endpoints_takes_rows_by_priority_then_round_robin(db, batch):
    # the claim bounds each endpoint's candidates by the endpoints whose first row comes before
    # its second; the rows it takes must be those of the full order all the same
    urgent, plain_b, plain_c = (add_endpoint(db, f"http://127.0.0.1:9/{n}") for n in "abc")
    a = enqueue(db, urgent, count=5)
    query(db, "UPDATE webhooks.alert_delivery_queue SET priority = 9 WHERE delivery_id = ANY(%s) RETURNING 1",
          (a[:4],))
    b, c = enqueue(db, plain_b, count=5), enqueue(db, plain_c, count=5)
    # priority first (the urgent endpoint's four rows, more than a fair share of any batch here),
    # then turns, a turn's rows oldest first: a[4] is its endpoint's fifth turn
    order = [a[0], a[1], a[2], a[3], b[0], c[0], b[1], c[1], b[2], c[2], b[3], c[3], a[4]]
    claimed = [c[0] for c in acquire(db, "w", batch=batch)]
    assert sorted(claimed) == sorted(order[:batch])


def test_concurrent_partition_makers_never_wait_on_each_other(db):
    # Every worker's housekeeping keeps log partitions ahead; when the day rolls over they all
    # try to create the new one. A second creator used to take a lock on the default partition
    # and then wait for the parent: a lock-upgrade deadlock with the first. Now it steps aside.
    with psycopg.connect(db) as first:
        assert first.execute("SELECT webhooks.ensure_log_partitions(20)").fetchone()[0] > 0  # uncommitted
        with psycopg.connect(db, autocommit=True) as second:
            second.execute("SET lock_timeout = '2s'")
            assert second.execute("SELECT webhooks.ensure_log_partitions(21)").fetchone() == (0,)
        first.commit()
    assert query(db, "SELECT webhooks.ensure_log_partitions(21)") == [(1,)]


def set_ordering_key(dsn, delivery_ids, key):
    query(dsn, "UPDATE webhooks.alert_delivery_queue SET ordering_key = %s WHERE delivery_id = ANY(%s)"
               " RETURNING 1", (key, delivery_ids))


def test_claim_takes_one_row_per_ordering_key_and_the_next_once_it_is_finished(db):
    endpoint = add_endpoint(db, "http://127.0.0.1:9/x")
    first, second, third = enqueue(db, endpoint, count=3)
    [free] = enqueue(db, endpoint)
    set_ordering_key(db, [first, second, third], "order-1")
    claimed = acquire(db, "w", batch=10)
    assert [c[0] for c in claimed] == [first, free]
    assert acquire(db, "w", batch=10) == []  # `second` waits while `first` is in flight
    finish(db, "w", outcome(claimed[0], **OK))
    assert [c[0] for c in acquire(db, "w", batch=10)] == [second]


def test_a_claim_planned_once_still_takes_each_batch_by_primary_key(db):
    # acquire() keeps one generic plan per session (025): one session claims batches of different
    # sizes through it, and a row claimed by another session in between is not taken twice.
    endpoint = add_endpoint(db, "http://127.0.0.1:9/x", max_in_flight=100)
    ids = enqueue(db, endpoint, count=30)
    with psycopg.connect(db, autocommit=True) as conn:
        def claim(batch):
            return [r[0] for r in conn.execute(
                "SELECT delivery_id FROM webhooks.acquire('w', %s, 30)", (batch,)).fetchall()]
        got = [claim(n) for n in (1, 2, 3, 4, 5, 6)]
        others = [c[0] for c in acquire(db, "other", batch=5)]
        got.append(claim(100))
    assert [len(g) for g in got] == [1, 2, 3, 4, 5, 6, 4]
    taken = [d for g in got for d in g] + others
    assert sorted(taken) == ids


def next_due_in(dsn):
    return query(dsn, "SELECT webhooks.next_due_in()")[0][0]


def test_next_due_in_is_null_when_nothing_waits_and_zero_when_a_row_is_due(db):
    endpoint = add_endpoint(db, "http://127.0.0.1:9/x")
    assert next_due_in(db) is None
    enqueue(db, endpoint, deliver_after=120)
    assert 110 < next_due_in(db) <= 120
    enqueue(db, endpoint)
    assert next_due_in(db) == 0


def test_next_due_in_counts_only_the_head_of_an_ordering_key(db):
    endpoint = add_endpoint(db, "http://127.0.0.1:9/x")
    [head] = enqueue(db, endpoint, deliver_after=300)
    [behind] = enqueue(db, endpoint)  # due now, but waits for `head`
    set_ordering_key(db, [head, behind], "order-1")
    assert 290 < next_due_in(db) <= 300


def test_next_due_in_counts_a_lease_that_will_expire(db):
    endpoint = add_endpoint(db, "http://127.0.0.1:9/x")
    enqueue(db, endpoint)
    acquire(db, "w", batch=1, lease=40)
    assert 30 < next_due_in(db) <= 40


def held_back(dsn):
    return query(dsn, "SELECT webhook_id, reason, rows FROM webhooks.held_back ORDER BY webhook_id")


def test_a_row_behind_its_ordering_key_is_claimable_nowhere_and_held_back_by_nothing(db):
    # acquire(), next_due_in() and held_back read one definition of "claimable now"
    endpoint = add_endpoint(db, "http://127.0.0.1:9/x")
    [head] = enqueue(db, endpoint)
    [behind] = enqueue(db, endpoint)
    set_ordering_key(db, [head, behind], "order-1")
    assert [c[0] for c in acquire(db, "w", batch=10)] == [head]
    # `behind` is due, but not claimable while `head` is in flight: nothing is due but the lease
    assert 20 < next_due_in(db) <= 30
    assert acquire(db, "w", batch=10) == []
    assert held_back(db) == []


def test_expired_leases_and_a_lost_worker_s_rows_come_back_by_the_same_rule_with_their_cause(db):
    endpoint = add_endpoint(db, "http://127.0.0.1:9/x", max_attempts=2)
    expired, lost, lost_last = enqueue(db, endpoint, count=3)
    query(db, "UPDATE webhooks.alert_delivery_queue SET attempts = 1 WHERE delivery_id = %s RETURNING 1",
          (lost_last,))
    acquire(db, "gone", batch=3)
    query(db, "UPDATE webhooks.alert_delivery_queue SET locked_by = 'w',"
              " locked_until = now() - interval '1 s' WHERE delivery_id = %s RETURNING 1", (expired,))
    assert query(db, "SELECT webhooks.reap_expired_leases()") == [(1,)]
    assert query(db, "SELECT webhooks.reclaim_rows_of('gone')") == [(2,)]
    rows = query(db, "SELECT delivery_id, status, attempts, last_error, dead_letter_reason, failure_category,"
                     " locked_by, lease_token FROM webhooks.alert_delivery_queue ORDER BY delivery_id")
    assert rows == [
        (expired, "retrying", 1, "lease expired", None, "internal", None, None),
        (lost, "retrying", 1, "lease expired: its worker was lost", None, "internal", None, None),
        (lost_last, "dead_letter", 2, "lease expired: its worker was lost", "lease expired", "internal",
         None, None)]
    log = query(db, "SELECT delivery_id, attempt, outcome, error, worker_id, lease_token IS NOT NULL"
                    " FROM webhooks.alert_delivery_log ORDER BY delivery_id")
    assert log == [
        (expired, 1, "lease_expired", "lease expired", "w", True),
        (lost, 1, "lease_expired", "lease expired: its worker was lost (database session ended)", "gone",
         True),
        (lost_last, 2, "lease_expired",
         "lease expired on the last attempt: its worker was lost (database session ended)", "gone", True)]


def _lose_the_worker(db, worker, liveness):
    """The worker's process dies: its session ends, and the fleet's liveness check reclaims its rows."""
    liveness.close()
    # the first call that sees the lock gone marks the worker lost, the next one past the grace
    # (none here) reclaims; the server drops the lock a moment after the session closes
    eventually(lambda: query(db, "SELECT webhooks.reclaim_lost_workers(0)")[0][0] > 0,
               message=f"{worker}'s rows reclaimed")


def _expire_the_lease(db, worker, liveness):
    """The worker stalls past its lease: the next claim reaps it."""
    query(db, "UPDATE webhooks.alert_delivery_queue SET locked_until = now() - interval '1 s'"
              " WHERE locked_by = %s RETURNING 1", (worker,))


@pytest.mark.parametrize("claim_path", ["auto", "full"])
@pytest.mark.parametrize("lost", [_lose_the_worker, _expire_the_lease])
def test_rows_reclaimed_from_a_lost_worker_keep_their_place_ahead_of_the_backlog(db, lost, claim_path):
    # Under a backlog, reclaimed rows that went to the back of their endpoint's queue were resent
    # only after everything that was waiting behind them: 12.7 s later, not 1.4 s.
    endpoint = add_endpoint(db, "http://127.0.0.1:9/x", max_in_flight=10_000)
    backlog = enqueue(db, endpoint, count=2_000) + enqueue(db, endpoint, count=3_000)
    with psycopg.connect(worker_dsn(db), autocommit=True) as liveness:
        assert liveness.execute("SELECT registered FROM webhooks.register_worker('a', gen_random_uuid())"
                                ).fetchone() == (True,)
        lost_rows = sorted(c[0] for c in acquire(db, "a", batch=10))
        assert lost_rows == backlog[:10]
        lost(db, "a", liveness)
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("SELECT set_config('webhooks.claim_path', %s, false)", (claim_path,))
        claimed = [r[0] for r in conn.execute(
            "SELECT delivery_id FROM webhooks.acquire('b', 10, 30)").fetchall()]
    assert sorted(claimed) == lost_rows
    assert {row(db, d, "attempts, locked_by") for d in lost_rows} == {(2, "b")}


def test_a_worker_registered_again_gives_back_the_leases_it_does_not_hold_and_keeps_the_others(db):
    # After a failover to a standby that was behind, the new primary shows rows `delivering` under a
    # live worker that finished them on the old primary: nobody would finish them, and they filled
    # their endpoints' max_in_flight until their leases ran out.
    endpoint = add_endpoint(db, "http://127.0.0.1:9/x", max_in_flight=10)
    enqueue(db, endpoint, count=3)
    other = enqueue(db, endpoint)
    with psycopg.connect(worker_dsn(db), autocommit=True) as liveness:
        liveness.execute("SELECT registered FROM webhooks.register_worker('a', gen_random_uuid())")
        (held_id, held_token, _), (forgotten, _, _), (forgotten_too, _, _) = acquire(db, "a", batch=3)
        [(other_id, _, _)] = acquire(db, "b", batch=1)
        assert other_id == other[0]
        released = liveness.execute("SELECT webhooks.release_unheld_leases('a', %s)", ([held_token],))
        assert released.fetchone() == (2,)
    assert row(db, held_id, "status, locked_by, lease_token") == ("delivering", "a", held_token)
    assert row(db, other_id, "status, locked_by") == ("delivering", "b")  # another worker's lease
    for delivery_id in (forgotten, forgotten_too):  # as a lost worker's: the attempt counts, in its place
        assert row(db, delivery_id, "status, attempts, locked_by, last_error") == (
            "retrying", 1, None, "lease expired: its worker no longer holds it")
    assert query(db, "SELECT count(*) FROM webhooks.alert_delivery_log WHERE outcome = 'lease_expired'"
                     " AND error LIKE '%no longer holds it (its outcome was lost%'") == [(2,)]


def test_only_the_session_holding_a_worker_id_may_give_back_its_leases(db):
    endpoint = add_endpoint(db, "http://127.0.0.1:9/x", max_in_flight=10)
    enqueue(db, endpoint)
    with psycopg.connect(worker_dsn(db), autocommit=True) as liveness:
        liveness.execute("SELECT webhooks.register_worker('a', gen_random_uuid())")
        [(claimed, _, _)] = acquire(db, "a", batch=1)
        with psycopg.connect(worker_dsn(db), autocommit=True) as stranger, \
                pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match="not registered"):
            stranger.execute("SELECT webhooks.release_unheld_leases('a', '{}')")
    assert row(db, claimed, "status, locked_by") == ("delivering", "a")


def test_rows_released_at_shutdown_keep_their_place_ahead_of_the_backlog(db):
    endpoint = add_endpoint(db, "http://127.0.0.1:9/x", max_in_flight=10_000)
    backlog = enqueue(db, endpoint, count=2_000)
    claimed = acquire(db, "a", batch=5)
    assert sorted(c[0] for c in claimed) == backlog[:5]
    query(db, "SELECT webhooks.release('a', %s)", (json.dumps([
        {"delivery_id": d, "lease_token": str(t)} for d, t, _ in claimed]),))
    assert sorted(c[0] for c in acquire(db, "b", batch=5)) == backlog[:5]


def test_a_reclaimed_digest_member_claimed_before_it_was_due_is_due_now(db):
    # A failed digest goes again as one request, its members whether due or not (their jitter may
    # differ): a member lost with its worker comes back due now, not at a due time still to come.
    endpoint = add_endpoint(db, "http://127.0.0.1:9/x", max_in_flight=10)
    head, member = enqueue(db, endpoint, count=2)
    query(db, "UPDATE webhooks.alert_delivery_queue SET digest_id = nextval('webhooks.digest_id_seq'),"
              " status = 'retrying', attempts = 1 WHERE delivery_id = %s RETURNING 1", (head,))
    query(db, "UPDATE webhooks.alert_delivery_queue SET status = 'retrying', attempts = 1,"
              " next_retry_at = now() + interval '1 hour', digest_id = (SELECT digest_id FROM"
              " webhooks.alert_delivery_queue WHERE delivery_id = %s) WHERE delivery_id = %s RETURNING 1",
          (head, member))
    assert sorted(c[0] for c in acquire(db, "a", batch=1)) == [head, member]
    assert query(db, "SELECT webhooks.reclaim_rows_of('a')") == [(2,)]
    assert row(db, member, "status, next_retry_at <= now()") == ("retrying", True)


def test_functions_granted_to_a_role_run_as_the_owner_with_a_fixed_search_path(db):
    # A role without table privileges reaches the tables only through SECURITY DEFINER functions,
    # and each of those fixes its search_path so that a caller cannot substitute objects of its own.
    granted = query(db, """
        SELECT p.proname, a.grantee::regrole::text, p.prosecdef
        FROM pg_proc p, aclexplode(p.proacl) a
        WHERE p.pronamespace = 'webhooks'::regnamespace AND a.grantee <> p.proowner""")
    worker_functions = {name for name, grantee, _ in granted if grantee == "webhooks_worker"}
    assert {"acquire", "finish", "release", "register_worker", "purge"} <= worker_functions
    assert all(definer for _, grantee, definer in granted if grantee == "webhooks_worker")
    for name, config in query(db, "SELECT proname, coalesce(proconfig, '{}') FROM pg_proc"
                                  " WHERE pronamespace = 'webhooks'::regnamespace AND prosecdef"):
        assert "search_path=pg_catalog, webhooks, pg_temp" in config, name
    rows = {name: (definer, settings or []) for name, definer, settings in query(
        db, "SELECT proname, prosecdef, proconfig FROM pg_proc"
            " WHERE pronamespace = 'webhooks'::regnamespace")}
    assert "plan_cache_mode=force_generic_plan" in rows["acquire"][1]
    for name in ("acquire", "finish", "enqueue", "queue_deliveries", "expire_disabled_endpoint_rows"):
        assert "jit=off" in rows[name][1], name
    # the reserved event type check of a producer's own INSERT must see the inserting role, not the
    # owner; enqueue() runs as the owner, and the gate it calls refuses the type to a producer
    assert rows["refuse_reserved_event_type"][0] is False
    # only the worker may claim
    assert query(db, "SELECT has_function_privilege(r,"
                     " 'webhooks.acquire(text, integer, integer, text[], text[])', 'EXECUTE')"
                     " FROM unnest(ARRAY['webhooks_worker', 'webhooks_producer', 'webhooks_reader']) r") == [
        (True,), (False,), (False,)]
    # what acquire() calls keeps PostgreSQL's own choice (its LIMIT is a parameter)
    assert "plan_cache_mode=auto" in rows["reap_expired_leases"][1]


# --- the short claim (one endpoint, nothing to coalesce, no tenant limit) --------------------------


def _one_endpoint_with_rows(db, **settings):
    endpoint = add_endpoint(db, "http://127.0.0.1:9/x", **settings)
    return endpoint, enqueue(db, endpoint, count=6)


def _priorities_and_later_rows(db):
    endpoint, ids = _one_endpoint_with_rows(db, max_in_flight=100)
    query(db, "UPDATE webhooks.alert_delivery_queue SET priority = 5 WHERE delivery_id = ANY(%s) RETURNING 1",
          (ids[3:5],))
    enqueue(db, endpoint, deliver_after=3600)


def _capped_with_rows_in_flight(db):
    _one_endpoint_with_rows(db, max_in_flight=3)
    acquire(db, "earlier", batch=1)


def _at_its_cap(db):
    _one_endpoint_with_rows(db, max_in_flight=2)
    acquire(db, "earlier", batch=2)


def _rate_limited(db):
    _one_endpoint_with_rows(db, rate_limit_per_second=0.5, rate_limit_burst=2)


def _half_open_with_a_probe_answered(db):
    endpoint, _ = _one_endpoint_with_rows(db, circuit_policy={"probes": 3})
    query(db, "UPDATE webhooks.webhook_health_metrics SET circuit_state = 'half_open', probe_successes = 1"
              " WHERE webhook_id = %s RETURNING 1", (endpoint,))


def _a_failed_digest_waiting(db):
    # a digest made while the endpoint coalesced, failed, waiting to go again as one request
    _, ids = _one_endpoint_with_rows(db)
    query(db, "UPDATE webhooks.alert_delivery_queue SET digest_id = nextval('webhooks.digest_id_seq'),"
              " status = 'retrying', attempts = 1 WHERE delivery_id = ANY(%s) RETURNING 1", (ids[1:4],))
    query(db, "UPDATE webhooks.alert_delivery_queue SET digest_id = (SELECT digest_id FROM"
              " webhooks.alert_delivery_queue WHERE delivery_id = %s) WHERE delivery_id = ANY(%s)"
              " RETURNING 1", (ids[1], ids[1:4]))


def _ordering_keys_with_a_head_in_flight(db):
    _, ids = _one_endpoint_with_rows(db)
    set_ordering_key(db, ids[:3], "key-1")
    set_ordering_key(db, ids[3:5], "key-2")
    claimed = acquire(db, "earlier", batch=1)
    assert [c[0] for c in claimed] == [ids[0]]


def _rows_of_a_tenant_the_endpoint_has_left(db):
    endpoint, _ = _one_endpoint_with_rows(db)
    query(db, "SELECT webhooks.register_tenant('acme')")
    query(db, "UPDATE webhooks.endpoints SET tenant_id = webhooks.tenant_id('acme') WHERE id = %s"
              " RETURNING 1", (endpoint,))
    enqueue(db, endpoint, count=2)


def _claim_both_ways(db, batch):
    """What one claim takes and writes, by the short claim and by the full one, each rolled back."""
    seen = {}
    for path in ("auto", "full"):
        notices: list[str | None] = []
        with psycopg.connect(db) as conn:
            conn.add_notice_handler(lambda diag, said=notices: said.append(diag.message_primary))
            conn.execute("SET client_min_messages = debug1")
            conn.execute("SELECT set_config('webhooks.claim_path', %s, true)", (path,))
            cur = conn.execute("SELECT * FROM webhooks.acquire('w', %s, 30)", (batch,))
            # every column but the new lease's token and expiry, which differ by nature
            names = [c.name for c in cur.description or ()]
            rows = [tuple(v for n, v in zip(names, r, strict=True)
                          if n not in ("lease_token", "locked_until"))
                    for r in cur.fetchall()]
            state = conn.execute(
                "SELECT webhook_id, round(rate_tokens::numeric, 1), rate_refilled_at IS NOT NULL,"
                " circuit_state, probe_successes, probe_failures, last_claimed_at IS NOT NULL,"
                " updated_at = now()"
                " FROM webhooks.webhook_health_metrics ORDER BY webhook_id").fetchall()
            queue = conn.execute("SELECT delivery_id, status, attempts, digest_id, locked_by"
                                 " FROM webhooks.alert_delivery_queue ORDER BY delivery_id").fetchall()
            events = conn.execute("SELECT count(*) FROM webhooks.endpoint_events").fetchone()
            conn.rollback()
        short = any((n or "").startswith("acquire: the short claim") for n in notices)
        seen[path] = (short, rows, state, queue, events)
    return seen


@pytest.mark.parametrize("batch", [1, 2, 10])
@pytest.mark.parametrize("scenario", [
    _priorities_and_later_rows, _capped_with_rows_in_flight, _at_its_cap, _rate_limited,
    _half_open_with_a_probe_answered, _a_failed_digest_waiting, _ordering_keys_with_a_head_in_flight,
    _rows_of_a_tenant_the_endpoint_has_left,
])
def test_the_short_claim_of_one_endpoint_takes_and_writes_what_the_full_claim_does(db, scenario, batch):
    scenario(db)
    seen = _claim_both_ways(db, batch)
    (short, *by_short), (long_way, *by_full) = seen["auto"], seen["full"]
    assert short and not long_way
    assert by_short == by_full
    assert bool(by_short[0]) is (scenario is not _at_its_cap), "what the scenario leaves to claim"


def test_one_endpoint_that_coalesces_or_answers_to_tenant_limits_takes_the_full_claim(db):
    coalescing = add_endpoint(db, "http://127.0.0.1:9/c", body_format="slack")
    query(db, "UPDATE webhooks.endpoints SET coalesce_max = 5 WHERE id = %s RETURNING 1", (coalescing,))
    enqueue(db, coalescing, count=2)
    short, rows, *_ = _claim_both_ways(db, 10)["auto"]
    assert rows and not short
    query(db, "DELETE FROM webhooks.alert_delivery_queue WHERE webhook_id = %s RETURNING 1", (coalescing,))
    query(db, "SELECT webhooks.register_tenant('limited', '{\"max_in_flight\": 5}')")
    limited = add_endpoint(db, "http://127.0.0.1:9/t", tenant="limited")
    enqueue(db, limited, count=2)
    short, rows, *_ = _claim_both_ways(db, 10)["auto"]
    assert rows and not short


def _queue_tuples_read(conn):
    conn.execute("SELECT pg_stat_clear_snapshot()")
    return conn.execute(
        "SELECT coalesce(t.seq_tup_read, 0) + (SELECT coalesce(sum(i.idx_tup_read), 0)"
        " FROM pg_stat_user_indexes i WHERE i.relid = t.relid) FROM pg_stat_user_tables t"
        " WHERE t.relid = 'webhooks.alert_delivery_queue'::regclass").fetchone()[0]


@pytest.mark.parametrize("claim_path", ["auto", "full"])
def test_a_claim_and_a_finish_planned_on_an_empty_queue_read_only_their_rows_once_a_backlog_arrives(
        db, claim_path):
    # A session keeps its plans of acquire() and finish() until the queue is next analyzed. Plans
    # made while it was nearly empty once read the whole backlog that came later, on every call.
    # (One plain endpoint takes the short claim; `full` makes it take the full one.)
    with psycopg.connect(db, autocommit=True) as owner:  # no analyze, so no new plans, meanwhile
        owner.execute("ALTER TABLE webhooks.alert_delivery_queue SET (autovacuum_enabled = false)")
    endpoint = add_endpoint(db, "http://127.0.0.1:9/x", max_in_flight=1000)
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("SELECT set_config('webhooks.claim_path', %s, false)", (claim_path,))
        def claim_and_finish(batch):
            rows = conn.execute("SELECT delivery_id, lease_token, attempt FROM webhooks.acquire('w', %s, 30)",
                                (batch,)).fetchall()
            conn.execute("SELECT * FROM webhooks.finish('w', %s)",
                         (json.dumps([outcome(r, **OK) for r in rows]),)).fetchall()
            return len(rows)
        for _ in range(8):  # past the five custom plans finish() starts with: its generic plan
            enqueue(db, endpoint)
            assert claim_and_finish(1) == 1
        enqueue(db, endpoint, count=10_000)
        conn.execute("SELECT pg_stat_force_next_flush()")
        before = _queue_tuples_read(conn)
        assert claim_and_finish(100) == 100
        conn.execute("SELECT pg_stat_force_next_flush()")
        read = _queue_tuples_read(conn) - before
    assert read < 2_000, f"one claim and one finish of 100 rows read {read} rows of a 10,000-row queue"


# --- the short health update (a batch of deliveries on endpoints with nothing failing) ------------


def _as_registered(db, endpoints):
    pass


def _window_under_way(db, endpoints):
    _health(db, endpoints, "window_started_at = now() - interval '10 seconds', window_attempts = 7,"
                           " previous_attempts = 3")


def _window_past_its_width(db, endpoints):
    _health(db, endpoints, "window_started_at = now() - interval '90 seconds', window_attempts = 7,"
                           " previous_attempts = 3")


def _window_past_twice_its_width(db, endpoints):
    _health(db, endpoints, "window_started_at = now() - interval '1 day', window_attempts = 7")


def _dead_letters_one_short_of_a_notice(db, endpoints):
    _health(db, endpoints, "dead_letters_since_notice = 99")


def _disabled_while_in_flight(db, endpoints):
    query(db, "UPDATE webhooks.endpoints SET active = false WHERE id = ANY(%s) RETURNING 1", (endpoints,))


# the full statement's cases: a failure in the window, a run of failures, a half-open circuit
def _failures_in_the_window(db, endpoints):
    _health(db, endpoints, "window_started_at = now() - interval '10 seconds', window_attempts = 30,"
                           " window_failures = 17")


def _failing_for_an_hour(db, endpoints):
    _health(db, endpoints, "failing_since = now() - interval '1 hour', consecutive_failures = 4,"
                           " health_status = 'degraded'")


def _half_open(db, endpoints):
    _health(db, endpoints, "circuit_state = 'half_open', probe_successes = 1")


def _health(db, endpoints, assignments):
    query(db, f"UPDATE webhooks.webhook_health_metrics SET {assignments} WHERE webhook_id = ANY(%s)"
              " RETURNING 1", (endpoints,))


_SHORT = [_as_registered, _window_under_way, _window_past_its_width, _window_past_twice_its_width,
          _dead_letters_one_short_of_a_notice, _disabled_while_in_flight]


@pytest.mark.parametrize("failed", [False, True], ids=["delivered", "one_failed"])
@pytest.mark.parametrize("scenario", [*_SHORT, _failures_in_the_window, _failing_for_an_hour, _half_open])
def test_the_short_health_update_writes_what_the_full_one_does(db, scenario, failed):
    # Two endpoints in the same state, claimed together; in one transaction (one now()), the first
    # one's outcomes go through finish() as it chooses, the second's the long way.
    endpoints = [add_endpoint(db, "http://127.0.0.1:9/x", circuit_policy={"probes": 5}) for _ in range(2)]
    rows = {endpoint: enqueue(db, endpoint, count=3) for endpoint in endpoints}
    after_the_claim = scenario is _disabled_while_in_flight
    if not after_the_claim:
        scenario(db, endpoints)
    claimed = {c[0]: c for c in acquire(db, "w", batch=10)}
    assert len(claimed) == 6
    if after_the_claim:
        scenario(db, endpoints)
    seen = {}
    with psycopg.connect(db) as conn:
        notices: list[str | None] = []
        conn.add_notice_handler(lambda diag: notices.append(diag.message_primary))
        conn.execute("SET client_min_messages = debug1")
        for endpoint, path in zip(endpoints, ("auto", "full"), strict=True):
            conn.execute("SELECT set_config('webhooks.finish_path', %s, true)", (path,))
            outcomes = [outcome(claimed[d], **OK) for d in rows[endpoint]]
            if failed:
                outcomes[1] = outcome(claimed[rows[endpoint][1]], outcome="retry", http_status=500,
                                      failure_category="http_5xx", error="HTTP 500")
            del notices[:]
            conn.execute("SELECT * FROM webhooks.finish('w', %s)", (json.dumps(outcomes),)).fetchall()
            short = any((n or "").startswith("finish: the short health update") for n in notices)
            state = conn.execute("SELECT to_jsonb(h) - 'webhook_id' FROM webhooks.webhook_health_metrics h"
                                 " WHERE webhook_id = %s", (endpoint,)).fetchone()[0]
            events = conn.execute("SELECT count(*) FROM webhooks.endpoint_events WHERE webhook_id = %s",
                                  (endpoint,)).fetchone()[0]
            seen[path] = (short, state, events)
        conn.rollback()
    (short, *by_short), (long_way, *by_full) = seen["auto"], seen["full"]
    assert by_short == by_full
    assert not long_way
    assert short is (scenario in _SHORT and not failed)
