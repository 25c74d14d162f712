"""Alert storms coalesced into digests: the claim's grouping in SQL, and the worker's
requests to a real receiver."""

import json
import time
from collections import Counter

import psycopg

from tests.integration.test_observability import scrape, value
from tests.receiver import Reply
from tests.support import add_endpoint, enqueue, eventually, query, stored, wait_final, wait_started
from worker.store.deliveries import find

FAST_RETRY = {"delays": [0.2]}


def coalesce(dsn, endpoint, coalesce_max, window=None):
    """The policy as an operator sets it in SQL."""
    changes = {"coalesce_max": coalesce_max, "coalesce_window": window}
    query(dsn, "SELECT webhooks.update_endpoint(%s, %s)", (endpoint, json.dumps(changes)))


def acquire(dsn, batch=10):
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute("SELECT delivery_id, lease_token, attempt, digest_id"
                            " FROM webhooks.acquire('w', %s, 30) ORDER BY delivery_id", (batch,)).fetchall()


def finish(dsn, claimed, reporters=None, **fields):
    """Outcomes as the worker gives them: of a digest's members, one reports the request (by
    default its first in this call; `reporters` names them otherwise)."""
    if reporters is None:
        firsts = {}
        for d, _, _, digest in claimed:
            firsts.setdefault(digest, d)
        reporters = set(firsts.values()) | {d for d, _, _, digest in claimed if digest is None}
    outcomes = [{"delivery_id": d, "lease_token": str(t), "attempt": a, "reports_request": d in reporters,
                 **fields} for d, t, a, _ in claimed]
    query(dsn, "SELECT * FROM webhooks.finish('w', %s)", (json.dumps(outcomes),))


def rate_tokens(dsn, endpoint):
    return query(dsn, "SELECT rate_tokens FROM webhooks.webhook_health_metrics WHERE webhook_id = %s",
                 (endpoint,))[0][0]


# --- the claim (SQL) ---------------------------------------------------------------------------


def test_rows_held_by_the_rate_limit_are_claimed_as_one_digest_costing_one_token(db):
    endpoint = add_endpoint(db, "http://127.0.0.1:9/a", body_format="slack", rate_limit_per_second=0.01,
                            rate_limit_burst=2)
    coalesce(db, endpoint, 5)
    ids = enqueue(db, endpoint, {"title": "disk full"}, count=12)
    claimed = acquire(db, batch=10)
    # two tokens, twelve rows waiting: two requests of five, in claim order
    assert [d for d, *_ in claimed] == ids[:10]
    digests = Counter(digest for *_, digest in claimed)
    assert sorted(digests.values()) == [5, 5] and None not in digests
    assert rate_tokens(db, endpoint) < 0.01  # a token per request, not per row
    assert acquire(db) == []  # the rest waits for a token


def test_a_lone_row_is_never_held_for_company(db):
    endpoint = add_endpoint(db, "http://127.0.0.1:9/a", body_format="slack", rate_limit_per_second=0.01,
                            rate_limit_burst=2)
    coalesce(db, endpoint, 5)
    ids = enqueue(db, endpoint, {"title": "disk full"}, count=2)
    claimed = acquire(db)
    # two rows, two tokens: nothing waits on the limit, so each goes alone, at once
    assert [(d, digest) for d, _, _, digest in claimed] == [(ids[0], None), (ids[1], None)]


def test_without_a_policy_or_for_raw_rows_are_claimed_one_per_request(db):
    plain = add_endpoint(db, "http://127.0.0.1:9/a", body_format="slack", rate_limit_per_second=0.01,
                         rate_limit_burst=2)
    enqueue(db, plain, {"title": "disk full"}, count=6)
    assert [digest for *_, digest in acquire(db)] == [None, None]


