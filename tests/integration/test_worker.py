"""`webhook-worker` processes against a real PostgreSQL and a real receiver on 127.0.0.1."""

import json
from collections import Counter

from tests.receiver import Reply
from tests.support import add_endpoint, enqueue, eventually, query, statuses, wait_final, wait_started
from worker.rules import signing

FAST_RETRY = {"delays": [0.2]}


def test_an_inserted_row_is_delivered_with_its_log_and_health_rows(db, receiver, spawn):
    secret = signing.generate_secret()
    endpoint = add_endpoint(db, receiver.url("/hook"), secret=secret, headers={"X-Team": "ops"})
    [delivery] = [r[0] for r in query(
        db, "INSERT INTO webhooks.alert_delivery_queue (webhook_id, event_type, payload)"
            " VALUES (%s, 'alert.created', '{\"alert_id\": 42, \"title\": \"disk full\"}')"
            " RETURNING delivery_id", (endpoint,))]
    spawn(db)
    eventually(lambda: statuses(db, [delivery])[delivery] == "delivered", message="delivered")

    [request] = receiver.to("/hook")
    key = query(db, "SELECT idempotency_key FROM webhooks.alert_delivery_queue")[0][0]
    assert json.loads(request.body) == {"alert_id": 42, "title": "disk full"}
    assert request.headers["content-type"] == "application/json"
    assert request.headers["user-agent"].startswith("webhook-worker/")
    assert request.headers["webhook-id"] == key == request.headers["idempotency-key"]
    assert request.headers["webhook-delivery-id"] == str(delivery)
    assert request.headers["webhook-attempt"] == "1"
    assert request.headers["webhook-event-type"] == "alert.created"
    assert request.headers["x-team"] == "ops"
    signing.verify(secret, request.headers, request.body)

    log = query(db, "SELECT attempt, outcome, http_status, latency_ms >= 0, stale, worker_id"
                    " FROM webhooks.alert_delivery_log")
    assert log == [(1, "delivered", 200, True, False, "worker-1")]
    health = query(db, "SELECT total_attempts, successes, failures, health_status, last_success_at"
                       " IS NOT NULL FROM webhooks.webhook_health_metrics WHERE webhook_id = %s",
                   (endpoint,))
    assert health == [(1, 1, 0, "healthy", True)]


def test_500_then_200_is_delivered_on_attempt_2_with_the_same_key(db, receiver, spawn):
    # a 1 s schedule: the default one's 5 s is pinned by tests/unit/test_classification.py
    endpoint = add_endpoint(db, receiver.url("/flaky"), retry_schedule={"delays": [1]})
    receiver.script("/flaky", Reply(500), Reply(200))
    [delivery] = enqueue(db, endpoint)
    spawn(db)
    eventually(lambda: statuses(db, [delivery])[delivery] == "delivered",
               message="delivered on the retry")

    first, second = receiver.to("/flaky")
    key = query(db, "SELECT idempotency_key FROM webhooks.alert_delivery_queue")[0][0]
    assert first.headers["webhook-id"].encode() == second.headers["webhook-id"].encode() == key.encode()
    assert (first.headers["webhook-attempt"], second.headers["webhook-attempt"]) == ("1", "2")
    assert second.at - first.at >= 1 * 0.8
    assert query(db, "SELECT attempt, outcome, http_status, failure_category"
                     " FROM webhooks.alert_delivery_log ORDER BY log_id") == [
        (1, "retry", 500, "http_5xx"), (2, "delivered", 200, None)]


def test_400_is_a_dead_letter_after_exactly_one_request(db, receiver, spawn):
    endpoint = add_endpoint(db, receiver.url("/bad"), retry_schedule=FAST_RETRY)
    sentinel_endpoint = add_endpoint(db, receiver.url("/sentinel"))
    receiver.script("/bad", Reply(400, body=b'{"error": "unknown field"}'))
    [delivery] = enqueue(db, endpoint)
    spawn(db)
    eventually(lambda: statuses(db, [delivery])[delivery] == "dead_letter", message="dead letter")
    # A sentinel due later than any (wrong) retry would be: once it arrives, nothing else will.
    [sentinel] = enqueue(db, sentinel_endpoint, deliver_after=1.0)
    eventually(lambda: statuses(db, [sentinel])[sentinel] == "delivered", message="sentinel delivered")

    assert len(receiver.to("/bad")) == 1
    assert query(db, "SELECT attempts, failure_category, last_http_status, dead_letter_reason"
                     " FROM webhooks.alert_delivery_queue WHERE delivery_id = %s", (delivery,)) == [
        (1, "http_4xx", 400, "HTTP 400")]
    assert query(db, "SELECT outcome, response_excerpt FROM webhooks.alert_delivery_log"
                     " WHERE delivery_id = %s", (delivery,)) == [
        ("dead_letter", '{"error": "unknown field"}')]


