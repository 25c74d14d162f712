"""Wake-ups, crash recovery, graceful shutdown, fan-out triggers and replay, with real processes."""

import signal
import time
from collections import Counter

import psycopg

from tests.receiver import Reply
from tests.support import HANG_SECONDS, add_endpoint, enqueue, eventually, query, statuses, wait_final

QUICK_LEASE = {"timeout_seconds": 1, "lease_seconds": 6}
# An idle worker's poll, long enough that a delivery well inside it was woken by NOTIFY.
LONG_POLL = 60


def listener_ready(db):
    return query(db, "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE '%%listener'"
                     " AND query LIKE 'LISTEN%%'")[0][0] == 1


def test_notify_wakes_an_idle_worker_long_before_the_poll(db, receiver, spawn):
    endpoint = add_endpoint(db, receiver.url("/wake"))
    worker = spawn(db, worker={"poll_interval_seconds": LONG_POLL})
    # Idle: its listener is up and its last statement was the look-up that precedes the 60 s wait.
    eventually(lambda: worker.logged("worker started") and listener_ready(db) and query(
        db, "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'webhook-worker worker-1'"
            " AND state = 'idle' AND query LIKE '%%next_due_in%%'")[0][0] >= 1, message="worker idle")
    inserted = time.time()
    [delivery] = enqueue(db, endpoint)
    # the claim is "long before the poll", not a speed: half the poll leaves a loaded machine room
    eventually(lambda: receiver.to("/wake"), timeout=LONG_POLL / 2, interval=0.005, message="woken by NOTIFY")
    latency = receiver.to("/wake")[0].at - inserted
    print(f"insert-to-receipt with a {LONG_POLL} s poll: {latency * 1000:.1f} ms")
    assert latency < LONG_POLL / 2
    eventually(lambda: statuses(db, [delivery])[delivery] == "delivered", message="delivered")


def count_notifications(conn, seconds=1.0):
    return sum(1 for _ in conn.notifies(timeout=seconds))


def test_one_notification_per_insert_statement_and_none_when_switched_off(db):
    endpoint = add_endpoint(db, "http://127.0.0.1:9/x")
    with psycopg.connect(db, autocommit=True) as listener:
        listener.execute("LISTEN webhooks_queue")
        enqueue(db, endpoint, count=100)
        assert count_notifications(listener) == 1
        enqueue(db, endpoint, count=1)
        enqueue(db, endpoint, count=1)
        assert count_notifications(listener) == 2
        query(db, "UPDATE webhooks.delivery_config SET notify_enabled = false")
        enqueue(db, endpoint, count=100)
        assert count_notifications(listener) == 0


def test_a_killed_worker_s_rows_are_delivered_by_another_and_last_attempts_dead_lettered(
        db, receiver, spawn):
    retried = add_endpoint(db, receiver.url("/hold-a"), max_in_flight=20)
    last_try = add_endpoint(db, receiver.url("/hold-b"), max_attempts=1, max_in_flight=20)
    receiver.script("/hold-a", Reply(hold=True))
    receiver.script("/hold-b", Reply(hold=True))
    ids_a = enqueue(db, retried, count=15)
    ids_b = enqueue(db, last_try, count=5)
    doomed = spawn(db, name="doomed", worker={"concurrency": 20}, delivery=QUICK_LEASE)
    eventually(lambda: receiver.holding >= 10 and query(
        db, "SELECT count(*) FROM webhooks.alert_delivery_queue WHERE status = 'delivering'"
            " AND locked_by = 'doomed' AND locked_until > now()")[0][0] >= 10,
        message="the receiver holds the worker's requests under a live lease")
    held = [d for d, s in statuses(db, ids_a + ids_b).items() if s == "delivering"]
    doomed.signal(signal.SIGKILL)
    killed_at = time.time()
    doomed.process.wait(10)
    receiver.script("/hold-a", Reply(200))
    receiver.release()

    spawn(db, name="rescuer", delivery=QUICK_LEASE)
    wait_final(db, ids_a + ids_b, message="every row final")
    print(f"recovered {len(held)} rows {time.time() - killed_at:.1f} s after SIGKILL (lease 6 s)")

    final = statuses(db, ids_a + ids_b)
    assert {final[d] for d in ids_a} == {"delivered"}
    assert {final[d] for d in ids_b} == {"dead_letter"}
    assert query(db, "SELECT count(*) FROM webhooks.alert_delivery_queue WHERE status = 'delivering'") == [
        (0,)]
    held_a = [d for d in held if d in ids_a]
    assert held_a
    assert set(r[0] for r in query(db, "SELECT attempts FROM webhooks.alert_delivery_queue"
                                       " WHERE delivery_id = ANY(%s)", (held_a,))) == {2}
    assert set(query(db, "SELECT dead_letter_reason, attempts FROM webhooks.alert_delivery_queue"
                         " WHERE delivery_id = ANY(%s)", (ids_b,))) == {("lease expired", 1)}
    history = query(db, "SELECT outcome, worker_id FROM webhooks.delivery_history(%s)", (held_a[0],))
    assert history == [("lease_expired", "doomed"), ("delivered", "rescuer")]