def test_a_window_coalesces_rows_that_waited_that_long_without_a_rate_limit(db):
    endpoint = add_endpoint(db, "http://127.0.0.1:9/a", body_format="envelope")
    coalesce(db, endpoint, 50, window="1 second")
    fresh = enqueue(db, endpoint, count=3)
    assert [digest for *_, digest in acquire(db)] == [None, None, None]  # not waited yet: one each
    query(db, "DELETE FROM webhooks.alert_delivery_queue")
    waited = enqueue(db, endpoint, count=3, deliver_after=-2)
    claimed = acquire(db)
    assert [d for d, *_ in claimed] == waited and len({digest for *_, digest in claimed}) == 1
    assert claimed[0][3] is not None and len(fresh) == 3


def test_a_failed_digest_is_claimed_again_as_the_same_group_and_members_leave_it_cleanly(db):
    endpoint = add_endpoint(db, "http://127.0.0.1:9/a", body_format="envelope", rate_limit_per_second=0.01,
                            rate_limit_burst=1, max_attempts=5)
    coalesce(db, endpoint, 10)
    ids = enqueue(db, endpoint, count=6)
    first = acquire(db)
    [digest] = {d for *_, d in first}
    assert [d for d, *_ in first] == ids
    finish(db, first, outcome="retry", retry_after_s=0, failure_category="http_5xx", http_status=500)
    # a member not due yet (its delay differed) still goes with its group
    query(db, "UPDATE webhooks.alert_delivery_queue SET next_retry_at = now() + interval '1 hour'"
              " WHERE delivery_id = %s", (ids[3],))
    # another member expires meanwhile: it leaves the group
    query(db, "UPDATE webhooks.alert_delivery_queue SET expires_at = now() - interval '1 second'"
              " WHERE delivery_id = %s", (ids[5],))
    query(db, "UPDATE webhooks.webhook_health_metrics SET rate_tokens = 1 WHERE webhook_id = %s", (endpoint,))
    again = acquire(db)
    assert [d for d, *_ in again] == ids[:5]
    assert {d for *_, d in again} == {digest}
    assert [a for _, _, a, _ in again] == [2] * 5
    assert query(db, "SELECT status, digest_id FROM webhooks.alert_delivery_queue WHERE delivery_id = %s",
                 (ids[5],)) == [("dead_letter", digest)]
    # a replayed member comes back on its own
    query(db, "SELECT webhooks.replay(%s)", (ids[5],))
    assert query(db, "SELECT status, digest_id FROM webhooks.alert_delivery_queue WHERE delivery_id = %s",
                 (ids[5],)) == [("pending", None)]
    finish(db, again, outcome="delivered", http_status=200)
    # every member has its own history, each attempt naming the digest that carried it
    history = query(db, "SELECT delivery_id, attempt, outcome, digest_id FROM webhooks.alert_delivery_log"
                        " WHERE delivery_id = ANY(%s) AND attempt > 0 ORDER BY delivery_id, attempt",
                    (ids[:5],))
    assert history == [(i, a, o, digest) for i in ids[:5] for a, o in ((1, "retry"), (2, "delivered"))]
    # and `deliveries show` names it, with the rows it carried when first sent
    [shown] = stored(db, find, ids[0], None)
    assert [(h["attempt"], h["digest_id"], h["digest_rows"]) for h in shown["history"]] == [
        (1, digest, 6), (2, digest, 6)]
    # finished members leave the group: nothing later can be claimed into it
    assert query(db, "SELECT count(*) FROM webhooks.alert_delivery_queue"
                     " WHERE digest_id IS NOT NULL") == [(0,)]


def test_a_digest_counts_once_in_the_endpoints_health(db):
    endpoint = add_endpoint(db, "http://127.0.0.1:9/a", body_format="envelope", rate_limit_per_second=0.01,
                            rate_limit_burst=1)
    coalesce(db, endpoint, 10)
    enqueue(db, endpoint, count=8)
    finish(db, acquire(db), outcome="retry", retry_after_s=60, failure_category="http_5xx", http_status=500)
    health = query(db, "SELECT total_attempts, failures, consecutive_failures"
                       " FROM webhooks.webhook_health_metrics WHERE webhook_id = %s", (endpoint,))
    assert health == [(1, 1, 1)]


