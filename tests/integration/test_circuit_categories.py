"""What counts against the circuit, and a category for every dead letter."""

import json

import psycopg

from tests.receiver import Reply
from tests.support import (
    HANG_SECONDS,
    add_endpoint,
    all_final,
    drain_progress,
    enqueue,
    eventually,
    query,
    statuses,
    wait_started,
    worker_dsn,
)

FAST_RETRY = {"delays": [0.1]}
# Opens after 5 failed attempts of 5; sleeps long enough that a wrongly opened circuit shows.
TRIGGER_HAPPY = {"min_attempts": 5, "failure_ratio": 0.6, "window_seconds": 60, "sleep_seconds": 60,
                 "probes": 1}


def changes(db, endpoint):
    return [r[0] for r in query(db, "SELECT change FROM webhooks.endpoint_events WHERE webhook_id = %s"
                                    " ORDER BY id", (endpoint,))]


def circuit(db, endpoint):
    return query(db, "SELECT circuit_state FROM webhooks.webhook_health_metrics WHERE webhook_id = %s",
                 (endpoint,))[0][0]


def start(spawn, db):
    worker = spawn(db)
    wait_started([worker])
    return worker


def test_a_429_with_retry_after_pauses_the_endpoint_and_leaves_the_circuit_closed(db, receiver, spawn):
    endpoint = add_endpoint(db, receiver.url("/polite"), retry_schedule=FAST_RETRY, max_in_flight=20,
                            circuit_policy=TRIGGER_HAPPY)
    receiver.script("/polite", *[Reply(429, headers={"Retry-After": "2"})] * 20, Reply(200))
    ids = enqueue(db, endpoint, count=20)
    start(spawn, db)

    # Wait for the end either way: every row delivered, or the circuit opened (the bug). Up to 20
    # pauses of 2 s on the way, each a deferral that moves the rows.
    eventually(lambda: all_final(db, ids) or "circuit_opened" in changes(db, endpoint),
               timeout=HANG_SECONDS + 20 * 2, progress=lambda: drain_progress(db, ids),
               message="the rows delivered or the circuit opened")
    assert changes(db, endpoint) == []  # no circuit_opened, no half-open probing
    assert circuit(db, endpoint) == "closed"
    assert set(statuses(db, ids).values()) == {"delivered"}
    # each 429 was a deferral: its attempt given back, and it paused the endpoint
    deferred = query(db, "SELECT count(*) FROM webhooks.alert_delivery_log"
                         " WHERE outcome = 'deferred' AND http_status = 429")[0][0]
    assert deferred == len([r for r in receiver.to("/polite")]) - 20 >= 1
    assert query(db, "SELECT max(attempts), sum(deferrals) FROM webhooks.alert_delivery_queue") == [
        (1, deferred)]
    assert query(db, "SELECT paused_until IS NOT NULL, window_failures FROM webhooks.webhook_health_metrics"
                     " WHERE webhook_id = %s", (endpoint,)) == [(True, 0)]


def test_a_429_without_retry_after_still_opens_the_circuit(db, receiver, spawn):
    endpoint = add_endpoint(db, receiver.url("/rude"), retry_schedule=FAST_RETRY, max_attempts=50,
                            max_in_flight=20, circuit_policy=TRIGGER_HAPPY)
    receiver.script("/rude", Reply(429))
    enqueue(db, endpoint, count=10)
    start(spawn, db)
    eventually(lambda: "circuit_opened" in changes(db, endpoint), message="the circuit opened")
    assert circuit(db, endpoint) == "open"
    assert query(db, "SELECT count(*) FROM webhooks.alert_delivery_log WHERE outcome = 'deferred'") == [(0,)]


def claim_and_finish(db, endpoint, *outcomes):
    """Queue one row per outcome, claim them all and finish them with those outcomes, as webhooks_worker."""
    enqueue(db, endpoint, count=len(outcomes))
    with psycopg.connect(worker_dsn(db), autocommit=True) as conn:
        claimed = conn.execute("SELECT delivery_id, lease_token, attempt FROM webhooks.acquire('w', 100, 30)"
                               ).fetchall()
        assert len(claimed) == len(outcomes)
        conn.execute("SELECT * FROM webhooks.finish('w', %s)", (json.dumps([
            {"delivery_id": d, "lease_token": str(t), "attempt": a, **fields}
            for (d, t, a), fields in zip(claimed, outcomes, strict=True)]),))


