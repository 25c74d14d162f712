"""The claim's limits, one SQL call at a time: rate tokens (fractions, refill, burst, debit), the
concurrency cap, half-open probes, a Retry-After pause, and one claim per endpoint at a time.

tests/integration/test_limits.py shows them holding for a fleet of workers under load, by timing;
these call webhooks.acquire() and webhooks.finish() directly, each through the short claim of one
endpoint and the full one (`webhooks.claim_path`), and fail at once on the rule that broke
(mutants of these rules were once caught only by the fleet tests)."""

import json

import psycopg
import pytest

from tests.support import add_endpoint, enqueue, query

OK = {"outcome": "delivered", "http_status": 200, "latency_ms": 3}
# A rate so slow that the seconds a test takes add nothing that counts (a token per 1000 s).
SLOW = 0.001

both_claims = pytest.mark.parametrize("claim_path", ["auto", "full"])


def claim(db, claim_path, worker="w", batch=10):
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("SELECT set_config('webhooks.claim_path', %s, false)", (claim_path,))
        return conn.execute("SELECT delivery_id, lease_token, attempt FROM webhooks.acquire(%s, %s, 30)",
                            (worker, batch)).fetchall()


def finish(db, claimed, worker="w", **fields):
    delivery_id, token, attempt = claimed
    with psycopg.connect(db, autocommit=True) as conn:
        [(applied,)] = conn.execute(
            "SELECT applied FROM webhooks.finish(%s, %s)",
            (worker, json.dumps([{"delivery_id": delivery_id, "lease_token": str(token), "attempt": attempt,
                                  **fields}]))).fetchall()
    assert applied


def set_tokens(db, endpoint, tokens, refilled_seconds_ago=0):
    query(db, "UPDATE webhooks.webhook_health_metrics SET rate_tokens = %s,"
              " rate_refilled_at = now() - make_interval(secs => %s) WHERE webhook_id = %s RETURNING 1",
          (tokens, refilled_seconds_ago, endpoint))


def tokens(db, endpoint):
    return query(db, "SELECT rate_tokens FROM webhooks.webhook_health_metrics WHERE webhook_id = %s",
                 (endpoint,))[0][0]


@both_claims
@pytest.mark.parametrize("tokens_left, sends", [(0.6, 0), (1.4, 1), (1.6, 1), (2.0, 2)])
def test_a_rate_limited_endpoint_sends_one_request_per_whole_token(db, claim_path, tokens_left, sends):
    # A fraction of a token is not a request: rounded instead of floored, 0.6 sent one and 1.6 two.
    endpoint = add_endpoint(db, "http://127.0.0.1:9/x", rate_limit_per_second=SLOW, rate_limit_burst=5,
                            max_in_flight=100)
    enqueue(db, endpoint, count=10)
    set_tokens(db, endpoint, tokens_left)
    assert len(claim(db, claim_path)) == sends
    assert tokens(db, endpoint) == pytest.approx(tokens_left - sends, abs=0.01)


@pytest.mark.parametrize("tokens_left, sends", [(0.6, 0), (1.6, 1)])
def test_a_rate_limited_tenant_sends_one_request_per_whole_token(db, tokens_left, sends):
    # (an endpoint whose tenant has limits takes the full claim)
    [(limited,)] = query(db, "SELECT webhooks.register_tenant('limited', %s)",
                         (json.dumps({"rate_limit_per_second": SLOW, "rate_limit_burst": 5}),))
    endpoint = add_endpoint(db, "http://127.0.0.1:9/x", max_in_flight=100)
    query(db, "UPDATE webhooks.endpoints SET tenant_id = %s WHERE id = %s RETURNING 1", (limited, endpoint))
    enqueue(db, endpoint, count=10)
    query(db, "UPDATE webhooks.tenants SET rate_tokens = %s, rate_refilled_at = now() WHERE id = %s"
              " RETURNING 1", (tokens_left, limited))
    assert len(claim(db, "auto")) == sends


@both_claims
def test_rate_tokens_refill_at_the_rate_up_to_the_burst_and_each_request_spends_one(db, claim_path):
    endpoint = add_endpoint(db, "http://127.0.0.1:9/x", rate_limit_per_second=0.01, rate_limit_burst=4,
                            max_in_flight=100)
    enqueue(db, endpoint, count=10)
    set_tokens(db, endpoint, 0, refilled_seconds_ago=250)  # 2.5 tokens since, at 0.01 a second
    assert len(claim(db, claim_path)) == 2
    assert tokens(db, endpoint) == pytest.approx(0.5, abs=0.05)  # (and 0.01 a second since)
    assert claim(db, claim_path) == []  # the half token left
    set_tokens(db, endpoint, 0, refilled_seconds_ago=86_400)  # a day's refill: the burst, no more
    assert len(claim(db, claim_path)) == 4
    assert claim(db, claim_path) == []


@both_claims
def test_the_concurrency_cap_counts_requests_until_they_finish_or_their_lease_ends(db, claim_path):
    endpoint = add_endpoint(db, "http://127.0.0.1:9/x", max_in_flight=3)
    enqueue(db, endpoint, count=10)
    first = sorted(claim(db, claim_path))
    assert len(first) == 3
    assert claim(db, claim_path) == []
    finish(db, first[0], **OK)
    [second] = claim(db, claim_path)
    assert second[0] not in [c[0] for c in first]
    # a lease that ran out frees its place (and its row keeps its own, ahead of the backlog)
    query(db, "UPDATE webhooks.alert_delivery_queue SET locked_until = now() - interval '1 s'"
              " WHERE delivery_id = %s RETURNING 1", (first[1][0],))
    assert [c[0] for c in claim(db, claim_path)] == [first[1][0]]
    assert claim(db, claim_path) == []