def test_a_digest_whose_outcomes_are_written_in_two_batches_still_counts_once(db):
    # the worker's outcome batches are cut by size, and split in two when the database refuses one
    endpoint = add_endpoint(db, "http://127.0.0.1:9/a", body_format="envelope", rate_limit_per_second=0.01,
                            rate_limit_burst=1)
    coalesce(db, endpoint, 10)
    enqueue(db, endpoint, count=8)
    claimed = acquire(db)
    assert len({digest for *_, digest in claimed}) == 1
    reporter = claimed[0][0]
    for part in (claimed[:3], claimed[3:]):
        finish(db, part, reporters={reporter}, outcome="retry", retry_after_s=60, failure_category="http_5xx",
               http_status=500)
    health = query(db, "SELECT total_attempts, failures, consecutive_failures"
                       " FROM webhooks.webhook_health_metrics WHERE webhook_id = %s", (endpoint,))
    assert health == [(1, 1, 1)]


def test_rows_with_an_ordering_key_are_coalesced_only_with_their_key_in_order(db):
    endpoint = add_endpoint(db, "http://127.0.0.1:9/a", body_format="envelope", rate_limit_per_second=0.01,
                            rate_limit_burst=3)
    coalesce(db, endpoint, 3)
    host1 = enqueue(db, endpoint, count=4)
    host2 = enqueue(db, endpoint, count=2)
    loose = enqueue(db, endpoint, count=2)
    for key, ids in (("host-1", host1), ("host-2", host2)):
        query(db, "UPDATE webhooks.alert_delivery_queue SET ordering_key = %s WHERE delivery_id = ANY(%s)",
              (key, ids))
    claimed = {d: digest for d, _, _, digest in acquire(db)}
    # three tokens, three requests: each key's first rows in a digest of their own, and the loose
    # rows in another; host-1's fourth row waits for the three before it
    assert set(claimed) == set(host1[:3] + host2 + loose)
    groups = {frozenset(d for d in claimed if claimed[d] == digest) for digest in claimed.values()}
    assert groups == {frozenset(host1[:3]), frozenset(host2), frozenset(loose)}
    assert acquire(db) == []


def test_a_request_of_its_own_among_a_digest_s_rows_does_not_split_the_digest(db):
    # the claim bounds each endpoint's candidates when other endpoints come first; a coalescing
    # endpoint's rows group into requests only later, so its bound must not cut a group
    ahead = add_endpoint(db, "http://127.0.0.1:9/ahead")
    [first_elsewhere] = enqueue(db, ahead)
    endpoint = add_endpoint(db, "http://127.0.0.1:9/a", body_format="slack", rate_limit_per_second=0.01,
                            rate_limit_burst=2)
    coalesce(db, endpoint, 3)
    [a] = enqueue(db, endpoint)
    [keyed] = enqueue(db, endpoint)  # the head of an ordering key: a request of its own
    query(db, "UPDATE webhooks.alert_delivery_queue SET ordering_key = 'k'"
              " WHERE delivery_id = %s RETURNING 1", (keyed,))
    b, c = enqueue(db, endpoint, count=2)
    claimed = {d: digest for d, _, _, digest in acquire(db, batch=2)}
    # two requests in the batch: the other endpoint's row, then the digest of a, b and c
    assert set(claimed) == {first_elsewhere, a, b, c}
    assert claimed[a] is not None and claimed[a] == claimed[b] == claimed[c]


def test_a_key_run_stops_at_a_gap_so_no_row_overtakes_an_earlier_one_of_its_key(db):
    endpoint = add_endpoint(db, "http://127.0.0.1:9/a", body_format="envelope", rate_limit_per_second=0.01,
                            rate_limit_burst=1)
    coalesce(db, endpoint, 10)
    keyed = enqueue(db, endpoint, count=5)
    query(db, "UPDATE webhooks.alert_delivery_queue SET ordering_key = 'k' WHERE delivery_id = ANY(%s)",
          (keyed,))
    # the third is not due yet: the fourth and fifth must not go before it
    query(db, "UPDATE webhooks.alert_delivery_queue SET next_retry_at = now() + interval '1 hour'"
              " WHERE delivery_id = %s", (keyed[2],))
    assert [d for d, *_ in acquire(db)] == keyed[:2]