def test_garbage_http_answers_protocol_count_against_the_circuit(db):
    assert query(db, "SELECT webhooks.availability_failure('protocol', NULL)") == [(True,)]
    endpoint = add_endpoint(db, "http://127.0.0.1:9/garbage", max_in_flight=20, circuit_policy=TRIGGER_HAPPY)
    garbage = {"outcome": "retry", "failure_category": "protocol", "retry_after_s": 0}
    claim_and_finish(db, endpoint, *[garbage] * 5)
    assert circuit(db, endpoint) == "open"
    assert changes(db, endpoint) == ["circuit_opened"]


def test_deferrals_from_429_and_503_leave_the_circuit_closed_in_finish(db):
    endpoint = add_endpoint(db, "http://127.0.0.1:9/busy", max_in_flight=20, circuit_policy=TRIGGER_HAPPY)
    too_many = {"outcome": "deferred", "http_status": 429, "failure_category": "rate_limited",
                "retry_after_s": 3}
    unavailable = {"outcome": "deferred", "http_status": 503, "failure_category": "http_5xx",
                   "retry_after_s": 3}
    claim_and_finish(db, endpoint, *[too_many] * 5, *[unavailable] * 5)
    assert circuit(db, endpoint) == "closed"
    assert changes(db, endpoint) == []
    assert query(db, "SELECT window_attempts, window_failures, paused_until > now() + interval '2 s'"
                     " FROM webhooks.webhook_health_metrics WHERE webhook_id = %s", (endpoint,)) == [
        (10, 0, True)]


def backdate_and_expire(dsn, endpoint):
    """Move the waiting rows' round of attempts 30 days back (past the retry window), then run the
    worker's housekeeping step, as webhooks_worker."""
    query(dsn, "UPDATE webhooks.alert_delivery_queue SET scheduled_at = now() - interval '30 days'"
               " WHERE webhook_id = %s AND status IN ('pending', 'retrying')", (endpoint,))
    with psycopg.connect(worker_dsn(dsn), autocommit=True) as conn:
        return conn.execute("SELECT webhooks.expire_disabled_endpoint_rows()").fetchone()[0]


def test_a_disabled_endpoint_s_expired_rows_are_dead_letters_with_category_disabled(db):
    endpoint = add_endpoint(db, "http://127.0.0.1:9/off")
    ids = enqueue(db, endpoint, count=3)
    query(db, "SELECT webhooks.disable_endpoint(%s, 'maintenance')", (endpoint,))
    assert backdate_and_expire(db, endpoint) == 3
    rows = query(db, "SELECT status, dead_letter_reason, failure_category FROM webhooks.alert_delivery_queue"
                     " WHERE delivery_id = ANY(%s)", (ids,))
    assert rows == [("dead_letter", "endpoint disabled", "disabled")] * 3
    assert query(db, "SELECT outcome, failure_category, error FROM webhooks.alert_delivery_log") == [
        ("dead_letter", "disabled", "endpoint disabled")] * 3
    # the category finds them for a replay
    assert query(db, "SELECT webhooks.replay_dead_letters(p_failure_category => 'disabled')") == [(3,)]


def test_an_interrupted_attempt_leaves_the_endpoint_s_health_and_a_half_open_circuit_alone(db):
    # a request cut off by a worker's shutdown says nothing about the receiver: not a probe that
    # succeeded (it could close a circuit on a hanging receiver), not a failure either
    endpoint = add_endpoint(db, "http://127.0.0.1:9/cut", max_in_flight=20, circuit_policy=TRIGGER_HAPPY)
    query(db, "UPDATE webhooks.webhook_health_metrics SET circuit_state = 'half_open', probe_successes = 0,"
              " probe_failures = 0 WHERE webhook_id = %s", (endpoint,))
    interrupted = {"outcome": "retry", "failure_category": "interrupted", "retry_after_s": 0,
                   "latency_ms": 2000, "error": "interrupted: the worker shut down with the request open"}
    claim_and_finish(db, endpoint, interrupted)
    assert query(db, "SELECT circuit_state, probe_successes, probe_failures, consecutive_failures,"
                     " failing_since, window_attempts FROM webhooks.webhook_health_metrics"
                     " WHERE webhook_id = %s", (endpoint,)) == [("half_open", 0, 0, 0, None, 0)]
    assert query(db, "SELECT status, attempts, failure_category FROM webhooks.alert_delivery_queue") == [
        ("retrying", 1, "interrupted")]
