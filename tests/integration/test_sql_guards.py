"""The conditions in sql/functions that guard a promise, each pinned by a short SQL-level test: the
hand-made mutants of scripts/sql_mutants.py that no fast test caught."""

import hashlib
import json

import psycopg
import pytest

from tests.support import add_endpoint, api_dsn, enqueue, query


def acquire(dsn, batch=10, worker="w"):
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute("SELECT delivery_id, lease_token::text, attempt FROM webhooks.acquire(%s, %s, 30)"
                            " ORDER BY delivery_id", (worker, batch)).fetchall()


def finish(dsn, worker, *outcomes):
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute("SELECT delivery_id, applied, status FROM webhooks.finish(%s, %s)",
                            (worker, json.dumps(list(outcomes)))).fetchall()


def circuit(dsn, endpoint, state, seconds_from_now=-1):
    query(dsn, "UPDATE webhooks.webhook_health_metrics SET circuit_state = %s,"
               " circuit_open_until = now() + make_interval(secs => %s) WHERE webhook_id = %s",
          (state, seconds_from_now, endpoint))


def test_an_open_circuit_whose_sleep_is_over_sends_its_probes_only_and_no_more_while_they_fly(db):
    query(db, "UPDATE webhooks.delivery_config SET circuit_probes = 2")
    endpoint = add_endpoint(db, "http://127.0.0.1:9/x")
    enqueue(db, endpoint, count=6)
    circuit(db, endpoint, "open")
    assert len(acquire(db)) == 2  # the probes, not a batch
    assert query(db, "SELECT circuit_state FROM webhooks.webhook_health_metrics") == [("half_open",)]
    assert acquire(db) == []  # half-open: both probes still in flight, no place for a third


def test_an_endpoint_whose_pause_is_over_sends_again(db):
    endpoint = add_endpoint(db, "http://127.0.0.1:9/x")
    enqueue(db, endpoint, count=2)
    query(db, "UPDATE webhooks.webhook_health_metrics SET paused_until = now() + interval '1 hour'")
    assert acquire(db) == []
    query(db, "UPDATE webhooks.webhook_health_metrics SET paused_until = now() - interval '1 second'")
    assert len(acquire(db)) == 2


def test_the_full_claim_counts_each_attempt_when_it_claims(db):
    # two endpoints: the full claim, not the short one of a single plain endpoint
    first = add_endpoint(db, "http://127.0.0.1:9/a")
    second = add_endpoint(db, "http://127.0.0.1:9/b")
    ids = enqueue(db, first) + enqueue(db, second)
    assert [a for *_, a in acquire(db)] == [1, 1]
    assert query(db, "SELECT attempts FROM webhooks.alert_delivery_queue WHERE delivery_id = ANY(%s)",
                 (ids,)) == [(1,), (1,)]


def test_a_limited_tenant_held_by_another_claim_sends_nothing_in_this_one(db):
    tenant = int(query(db, "SELECT webhooks.register_tenant('acme', %s)",
                       (json.dumps({"rate_limit_per_second": 100}),))[0][0])
    endpoint = add_endpoint(db, "http://127.0.0.1:9/x")
    query(db, "UPDATE webhooks.endpoints SET tenant_id = %s WHERE id = %s", (tenant, endpoint))
    enqueue(db, endpoint, count=2)
    with psycopg.connect(db) as other, psycopg.connect(db, autocommit=True) as claim:
        other.execute("SELECT 1 FROM webhooks.tenants WHERE id = %s FOR UPDATE", (tenant,))  # another claim
        # a claim never waits for another: were it to, this fails at once rather than hanging
        claim.execute("SET lock_timeout = '2s'")
        assert claim.execute("SELECT delivery_id FROM webhooks.acquire('w', 10, 30)").fetchall() == []
    assert len(acquire(db)) == 2


