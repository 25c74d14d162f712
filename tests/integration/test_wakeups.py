"""NOTIFY storms: anyone who can connect can NOTIFY, and must not make workers spin."""

import time

import psycopg

from tests.support import LOGIN_PASSWORD, add_endpoint, enqueue, eventually, query, statuses
from worker.localpg import role_dsn
from worker.store.queue import NOTIFY_CHANNEL

NOTIFY_ONLY = "webhooks_test_connect_only"
NOTIFICATIONS = 150
# The worker's poll, long enough that a delivery well inside it was woken by NOTIFY.
LONG_POLL = 60


def claims(worker) -> int:
    """Claims made so far: at debug level the worker logs each one, empty or not."""
    return sum(1 for line in worker.log_lines() if line.get("event") == "claimed batch")


def idle(db, worker) -> bool:
    return worker.logged("worker started") and query(
        db, "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'webhook-worker worker-1'"
            " AND state = 'idle' AND query LIKE '%%next_due_in%%'")[0][0] >= 1 and query(
        db, "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE '%%listener'"
            " AND query LIKE 'LISTEN%%'")[0][0] == 1


def test_a_notify_storm_from_a_role_with_only_connect_costs_a_few_claims(db, receiver, spawn):
    query(db, f"DO $$ BEGIN CREATE ROLE {NOTIFY_ONLY} LOGIN PASSWORD '{LOGIN_PASSWORD}';"
              " EXCEPTION WHEN duplicate_object THEN NULL; END $$")
    attacker = role_dsn(db, NOTIFY_ONLY, LOGIN_PASSWORD)
    endpoint = add_endpoint(db, receiver.url("/after-storm"))
    worker = spawn(db, worker={"poll_interval_seconds": LONG_POLL}, logging={"level": "debug"})
    eventually(lambda: idle(db, worker), message="worker idle")
    before = claims(worker)

    with psycopg.connect(attacker, autocommit=True) as conn:
        # CONNECT and nothing else: the queue is out of reach, NOTIFY is not
        try:
            conn.execute("SELECT 1 FROM webhooks.alert_delivery_queue LIMIT 1")
            raise AssertionError("the connect-only role can read the queue")
        except psycopg.errors.InsufficientPrivilege:
            pass
        started = time.monotonic()
        for _ in range(NOTIFICATIONS):  # bounded: 150 NOTIFYs, each its own transaction, ~1.5 s
            conn.execute(f"NOTIFY {NOTIFY_CHANNEL}")
            time.sleep(0.01)
        storm_seconds = time.monotonic() - started

    # settled: no claim for longer than the longest hold (0.25 s) plus a margin
    seen = -1

    def settled() -> bool:
        nonlocal seen
        previous, seen = seen, claims(worker)
        return previous == seen

    eventually(settled, interval=0.6, message="no more claims")
    made = claims(worker) - before
    print(f"{NOTIFICATIONS} NOTIFYs over {storm_seconds:.2f} s: {made} claims")
    assert made <= 25

    # and an insert still wakes it at once, long before the poll (half of it leaves a loaded
    # machine room: the claim is NOTIFY against the poll, not a speed)
    inserted = time.time()
    [delivery] = enqueue(db, endpoint)
    eventually(lambda: statuses(db, [delivery])[delivery] == "delivered", timeout=LONG_POLL / 2,
               message="delivered")
    assert receiver.to("/after-storm")[0].at - inserted < LONG_POLL / 2