def test_a_digest_in_flight_takes_one_place_under_the_concurrency_cap(db):
    # (an endpoint that coalesces takes the full claim)
    endpoint = add_endpoint(db, "http://127.0.0.1:9/x", body_format="slack", max_in_flight=2)
    query(db, "SELECT webhooks.update_endpoint(%s, %s)", (endpoint, json.dumps({"coalesce_max": 5})))
    enqueue(db, endpoint, {"title": "disk full"}, count=12)
    assert len(claim(db, "auto", batch=1)) == 5  # one request: more wait than the limits let through
    assert len(claim(db, "auto", batch=1)) == 5  # the first digest counts as one request, not five
    assert claim(db, "auto") == []


@both_claims
def test_a_half_open_circuit_sends_its_probes_and_no_more_while_they_are_out(db, claim_path):
    endpoint = add_endpoint(db, "http://127.0.0.1:9/x", max_in_flight=10,
                            circuit_policy={"probes": 2, "probe_success_ratio": 1})
    enqueue(db, endpoint, count=10)
    query(db, "UPDATE webhooks.webhook_health_metrics SET circuit_state = 'half_open', probe_successes = 0,"
              " probe_failures = 0 WHERE webhook_id = %s RETURNING 1", (endpoint,))
    probes = claim(db, claim_path)
    assert len(probes) == 2
    assert claim(db, claim_path) == []
    finish(db, probes[0], **OK)  # one answered, one still out: the round's two are spent
    assert claim(db, claim_path) == []


def test_an_open_circuit_whose_sleep_is_over_sends_only_its_probes_and_a_forced_one_nothing(db):
    # (the short claim leaves an open circuit to the full one, which turns it half-open)
    endpoint = add_endpoint(db, "http://127.0.0.1:9/x", max_in_flight=10, circuit_policy={"probes": 2})
    enqueue(db, endpoint, count=10)
    query(db, "SELECT webhooks.set_circuit(%s, 'open')", (endpoint,))  # by an operator, until closed
    assert claim(db, "auto") == []
    query(db, "SELECT webhooks.set_circuit(%s, 'open', now() + interval '1 hour')", (endpoint,))
    assert claim(db, "auto") == []  # asleep
    query(db, "UPDATE webhooks.webhook_health_metrics SET circuit_open_until = now() - interval '1 s'"
              " WHERE webhook_id = %s RETURNING 1", (endpoint,))
    assert len(claim(db, "auto")) == 2
    assert query(db, "SELECT circuit_state FROM webhooks.webhook_health_metrics WHERE webhook_id = %s",
                 (endpoint,)) == [("half_open",)]
    assert claim(db, "auto") == []


@both_claims
def test_a_retry_after_pauses_the_endpoint_for_every_claim_until_it_ends(db, claim_path):
    endpoint = add_endpoint(db, "http://127.0.0.1:9/x", max_in_flight=10)
    ids = enqueue(db, endpoint, count=5)
    [asked] = claim(db, claim_path, worker="a", batch=1)
    finish(db, asked, worker="a", outcome="deferred", http_status=429, failure_category="rate_limited",
           retry_after_s=30)
    assert claim(db, claim_path, worker="b") == []  # four rows due, none sent while it is paused
    query(db, "UPDATE webhooks.webhook_health_metrics SET paused_until = now() - interval '1 s'"
              " WHERE webhook_id = %s RETURNING 1", (endpoint,))
    # the pause is over; the deferred row itself is due at its Retry-After
    assert sorted(c[0] for c in claim(db, claim_path, worker="b")) == [d for d in ids if d != asked[0]]


@both_claims
@pytest.mark.parametrize("limit", [
    {"max_in_flight": 1},
    {"rate_limit_per_second": SLOW, "rate_limit_burst": 1, "max_in_flight": 100},
], ids=["cap", "rate"])
def test_a_claim_skips_an_endpoint_another_claim_holds_and_never_waits_for_it(db, claim_path, limit):
    # No two claims for one endpoint run at once: the second one, not seeing the first's rows in
    # flight or tokens spent until it commits, would send past the limit (or wait for its rows).
    endpoint = add_endpoint(db, "http://127.0.0.1:9/x", **limit)
    enqueue(db, endpoint, count=5)
    with psycopg.connect(db) as first:  # its transaction stays open
        first.execute("SELECT set_config('webhooks.claim_path', %s, false)", (claim_path,))
        assert len(first.execute("SELECT * FROM webhooks.acquire('a', 10, 30)").fetchall()) == 1
        with psycopg.connect(db, autocommit=True) as second:
            second.execute("SET lock_timeout = '2s'")  # waiting would fail the test, not hang it
            second.execute("SELECT set_config('webhooks.claim_path', %s, false)", (claim_path,))
            assert second.execute("SELECT * FROM webhooks.acquire('b', 10, 30)").fetchall() == []
        first.commit()
    assert claim(db, claim_path, worker="b") == []  # and once it committed, the limit is spent