def test_the_policy_is_checked_by_the_database_too(db):
    raw = add_endpoint(db, "http://127.0.0.1:9/a")
    for changes, constraint in (({"coalesce_max": 5}, "endpoints_coalesce_format"),):
        try:
            query(db, "SELECT webhooks.update_endpoint(%s, %s)", (raw, json.dumps(changes)))
        except psycopg.errors.CheckViolation as exc:
            assert exc.diag.constraint_name == constraint
        else:
            raise AssertionError("a raw endpoint accepted a coalescing policy")


# --- the worker ----------------------------------------------------------------------------------


def alerts_in(request):
    """The event ids a request carried: one envelope, or a webhook.batch of them."""
    body = json.loads(request.body)
    return [e["id"] for e in body["data"]] if body.get("type") == "webhook.batch" else [body["id"]]


def event_ids(dsn, ids):
    return dict(query(dsn, "SELECT delivery_id, event_id FROM webhooks.alert_delivery_queue"
                           " WHERE delivery_id = ANY(%s)", (ids,)))


def test_a_storm_of_1000_alerts_goes_out_as_digests_each_alert_exactly_once(db, receiver, spawn):
    # The benchmark's storm (bench/, 1,000 alerts in 10 s at 1 request/s) on a time base ten times
    # smaller: 1,000 alerts in about 1 s, 10 requests/s.
    endpoint = add_endpoint(db, receiver.url("/storm"), body_format="envelope", rate_limit_per_second=10,
                            rate_limit_burst=1, max_in_flight=50)
    coalesce(db, endpoint, 50)
    worker = spawn(db)
    wait_started([worker])
    ids = []
    for _ in range(10):
        ids += enqueue(db, endpoint, {"title": "link down", "severity": "critical"}, count=100)
        time.sleep(0.1)
    wait_final(db, ids, message="1,000 delivered")

    requests = receiver.to("/storm")
    carried = [alerts_in(r) for r in requests]
    sizes = [len(c) for c in carried]
    print(f"storm: {len(requests)} requests for 1,000 alerts, rows per request {sizes}")
    # every alert reached the receiver exactly once, inside some message
    assert Counter(e for c in carried for e in c) == Counter(event_ids(db, ids).values())
    assert max(sizes) <= 50 and len(requests) <= 30
    # each member kept its own history: one delivered attempt, naming the digest that carried it
    logged = query(db, "SELECT count(*), count(DISTINCT digest_id),"
                       " count(*) FILTER (WHERE digest_id IS NULL) FROM webhooks.alert_delivery_log"
                       " WHERE delivery_id = ANY(%s) AND outcome = 'delivered'", (ids,))
    digests = [r for r in requests if "webhook-digest-id" in r.headers]
    assert logged == [(1000, len(digests), len(requests) - len(digests))]
    assert query(db, "SELECT max(attempts) FROM webhooks.alert_delivery_queue") == [(1,)]
    # the metrics: digests sent, and rows per digest
    samples = scrape(worker)
    assert value(samples, "webhook_worker_digests_total") == len(digests)
    assert value(samples, "webhook_worker_digest_rows_count") == len(digests)
    assert value(samples, "webhook_worker_digest_rows_sum") == sum(len(alerts_in(r)) for r in digests)