def test_exhausted_attempts_end_in_dead_letter_with_every_attempt_logged(db, receiver, spawn):
    endpoint = add_endpoint(db, receiver.url("/down"), retry_schedule=FAST_RETRY, max_attempts=3)
    receiver.script("/down", Reply(502))
    [delivery] = enqueue(db, endpoint)
    spawn(db)
    eventually(lambda: statuses(db, [delivery])[delivery] == "dead_letter", message="dead letter")

    assert len(receiver.to("/down")) == 3
    assert query(db, "SELECT attempts, dead_letter_reason FROM webhooks.alert_delivery_queue") == [
        (3, "attempts exhausted: HTTP 502")]
    assert query(db, "SELECT attempt, outcome, http_status FROM webhooks.alert_delivery_log"
                     " ORDER BY log_id") == [(1, "retry", 502), (2, "retry", 502), (3, "dead_letter", 502)]


def test_a_request_slower_than_the_timeout_is_retried_as_timeout(db, receiver, spawn):
    endpoint = add_endpoint(db, receiver.url("/slow"), retry_schedule=FAST_RETRY, timeout_ms=500)
    receiver.script("/slow", Reply(200, delay=3), Reply(200))
    [delivery] = enqueue(db, endpoint)
    spawn(db)
    eventually(lambda: statuses(db, [delivery])[delivery] == "delivered", message="delivered")
    # The first attempt ended as a timeout, so the worker did not wait for the 3 s answer; and not
    # before its 500 ms were up. (No upper bound on its latency: a loaded machine may stretch it.)
    assert query(db, "SELECT attempt, outcome, failure_category, attempt > 1 OR latency_ms >= 500"
                     " FROM webhooks.alert_delivery_log ORDER BY log_id") == [
        (1, "retry", "timeout", True), (2, "delivered", None, True)]


def test_no_transaction_or_row_lock_is_held_while_requests_are_in_flight(db, receiver, spawn):
    endpoint = add_endpoint(db, receiver.url("/hold"), max_in_flight=100)
    receiver.script("/hold", Reply(200, hold=True))
    ids = enqueue(db, endpoint, count=100)
    spawn(db, worker={"concurrency": 100}, database={"pool_max_size": 4})
    eventually(lambda: receiver.holding == 100, message="the receiver holds 100 requests")

    sessions = query(db, "SELECT state, backend_xid, backend_xmin, application_name LIKE '%% liveness'"
                         " FROM pg_stat_activity WHERE application_name LIKE 'webhook-worker%%'")
    # the pool and the listener; and the liveness connection, whose session lock marks the worker alive
    assert 1 <= sum(not liveness for *_, liveness in sessions) <= 4, sessions
    assert sum(liveness for *_, liveness in sessions) == 1, sessions
    assert all(state == "idle" for state, *_ in sessions), sessions
    assert all(xid is None and xmin is None for _, xid, xmin, _ in sessions), sessions
    # a lock held for the requests stays while the receiver holds them; the worker's periodic
    # statistics query takes share locks for its few milliseconds, so a sample may catch it once
    expected = [("advisory", "ExclusiveLock", True)]
    eventually(lambda: query(db, "SELECT l.locktype, l.mode, a.application_name LIKE '%% liveness'"
                                 " FROM pg_locks l JOIN pg_stat_activity a USING (pid)"
                                 " WHERE a.application_name LIKE 'webhook-worker%%'") == expected,
               message="only the liveness lock held while the requests are open")
    assert Counter(statuses(db, ids).values()) == {"delivering": 100}

    receiver.release()
    wait_final(db, ids, message="all delivered")
    assert Counter(statuses(db, ids).values()) == {"delivered": 100}