def claims_after_shutdown(worker):
    lines = [line["event"] for line in worker.log_lines()]
    after = lines[lines.index("shutdown requested: no more claims"):]
    return after.count("claimed batch")


def test_sigterm_stops_claiming_and_writes_the_outcomes_of_requests_in_flight(db, receiver, spawn):
    endpoint = add_endpoint(db, receiver.url("/held"), max_in_flight=20)
    receiver.script("/held", Reply(hold=True))
    ids = enqueue(db, endpoint, count=50)
    worker = spawn(db, worker={"concurrency": 20}, logging={"level": "debug"})
    eventually(lambda: receiver.holding == 20, message="20 requests held")
    worker.signal(signal.SIGTERM)
    eventually(lambda: worker.logged("shutdown requested: no more claims"), message="signal handled")
    receiver.release()
    assert worker.process.wait(HANG_SECONDS) == 0

    assert Counter(statuses(db, ids).values()) == {"delivered": 20, "pending": 30}
    assert query(db, "SELECT sum(attempts) FROM webhooks.alert_delivery_queue WHERE status = 'pending'") == [
        (0,)]
    assert claims_after_shutdown(worker) == 0
    assert len(receiver.to("/held")) == 20


def test_fan_out_from_an_application_table(db, receiver, spawn):
    everything = add_endpoint(db, receiver.url("/all"))
    alerts_only = add_endpoint(db, receiver.url("/alerts"), event_types=("alert.*",))
    add_endpoint(db, receiver.url("/other"), event_types=("billing.paid",))
    disabled = add_endpoint(db, receiver.url("/disabled"))
    query(db, "UPDATE webhooks.endpoints SET active = false WHERE id = %s", (disabled,))
    query(db, """
        CREATE TABLE alerts (id serial PRIMARY KEY, alert_key text, title text, kind text);
        CREATE TRIGGER alerts_webhooks AFTER INSERT ON alerts FOR EACH ROW
            EXECUTE FUNCTION webhooks.observer_queue_alert('column:kind', 'alert_key');
    """)
    query(db, "INSERT INTO alerts (alert_key, title, kind) VALUES ('disk-1', 'Disk full', 'alert.created')")
    # a rolled-back source insert enqueues nothing
    with psycopg.connect(db) as conn:
        conn.execute("INSERT INTO alerts (alert_key, title, kind) VALUES ('cpu-1', 'CPU', 'alert.created')")
        conn.rollback()
    # the application retries the same event: no second delivery, no error
    query(db, "INSERT INTO alerts (alert_key, title, kind) VALUES ('disk-1', 'Disk full', 'alert.created')")

    queued = query(db, "SELECT webhook_id, event_id, source_ref FROM webhooks.deliveries"
                       " ORDER BY webhook_id")
    assert [q[0] for q in queued] == [everything, alerts_only]
    assert queued[0][1] == queued[1][1] and queued[0][2] == "alerts:disk-1"

    spawn(db)
    eventually(lambda: len(receiver.to("/all")) == 1 and len(receiver.to("/alerts")) == 1,
               message="both subscribers received")
    [to_all], [to_alerts] = receiver.to("/all"), receiver.to("/alerts")
    assert to_all.headers["webhook-id"] == to_alerts.headers["webhook-id"] == queued[0][1]
    assert receiver.to("/other") == [] and receiver.to("/disabled") == []


def test_replay_of_a_dead_letter_is_delivered_with_the_same_webhook_id(db, receiver, spawn):
    endpoint = add_endpoint(db, receiver.url("/replay"))
    receiver.script("/replay", Reply(422), Reply(200))
    [delivery] = enqueue(db, endpoint)
    spawn(db)
    eventually(lambda: statuses(db, [delivery])[delivery] == "dead_letter", message="dead letter")
    assert query(db, "SELECT webhooks.replay(%s)", (delivery,)) == [(True,)]
    eventually(lambda: statuses(db, [delivery])[delivery] == "delivered", message="delivered on replay")

    first, second = receiver.to("/replay")
    assert first.headers["webhook-id"] == second.headers["webhook-id"]
    assert second.headers["webhook-attempt"] == "1"
    assert query(db, "SELECT attempts, replays FROM webhooks.alert_delivery_queue") == [(1, 1)]
    assert query(db, "SELECT attempt, outcome FROM webhooks.delivery_history(%s)", (delivery,)) == [
        (1, "dead_letter"), (0, "replayed"), (1, "delivered")]
    assert query(db, "SELECT webhooks.replay(%s)", (delivery,)) == [(True,)]  # delivered rows too
    assert query(db, "SELECT webhooks.replay(-1)") == [(False,)]