def test_release_gives_back_only_the_lease_it_names(db):
    endpoint = add_endpoint(db, "http://127.0.0.1:9/x")
    [delivery] = enqueue(db, endpoint)
    [(_, token, _)] = acquire(db)
    wrong = [{"delivery_id": delivery, "lease_token": "00000000-0000-0000-0000-000000000000"}]
    assert query(db, "SELECT webhooks.release('w', %s)", (json.dumps(wrong),)) == [(0,)]
    assert query(db, "SELECT status, lease_token::text FROM webhooks.alert_delivery_queue") == [
        ("delivering", token)]


def test_a_late_outcome_sent_again_is_still_stale_not_a_repeat_of_an_applied_one(db):
    endpoint = add_endpoint(db, "http://127.0.0.1:9/x")
    [delivery] = enqueue(db, endpoint)
    [(_, token, attempt)] = acquire(db)
    query(db, "SELECT webhooks.release('w', %s)",
          (json.dumps([{"delivery_id": delivery, "lease_token": token}]),))
    late = {"delivery_id": delivery, "lease_token": token, "attempt": attempt, "outcome": "delivered",
            "http_status": 200}
    assert finish(db, "w", late) == [(delivery, False, "stale")]
    # the same batch again (its answer lost): the stale row in the log is no earlier write of it
    assert finish(db, "w", late) == [(delivery, False, "stale")]
    assert query(db, "SELECT status FROM webhooks.alert_delivery_queue") == [("pending",)]


def test_a_row_in_flight_is_not_replayed(db):
    endpoint = add_endpoint(db, "http://127.0.0.1:9/x")
    [delivery] = enqueue(db, endpoint)
    [(_, token, _)] = acquire(db)
    assert query(db, "SELECT webhooks.replay(%s)", (delivery,)) == [(False,)]
    assert query(db, "SELECT status, attempts, lease_token::text FROM webhooks.alert_delivery_queue") == [
        ("delivering", 1, token)]


def test_a_bulk_replay_in_a_tenant_s_session_replays_only_that_tenant_s_dead_letters(db):
    acme = int(query(db, "SELECT webhooks.register_tenant('acme')")[0][0])
    mine = add_endpoint(db, "http://127.0.0.1:9/acme")
    query(db, "UPDATE webhooks.endpoints SET tenant_id = %s WHERE id = %s", (acme, mine))
    theirs = add_endpoint(db, "http://127.0.0.1:9/default")
    ids = enqueue(db, mine) + enqueue(db, theirs)
    query(db, "UPDATE webhooks.alert_delivery_queue SET status = 'dead_letter', dead_letter_reason = 'x',"
              " dead_lettered_at = now()")
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("SELECT set_config('webhooks.tenant', %s, false)", (str(acme),))
        assert conn.execute("SELECT webhooks.replay_dead_letters()").fetchone() == (1,)
    after = query(db, "SELECT delivery_id, status FROM webhooks.alert_delivery_queue ORDER BY delivery_id")
    assert after == [(ids[0], "pending"), (ids[1], "dead_letter")]