def test_a_failed_digest_is_sent_again_with_the_same_webhook_id_and_members(db, receiver, spawn):
    endpoint = add_endpoint(db, receiver.url("/flaky"), body_format="envelope", rate_limit_per_second=5,
                            rate_limit_burst=1, retry_schedule=FAST_RETRY)
    coalesce(db, endpoint, 10)
    receiver.script("/flaky", Reply(503), Reply(200))
    ids = enqueue(db, endpoint, {"title": "link down"}, count=8)
    spawn(db)
    wait_final(db, ids, message="8 delivered")
    first, second = receiver.to("/flaky")
    assert first.headers["webhook-id"] == second.headers["webhook-id"]
    assert first.headers["webhook-id"].startswith("digest_")
    assert first.headers["webhook-digest-id"] == second.headers["webhook-digest-id"]
    assert alerts_in(first) == alerts_in(second) == [event_ids(db, ids)[i] for i in ids]
    assert query(db, "SELECT DISTINCT status, attempts FROM webhooks.alert_delivery_queue") == [
        ("delivered", 2)]


def test_a_digest_the_worker_sends_counts_once_per_request_in_the_endpoints_health(db, receiver, spawn):
    # finish() given outcomes by hand is tested above; this is the worker naming the one member
    # that reports each request: eight rows, two requests (a 503, then a 200), two attempts
    endpoint = add_endpoint(db, receiver.url("/health"), body_format="envelope", rate_limit_per_second=5,
                            rate_limit_burst=1, retry_schedule=FAST_RETRY)
    coalesce(db, endpoint, 10)
    receiver.script("/health", Reply(503), Reply(200))
    ids = enqueue(db, endpoint, {"title": "link down"}, count=8)
    spawn(db)
    wait_final(db, ids, message="8 delivered")
    requests = receiver.to("/health")
    assert len(requests) == 2 and all(alerts_in(r) == alerts_in(requests[0]) for r in requests)
    assert len(alerts_in(requests[0])) == 8
    health = query(db, "SELECT total_attempts, successes, failures, consecutive_failures"
                       " FROM webhooks.webhook_health_metrics WHERE webhook_id = %s", (endpoint,))
    assert health == [(2, 1, 1, 0)]


def test_a_lone_alert_on_an_idle_coalescing_endpoint_goes_at_once_and_alone(db, receiver, spawn):
    endpoint = add_endpoint(db, receiver.url("/quiet"), body_format="envelope", rate_limit_per_second=1)
    window = 60
    coalesce(db, endpoint, 50, window=f"{window} seconds")
    worker = spawn(db)
    wait_started([worker])
    enqueued = time.time()
    [delivery] = enqueue(db, endpoint, {"title": "link down"})
    # well inside the window: the alert did not wait for company (half a long window leaves a
    # loaded machine room; the claim is against the window, not a speed)
    [request] = eventually(lambda: receiver.to("/quiet"), timeout=window / 2, message="the alert arrived")
    assert request.at - enqueued < window / 2
    assert alerts_in(request) == [event_ids(db, [delivery])[delivery]]
    assert "webhook-digest-id" not in request.headers
    assert json.loads(request.body)["type"] == "alert.created"


def test_a_member_that_cannot_be_rendered_is_dead_lettered_alone_and_the_digest_goes_without_it(
        db, receiver, spawn):
    endpoint = add_endpoint(db, receiver.url("/slack"), body_format="slack", rate_limit_per_second=5,
                            rate_limit_burst=1)
    coalesce(db, endpoint, 10)
    good = enqueue(db, endpoint, {"title": "link down", "severity": "critical"}, count=4)
    [bad] = enqueue(db, endpoint, {"severity": "critical"})  # no title: a Slack message needs one
    worker = spawn(db)
    worker.expect_errors("payload cannot be rendered")
    wait_final(db, [*good, bad], message="all final")
    [request] = receiver.to("/slack")
    assert json.loads(request.body)["text"] == "4 alerts — 4 critical"
    assert request.headers["webhook-event-type"] == "webhook.batch"
    assert query(db, "SELECT status, dead_letter_reason FROM webhooks.alert_delivery_queue"
                     " WHERE delivery_id = %s", (bad,)) == [
        ("dead_letter", "cannot render as slack: payload.title: missing (an alert needs a title or summary)")]
    assert {s for (s,) in query(db, "SELECT status FROM webhooks.alert_delivery_queue"
                                    " WHERE delivery_id = ANY(%s)", (good,))} == {"delivered"}