def test_outcomes_are_written_in_batches(db, receiver, spawn):
    endpoint = add_endpoint(db, receiver.url("/fast"), max_in_flight=100)
    ids = enqueue(db, endpoint, count=1000)
    spawn(db, worker={"concurrency": 100}, delivery={"claim_batch_size": 100, "finish_batch_size": 100})
    wait_final(db, ids, message="1000 delivered")

    # Each webhooks.finish() call is one transaction, so its log rows share one xmin.
    [(finish_calls, logged)] = query(
        db, "SELECT count(DISTINCT xmin::text), count(*) FROM webhooks.alert_delivery_log")
    print(f"batching: 1000 rows written by {finish_calls} finish calls")
    assert logged == 1000
    assert finish_calls <= 30, finish_calls
    assert len(receiver.to("/fast")) == 1000


def test_two_workers_deliver_each_row_exactly_once_and_share_the_work(db, receiver, spawn):
    endpoint = add_endpoint(db, receiver.url("/shared"), max_in_flight=100)
    receiver.script("/shared", Reply(200, delay=0.01))
    workers = [spawn(db, name=f"worker-{n}", worker={"concurrency": 50}) for n in (1, 2)]
    wait_started(workers)
    ids = enqueue(db, endpoint, count=2000)
    wait_final(db, ids, message="2000 delivered")
    sentinel_endpoint = add_endpoint(db, receiver.url("/sentinel"))
    [sentinel] = enqueue(db, sentinel_endpoint, deliver_after=0.5)
    eventually(lambda: statuses(db, [sentinel])[sentinel] == "delivered", message="sentinel")

    received = Counter(r.delivery_id for r in receiver.to("/shared"))
    assert set(received) == set(ids)
    assert set(received.values()) == {1}
    shares = dict(query(db, "SELECT worker_id, count(*) FROM webhooks.alert_delivery_log"
                            " WHERE delivery_id = ANY(%s) GROUP BY worker_id", (ids,)))
    print(f"two workers: shares {shares}, duplicates at the receiver {sum(received.values()) - len(ids)}")
    assert set(shares) == {"worker-1", "worker-2"}
    assert min(shares.values()) >= 2000 * 0.15, shares
    for worker in workers:
        assert worker.stop() == 0


def test_a_binary_error_page_is_stored_as_a_clean_excerpt(db, receiver, spawn):
    endpoint = add_endpoint(db, receiver.url("/binary"), retry_schedule=FAST_RETRY)
    receiver.script("/binary", Reply(500, body=b"\xff\xfe\x00bad\x00" * 400), Reply(200))
    [delivery] = enqueue(db, endpoint)
    spawn(db)
    eventually(lambda: statuses(db, [delivery])[delivery] == "delivered", message="delivered")
    [(excerpt, size)] = query(db, "SELECT response_excerpt, octet_length(response_excerpt)"
                                  " FROM webhooks.alert_delivery_log WHERE outcome = 'retry'")
    assert 0 < size <= 1024 and "\x00" not in excerpt and "bad" in excerpt


def test_urls_and_secrets_never_reach_logs_or_error_columns(db, receiver, spawn):
    secret = signing.generate_secret()
    failing = add_endpoint(db, receiver.url("/services/T0/B0/SECRETPATH?token=SECRETQUERY"), secret=secret,
                           retry_schedule=FAST_RETRY, max_attempts=2)
    receiver.script("/services/T0/B0/SECRETPATH", Reply(500))
    refused = add_endpoint(db, "http://127.0.0.1:1/hooks/SECRETPATH?token=SECRETQUERY",
                           retry_schedule=FAST_RETRY, max_attempts=2)
    malformed = add_endpoint(db, "http://user:SECRETPASS@[::1/SECRETPATH", retry_schedule=FAST_RETRY,
                             max_attempts=2)
    ids = [enqueue(db, e)[0] for e in (failing, refused, malformed)]
    worker = spawn(db, logging={"level": "debug"})
    wait_final(db, ids, message="all dead-lettered")
    assert set(statuses(db, ids).values()) == {"dead_letter"}

    stored = json.dumps(query(db, "SELECT q.last_error, q.dead_letter_reason, l.error, l.response_excerpt"
                                  " FROM webhooks.alert_delivery_queue q"
                                  " JOIN webhooks.alert_delivery_log l USING (delivery_id)"))
    logs = worker.log_path.read_text()
    for text in (stored, logs):
        for leak in ("SECRETPATH", "SECRETQUERY", "SECRETPASS", secret, secret.removeprefix("whsec_")):
            assert leak not in text
    assert "connection failed" in stored and "not a valid URL" in stored
    assert worker.process.poll() is None