@pytest.mark.parametrize("policy, attempts, failures, opens", [
    # the fleet's defaults: 60 % of at least 20 attempts
    (None, 20, 12, True),
    (None, 20, 11, False),
    (None, 19, 12, False),
    # an endpoint's own ratio, one a float4 holds exactly and one it does not
    ({"failure_ratio": 0.25, "min_attempts": 8}, 8, 2, True),
    ({"failure_ratio": 0.25, "min_attempts": 8}, 8, 1, False),
    ({"failure_ratio": 0.3, "min_attempts": 10}, 10, 3, True),
    ({"failure_ratio": 0.3, "min_attempts": 10}, 10, 2, False),
])
def test_the_circuit_opens_at_exactly_its_failure_ratio_and_not_just_under_it(db, policy, attempts, failures,
                                                                            opens):
    endpoint = add_endpoint(db, "http://127.0.0.1:9/x", max_in_flight=1000, circuit_policy=policy or {})
    enqueue(db, endpoint, count=attempts)
    claimed = acquire(db, batch=attempts)
    assert len(claimed) == attempts
    failed = {"outcome": "retry", "http_status": 503, "failure_category": "http_5xx", "error": "HTTP 503"}
    delivered = {"outcome": "delivered", "http_status": 200}
    # one batch: the window holds these attempts alone, none weighted from an earlier window
    finish(db, "w", *({"delivery_id": delivery, "lease_token": token, "attempt": attempt, "latency_ms": 5,
                       **(failed if n < failures else delivered)}
                      for n, (delivery, token, attempt) in enumerate(claimed)))
    assert query(db, "SELECT window_attempts, window_failures FROM webhooks.webhook_health_metrics"
                     " WHERE webhook_id = %s", (endpoint,)) == [(attempts, failures)]
    [(state,)] = query(db, "SELECT circuit_state FROM webhooks.webhook_health_metrics WHERE webhook_id = %s",
                       (endpoint,))
    assert state == ("open" if opens else "closed")


@pytest.mark.parametrize("succeeded, state", [(3, "closed"), (2, "open")])
def test_a_half_open_circuit_closes_at_exactly_its_probe_success_ratio(db, succeeded, state):
    # the fleet's defaults: 5 probes, 60 % of them succeeding closes the circuit
    endpoint = add_endpoint(db, "http://127.0.0.1:9/x", max_in_flight=1000)
    enqueue(db, endpoint, count=5)
    circuit(db, endpoint, "open")
    probes = acquire(db)
    assert len(probes) == 5
    failed = {"outcome": "retry", "http_status": 503, "failure_category": "http_5xx", "error": "HTTP 503"}
    delivered = {"outcome": "delivered", "http_status": 200}
    finish(db, "w", *({"delivery_id": delivery, "lease_token": token, "attempt": attempt, "latency_ms": 5,
                       **(delivered if n < succeeded else failed)}
                      for n, (delivery, token, attempt) in enumerate(probes)))
    assert query(db, "SELECT circuit_state FROM webhooks.webhook_health_metrics WHERE webhook_id = %s",
                 (endpoint,)) == [(state,)]


def test_a_publish_under_a_token_that_is_not_usable_is_refused_as_such_before_anything_is_queued(db):
    """The API's login, resting as webhooks_authenticator, publishes in one statement through the
    *_as functions: a revoked, expired or unknown token, or one whose role may not publish, is
    refused with SQLSTATE 28000 there, whatever the resting role may or may not call."""
    add_endpoint(db, "http://127.0.0.1:9/x", event_types=("order.*",))

    def token(name, role, expires="infinity"):
        secret = f"secret-{name}"
        query(db, "SELECT webhooks.api_create_token(%s, %s, %s, %s::timestamptz)",
              (name, role, hashlib.sha256(secret.encode()).digest(), expires))
        return hashlib.sha256(secret.encode()).digest()

    usable, revoked = token("usable", "producer"), token("revoked", "producer")
    query(db, "SELECT webhooks.api_revoke_token('revoked')")
    refused = {"revoked": revoked, "expired": token("expired", "producer", "-infinity"),
               "unknown": hashlib.sha256(b"never issued").digest(), "reader": token("reader", "reader")}
    [(version,)] = query(db, "SELECT version FROM webhooks.event_types_version")
    one = "SELECT count(*) FROM webhooks.api_publish_as(%s, '{producer,admin}', %s, 'order.paid', '{}')"
    batch = ("SELECT count(*) FROM webhooks.api_publish_batch_as(%s, '{producer,admin}', %s,"
             " '[{\"event_type\": \"order.paid\", \"payload\": {}}]')")
    with psycopg.connect(api_dsn(db), autocommit=True) as api:
        api.execute("SELECT set_config('role', 'webhooks_authenticator', false)")
        for token_hash in refused.values():
            for sql in (one, batch):
                with pytest.raises(psycopg.errors.InvalidAuthorizationSpecification):
                    api.execute(sql, (token_hash, version))
        assert query(db, "SELECT count(*) FROM webhooks.alert_delivery_queue") == [(0,)]
        # the same calls under a usable token publish
        assert [api.execute(sql, (usable, version)).fetchone() for sql in (one, batch)] == [(1,), (1,)]
    assert query(db, "SELECT count(*) FROM webhooks.alert_delivery_queue") == [(2,)]


def requests(*targets):
    """The gate's requests, one per (endpoint id or None for its subscribers, event type)."""
    rows = ", ".join(f"ROW({n}, {'NULL' if hook is None else int(hook)}, '{event_type}', NULL, NULL, '{{}}',"
                     " NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)"
                     "::webhooks.delivery_request"
                     for n, (hook, event_type) in enumerate(targets, 1))
    return f"ARRAY[{rows}]"


def two_tenants(db):
    """An endpoint subscribed to order.* in tenant acme, one in the default tenant: (acme, mine, theirs)."""
    acme = int(query(db, "SELECT webhooks.register_tenant('acme')")[0][0])
    mine = add_endpoint(db, "http://127.0.0.1:9/acme", name="mine", event_types=("order.*",))
    query(db, "UPDATE webhooks.endpoints SET tenant_id = %s WHERE id = %s", (acme, mine))
    theirs = add_endpoint(db, "http://127.0.0.1:9/default", name="theirs", event_types=("order.*",))
    return acme, mine, theirs


def test_many_requests_in_a_tenant_s_session_fan_out_to_that_tenant_s_subscribers_only(db):
    acme, mine, _ = two_tenants(db)
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("SELECT set_config('webhooks.tenant', %s, false)", (str(acme),))
        queued = conn.execute(f"SELECT ordinal, webhook_id FROM webhooks.queue_deliveries("
                              f"{requests((None, 'order.paid'), (None, 'order.refunded'))}, 'producer')"
                              " ORDER BY 1").fetchall()
    assert queued == [(1, mine), (2, mine)]
    assert query(db, "SELECT DISTINCT webhook_id FROM webhooks.alert_delivery_queue") == [(mine,)]


def test_many_requests_in_a_tenant_s_session_may_not_address_another_tenant_s_endpoint(db):
    acme, mine, theirs = two_tenants(db)
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("SELECT set_config('webhooks.tenant', %s, false)", (str(acme),))
        refused = f"webhook_id {theirs}: no such endpoint"
        with pytest.raises(psycopg.errors.ForeignKeyViolation, match=refused):
            conn.execute(f"SELECT count(*) FROM webhooks.queue_deliveries("
                         f"{requests((mine, 'order.paid'), (theirs, 'order.paid'))}, 'producer')")
    assert query(db, "SELECT count(*) FROM webhooks.alert_delivery_queue") == [(0,)]


def test_a_replay_in_a_tenant_s_session_leaves_another_tenant_s_dead_letter_alone(db):
    acme, mine, theirs = two_tenants(db)
    ids = enqueue(db, mine) + enqueue(db, theirs)
    query(db, "UPDATE webhooks.alert_delivery_queue SET status = 'dead_letter', dead_letter_reason = 'x',"
              " dead_lettered_at = now()")
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("SELECT set_config('webhooks.tenant', %s, false)", (str(acme),))
        assert [conn.execute("SELECT webhooks.replay(%s)", (i,)).fetchone() for i in reversed(ids)] == [
            (False,), (True,)]
    after = query(db, "SELECT delivery_id, status, replays FROM webhooks.alert_delivery_queue ORDER BY 1")
    assert after == [(ids[0], "pending", 1), (ids[1], "dead_letter", 0)]


def test_a_row_being_sent_counts_against_the_tenant_s_max_queued(db):
    acme, mine, _ = two_tenants(db)
    query(db, "SELECT webhooks.update_tenant('acme', '{\"max_queued\": 1}')")
    enqueue(db, mine)
    [(_, _, _)] = acquire(db)  # delivering now
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("SELECT set_config('webhooks.tenant', %s, false)", (str(acme),))
        with pytest.raises(psycopg.errors.ConfigurationLimitExceeded):
            conn.execute(f"SELECT count(*) FROM webhooks.queue_deliveries({requests((mine, 'order.paid'))},"
                         " 'api')")
    assert query(db, "SELECT status FROM webhooks.alert_delivery_queue") == [("delivering",)]


def test_a_message_kept_for_disabled_subscribers_needs_no_room_in_the_tenant_s_max_queued(db):
    acme, mine, _ = two_tenants(db)
    query(db, "SELECT webhooks.update_tenant('acme', '{\"max_queued\": 0}')")
    query(db, "SELECT webhooks.disable_endpoint(%s, 'maintenance')", (mine,))
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("SELECT set_config('webhooks.tenant', %s, false)", (str(acme),))
        publish = requests((None, "order.paid"))
        kept = conn.execute(f"SELECT webhook_id FROM webhooks.queue_deliveries({publish}, 'api')").fetchall()
    assert kept == [(mine,)]
    assert query(db, "SELECT webhook_id, status, failure_category FROM webhooks.alert_delivery_queue") == [
        (mine, "dead_letter", "disabled")]


def test_a_message_lent_to_a_row_with_a_lower_id_widens_its_range_down_to_it(db):
    # ids come in order within a transaction unless given (OVERRIDING SYSTEM VALUE, the owner's): the
    # range still covers every row of the message, so deleting the higher one leaves the message
    first = add_endpoint(db, "http://127.0.0.1:9/a", name="a")
    second = add_endpoint(db, "http://127.0.0.1:9/b", name="b")
    insert = ("INSERT INTO webhooks.alert_delivery_queue"
              " (delivery_id, webhook_id, event_type, event_id, payload) OVERRIDING SYSTEM VALUE"
              " VALUES (%s, %s, 'order.paid', 'evt_lent', '{\"n\": 1}')")
    with psycopg.connect(db) as conn:  # one transaction
        conn.execute(insert, (1000, first))
        conn.execute(insert, (990, second))
    assert query(db, "SELECT first_delivery_id, last_delivery_id FROM webhooks.messages") == [(990, 1000)]
    query(db, "DELETE FROM webhooks.alert_delivery_queue WHERE delivery_id = 1000")
    assert query(db, "SELECT q.delivery_id, m.message_id IS NOT NULL FROM webhooks.alert_delivery_queue q"
                     " LEFT JOIN webhooks.messages m ON m.message_id = q.message_id") == [(990, True)]


def test_a_row_never_borrows_the_message_of_an_earlier_transaction(db):
    # a committed message's deliveries only go: the same event queued again is a message of its own
    first = add_endpoint(db, "http://127.0.0.1:9/a", name="a")
    second = add_endpoint(db, "http://127.0.0.1:9/b", name="b")
    insert = ("INSERT INTO webhooks.alert_delivery_queue (webhook_id, event_type, event_id, payload)"
              " VALUES (%s, 'order.paid', 'evt_again', '{\"n\": 1}')")
    query(db, insert, (first,))
    query(db, insert, (second,))
    rows = query(db, "SELECT count(DISTINCT message_id), count(*) FROM webhooks.alert_delivery_queue")
    assert rows == [(2, 2)]
    ranges = query(db, "SELECT first_delivery_id = last_delivery_id FROM webhooks.messages")
    assert ranges == [(True,), (True,)]


def test_a_message_goes_with_its_last_delivery_though_another_message_s_lies_inside_its_range(db):
    first = add_endpoint(db, "http://127.0.0.1:9/a", name="a")
    second = add_endpoint(db, "http://127.0.0.1:9/b", name="b")
    insert = ("INSERT INTO webhooks.alert_delivery_queue (webhook_id, event_type, event_id, payload)"
              " VALUES (%s, 'order.paid', %s, '{}') RETURNING delivery_id, message_id")
    with psycopg.connect(db) as conn:  # one transaction: event A to both endpoints, event B between
        [(a1, fanned)] = conn.execute(insert, (first, "evt_a")).fetchall()
        [(_, other)] = conn.execute(insert, (first, "evt_b")).fetchall()
        [(a2, _)] = conn.execute(insert, (second, "evt_a")).fetchall()
    query(db, "DELETE FROM webhooks.alert_delivery_queue WHERE delivery_id IN (%s, %s)", (a1, a2))
    assert query(db, "SELECT message_id FROM webhooks.messages") == [(other,)]
    assert fanned != other


def sweep(db):
    """One call of sweep_messages(): (messages deleted, swept_through, bound)."""
    [(deleted,)] = query(db, "SELECT webhooks.sweep_messages(1000)")
    [(through, bound)] = query(db, "SELECT swept_through, bound FROM webhooks.message_sweep")
    return deleted, through, bound


def test_the_sweep_stops_at_its_bound(db):
    endpoint = add_endpoint(db, "http://127.0.0.1:9/x")
    enqueue(db, endpoint)
    _, _, bound = sweep(db)  # takes the bound: the messages made so far
    sweep(db)  # and the transactions that may still be making them
    enqueue(db, endpoint)  # a message past the bound, looked at by a later round
    assert sweep(db) == (0, bound, None)


def test_the_sweep_waits_for_a_transaction_that_may_still_be_making_a_message(db):
    endpoint = add_endpoint(db, "http://127.0.0.1:9/x")
    with psycopg.connect(db) as open_one:
        open_one.execute("INSERT INTO webhooks.alert_delivery_queue (webhook_id, event_type, payload)"
                         " VALUES (%s, 'order.paid', '{}')", (endpoint,))
        _, through, bound = sweep(db)
        sweep(db)
        assert sweep(db) == (0, through, bound)  # still open: nothing looked at
    assert sweep(db)[1] == bound  # ended: swept through its bound


def test_many_requests_keep_a_disabled_subscriber_out_where_its_tenant_has_an_enabled_one(db):
    on = add_endpoint(db, "http://127.0.0.1:9/on", name="on", event_types=("order.*",))
    off = add_endpoint(db, "http://127.0.0.1:9/off", name="off", event_types=("order.*",))
    query(db, "SELECT webhooks.disable_endpoint(%s, 'maintenance')", (off,))
    queued = query(db, f"SELECT ordinal, webhook_id FROM webhooks.queue_deliveries("
                       f"{requests((None, 'order.paid'), (None, 'order.refunded'))}, 'producer') ORDER BY 1")
    assert queued == [(1, on), (2, on)]


def test_a_row_given_its_message_widens_the_message_s_range_to_it(db):
    first = add_endpoint(db, "http://127.0.0.1:9/a", name="a")
    second = add_endpoint(db, "http://127.0.0.1:9/b", name="b")
    [(one, message)] = query(db, "INSERT INTO webhooks.alert_delivery_queue (webhook_id, event_type, payload)"
                                 " VALUES (%s, 'order.paid', '{}')"
                                 " RETURNING delivery_id, message_id", (first,))
    [(two,)] = query(db, "INSERT INTO webhooks.alert_delivery_queue (webhook_id, event_type, message_id)"
                         " VALUES (%s, 'order.paid', %s) RETURNING delivery_id", (second, message))
    assert query(db, "SELECT first_delivery_id, last_delivery_id FROM webhooks.messages") == [(one, two)]
    query(db, "DELETE FROM webhooks.alert_delivery_queue WHERE delivery_id = %s", (one,))
    assert query(db, "SELECT message_id FROM webhooks.messages") == [(message,)]
