"""Promises README makes: the circuit's sleep, what opens it and what
closes it; disabling after sustained failure; replaying an expired row; the schema range /ready
accepts; what workers do on their own (retention, disabled endpoints' rows); and the metrics that
say what the database refused and what the claim holds back.

The clock is moved through the database (timestamps updated), never waited for. A disabled
endpoint's rows as dead letters of category `disabled` (tests/integration/test_circuit_categories.py)
and every `database_errors_total` series exported at zero (tests/integration/test_observability.py)
have tests of their own; here they are checked again only as steps of the scenarios that pass
through them."""

import json

import psycopg
from prometheus_client.parser import text_string_to_metric_families

from tests.receiver import Reply
from tests.support import (
    add_endpoint,
    enqueue,
    eventually,
    query,
    statuses,
    wait_final,
    wait_started,
    worker_dsn,
)
from worker import schema

# A failure the circuit counts; far in the future, so the failed rows are not due again in the test.
UNAVAILABLE = {"outcome": "retry", "http_status": 503, "failure_category": "http_5xx", "retry_after_s": 3600,
               "error": "HTTP 503"}
REJECTED = {"outcome": "dead_letter", "http_status": 400, "failure_category": "http_4xx", "error": "HTTP 400",
            "reason": "HTTP 400"}
DELIVERED = {"outcome": "delivered", "http_status": 200}


def claim_and_finish(db, endpoint, *outcomes, worker="w"):
    """Queue one row per outcome for the endpoint, claim exactly that many and finish them with those
    outcomes in that order, as webhooks_worker."""
    enqueue(db, endpoint, count=len(outcomes))
    with psycopg.connect(worker_dsn(db), autocommit=True) as conn:
        claimed = conn.execute("SELECT delivery_id, lease_token, attempt, webhook_id"
                               " FROM webhooks.acquire(%s, %s, 30)", (worker, len(outcomes))).fetchall()
        assert [c[3] for c in claimed] == [endpoint] * len(outcomes)
        conn.execute("SELECT * FROM webhooks.finish(%s, %s)", (worker, json.dumps([
            {"delivery_id": d, "lease_token": str(t), "attempt": a, **fields}
            for (d, t, a, _), fields in zip(claimed, outcomes, strict=True)]),))


def claimable(db):
    with psycopg.connect(worker_dsn(db), autocommit=True) as conn:
        return [r[0] for r in conn.execute("SELECT delivery_id FROM webhooks.acquire('peek', 100, 30)")]


def health(db, endpoint, columns):
    return query(db, f"SELECT {columns} FROM webhooks.webhook_health_metrics WHERE webhook_id = %s",
                 (endpoint,))[0]


def changes(db, endpoint):
    return [r[0] for r in query(db, "SELECT change FROM webhooks.endpoint_events WHERE webhook_id = %s"
                                    " ORDER BY id", (endpoint,))]


def end_the_sleep(db, endpoint):
    """Move the circuit's clock: its sleep is over now."""
    query(db, "UPDATE webhooks.webhook_health_metrics SET circuit_open_until = now() - interval '1 s'"
              " WHERE webhook_id = %s", (endpoint,))


def sleep_seconds(db, endpoint):
    """The sleep the open circuit is in: the column, and the span it set (they must agree)."""
    state, sleep, span = health(db, endpoint, "circuit_state, circuit_sleep_seconds,"
                                " extract(epoch FROM circuit_open_until - circuit_opened_at)::integer")
    assert state == "open"
    assert sleep == span
    return sleep


def test_each_failed_round_of_probes_doubles_the_circuit_s_sleep_up_to_its_cap(db):
    endpoint = add_endpoint(db, "http://127.0.0.1:9/down", max_in_flight=10, circuit_policy={
        "min_attempts": 2, "failure_ratio": 0.5, "window_seconds": 60, "sleep_seconds": 10,
        "max_sleep_seconds": 25, "probes": 1, "probe_success_ratio": 1})
    claim_and_finish(db, endpoint, UNAVAILABLE, UNAVAILABLE)
    assert sleep_seconds(db, endpoint) == 10
    enqueue(db, endpoint)
    assert claimable(db) == []  # nothing is claimed while it sleeps

    sleeps = []
    for _ in range(3):
        end_the_sleep(db, endpoint)
        claim_and_finish(db, endpoint, UNAVAILABLE)  # the one probe fails
        sleeps.append(sleep_seconds(db, endpoint))
    assert sleeps == [20, 25, 25]  # doubled, then held at max_sleep_seconds
    assert changes(db, endpoint) == ["circuit_opened"] + ["circuit_half_open", "circuit_opened"] * 3


def test_a_storm_of_400s_does_not_open_the_circuit_that_as_many_503s_open(db):
    policy = {"min_attempts": 5, "failure_ratio": 0.6, "window_seconds": 60, "sleep_seconds": 60, "probes": 1}
    rejecting = add_endpoint(db, "http://127.0.0.1:9/rejects", max_in_flight=20, circuit_policy=policy)
    failing = add_endpoint(db, "http://127.0.0.1:9/fails", max_in_flight=20, circuit_policy=policy)

    claim_and_finish(db, rejecting, *[REJECTED] * 10)
    assert health(db, rejecting, "circuit_state, window_attempts, window_failures") == ("closed", 10, 0)
    assert changes(db, rejecting) == []
    assert set(query(db, "SELECT status FROM webhooks.alert_delivery_queue WHERE webhook_id = %s",
                     (rejecting,))) == {("dead_letter",)}
    # the same number of availability failures under the same policy does open it
    claim_and_finish(db, failing, *[UNAVAILABLE] * 10)
    assert health(db, failing, "circuit_state, window_failures") == ("open", 10)


def test_a_receiver_answering_400_to_everything_leaves_the_circuit_closed(db, receiver, spawn):
    # the same, end to end: the worker classifies real 400 answers, finish() counts them
    endpoint = add_endpoint(db, receiver.url("/strict"), max_in_flight=20, circuit_policy={
        "min_attempts": 5, "failure_ratio": 0.6, "window_seconds": 60, "sleep_seconds": 60, "probes": 1})
    receiver.script("/strict", Reply(400))
    ids = enqueue(db, endpoint, count=20)
    spawn(db)
    wait_final(db, ids, message="every row answered")
    assert set(statuses(db, ids).values()) == {"dead_letter"}
    assert len(receiver.to("/strict")) == 20  # each sent once: nothing held back by a circuit
    assert health(db, endpoint, "circuit_state, window_attempts, window_failures") == ("closed", 20, 0)
    assert changes(db, endpoint) == []


def test_probe_success_ratio_decides_whether_a_round_of_probes_closes_the_circuit(db):
    # Two endpoints, the same round of 4 probes (2 succeed, 2 fail), different probe_success_ratio.
    results = {}
    for ratio in (0.5, 0.75):
        endpoint = add_endpoint(db, f"http://127.0.0.1:9/probed-{ratio}", max_in_flight=10, circuit_policy={
            "min_attempts": 4, "failure_ratio": 0.5, "window_seconds": 60, "sleep_seconds": 10,
            "max_sleep_seconds": 100, "probes": 4, "probe_success_ratio": ratio})
        claim_and_finish(db, endpoint, *[UNAVAILABLE] * 4)
        assert sleep_seconds(db, endpoint) == 10
        end_the_sleep(db, endpoint)
        claim_and_finish(db, endpoint, DELIVERED, UNAVAILABLE, DELIVERED, UNAVAILABLE)
        results[ratio] = health(db, endpoint, "circuit_state, circuit_sleep_seconds")
    assert results == {0.5: ("closed", None),  # 2 of 4 is at least 50 %
                       0.75: ("open", 20)}     # 2 of 4 is under 75 %: reopened, sleep doubled


def test_no_success_for_disable_after_disables_the_endpoint_and_its_rows_become_dead_letters(db):
    failing = add_endpoint(db, "http://127.0.0.1:9/failing", max_in_flight=10)
    recovering = add_endpoint(db, "http://127.0.0.1:9/recovering", max_in_flight=10)
    [[disable_after]] = query(db, "SELECT extract(epoch FROM disable_after)::bigint"
                                  " FROM webhooks.delivery_config")
    assert disable_after == 5 * 86400  # README: no success for 5 days

    def failing_since(endpoint, seconds_ago):
        query(db, "UPDATE webhooks.webhook_health_metrics"
                  " SET failing_since = now() - make_interval(secs => %s) WHERE webhook_id = %s",
              (seconds_ago, endpoint))

    def active(endpoint):
        return query(db, "SELECT active FROM webhooks.endpoints WHERE id = %s", (endpoint,))[0][0]

    claim_and_finish(db, failing, UNAVAILABLE)
    assert health(db, failing, "failing_since IS NOT NULL") == (True,)
    failing_since(failing, disable_after - 3600)  # failing for an hour less than the window
    claim_and_finish(db, failing, UNAVAILABLE)
    assert active(failing)
    failing_since(failing, disable_after + 60)  # and now for a minute more
    claim_and_finish(db, failing, UNAVAILABLE)
    assert not active(failing)
    [(change, reason, decided_by)] = query(db, "SELECT change, reason, decided_by"
                                               " FROM webhooks.endpoint_events WHERE webhook_id = %s",
                                           (failing,))
    assert (change, decided_by) == ("disabled", "worker w")
    assert reason.startswith("no successful delivery since ")

    # a success within the batch ends the failing spell: no disabling, however long it lasted
    failing_since(recovering, disable_after + 60)
    claim_and_finish(db, recovering, UNAVAILABLE, DELIVERED)
    assert active(recovering)
    assert health(db, recovering, "failing_since") == (None,)

    # the disabled endpoint's rows wait, then become dead letters once their retry window is over
    waiting = [r[0] for r in query(db, "SELECT delivery_id FROM webhooks.alert_delivery_queue"
                                       " WHERE webhook_id = %s", (failing,))]
    assert len(waiting) == 3 and set(statuses(db, waiting).values()) == {"retrying"}
    query(db, "UPDATE webhooks.alert_delivery_queue SET scheduled_at = now() - interval '30 days'"
              " WHERE webhook_id = %s", (failing,))
    with psycopg.connect(worker_dsn(db), autocommit=True) as conn:
        assert conn.execute("SELECT webhooks.expire_disabled_endpoint_rows()").fetchone() == (3,)
    assert set(query(db, "SELECT status, dead_letter_reason FROM webhooks.alert_delivery_queue"
                         " WHERE webhook_id = %s", (failing,))) == {("dead_letter", "endpoint disabled")}


def test_past_max_deferrals_a_deferral_counts_as_an_attempt_so_deferring_forever_ends(db):
    # (tests/integration/test_queue_model.py states this as an invariant, but its random walks
    # rarely defer one row past the cap: this is the sequence itself.)
    query(db, "UPDATE webhooks.delivery_config SET max_deferrals = 2")
    endpoint = add_endpoint(db, "http://127.0.0.1:9/busy", max_attempts=2)
    [delivery] = enqueue(db, endpoint)
    deferred = {"outcome": "deferred", "http_status": 429, "failure_category": "rate_limited",
                "retry_after_s": 0, "error": "HTTP 429"}
    seen = []
    with psycopg.connect(worker_dsn(db), autocommit=True) as conn:
        for _ in range(4):
            [(lease, attempt)] = conn.execute("SELECT lease_token, attempt FROM webhooks.acquire('w', 1, 30)")
            conn.execute("SELECT * FROM webhooks.finish('w', %s)", (json.dumps([
                {"delivery_id": delivery, "lease_token": str(lease), "attempt": attempt, **deferred}]),))
            seen += query(db, "SELECT status, attempts, deferrals FROM webhooks.alert_delivery_queue")
    assert seen == [("retrying", 0, 1), ("retrying", 0, 2),   # given back, up to the cap
                    ("retrying", 1, 3),                       # past it: an attempt
                    ("dead_letter", 2, 4)]                    # and attempts run out
    assert query(db, "SELECT failure_category, dead_letter_reason FROM webhooks.alert_delivery_queue") == [
        ("rate_limited", "attempts exhausted: HTTP 429")]


def test_a_replayed_expired_row_is_claimed_and_sent_not_expired_again(db):
    endpoint = add_endpoint(db, "http://127.0.0.1:9/late")
    [[delivery]] = query(db, "INSERT INTO webhooks.alert_delivery_queue"
                             " (webhook_id, event_type, payload, expires_at)"
                             " VALUES (%s, 'alert.created', '{}', now() + interval '1 hour')"
                             " RETURNING delivery_id", (endpoint,))
    query(db, "UPDATE webhooks.alert_delivery_queue SET expires_at = now() - interval '1 s'"
              " WHERE delivery_id = %s", (delivery,))
    assert claimable(db) == []  # the claim expires it instead of sending it late
    assert query(db, "SELECT status, failure_category FROM webhooks.alert_delivery_queue") == [
        ("dead_letter", "expired")]
    assert query(db, "SELECT webhooks.replay(%s)", (delivery,)) == [(True,)]
    assert claimable(db) == [delivery]
    assert query(db, "SELECT status, attempts, replays FROM webhooks.alert_delivery_queue") == [
        ("delivering", 1, 1)]


# --- what a worker process does ------------------------------------------------------------------

def scrape(worker):
    status, body = worker.get("/metrics")
    assert status == 200
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(body) for sample in family.samples}


def ready(worker):
    status, body = worker.get("/ready")
    return status, json.loads(body) if body else {}


def test_ready_accepts_exactly_the_supported_schema_versions(db, spawn):
    low, high = schema.MIN_SUPPORTED_VERSION, schema.MAX_SUPPORTED_VERSION

    def at_version(version):
        """Make `version` the schema's recorded version (rows above it removed, it recorded)."""
        query(db, "DELETE FROM webhooks.schema_migrations WHERE version > %s", (version,))
        query(db, "INSERT INTO webhooks.schema_migrations (version, name, checksum) VALUES (%s, 'test', '')"
                  " ON CONFLICT DO NOTHING", (version,))
        assert query(db, "SELECT webhooks.schema_version()") == [(version,)]

    worker = spawn(db)
    wait_started([worker])
    seen = {}
    for version in (low, high, high + 1, low - 1, low):
        if version < low:
            query(db, "DELETE FROM webhooks.schema_migrations WHERE version >= %s", (low,))
        at_version(version)
        seen[version] = eventually(lambda v=version: (r := ready(worker))[1].get("schema_version") == v and r,
                                   message=f"/ready at schema {version}")
    outside = f"schema version {{}} outside {low}-{high}"
    assert seen == {low: (200, {"ready": True, "schema_version": low}),
                    high: (200, {"ready": True, "schema_version": high}),
                    high + 1: (503, {"ready": False, "schema_version": high + 1,
                                     "reason": outside.format(high + 1)}),
                    low - 1: (503, {"ready": False, "schema_version": low - 1,
                                    "reason": outside.format(low - 1)})}


def test_workers_apply_retention_and_dead_letter_disabled_endpoints_expired_rows_by_themselves(db, spawn):
    kept = add_endpoint(db, "http://127.0.0.1:9/kept")
    disabled = add_endpoint(db, "http://127.0.0.1:9/disabled")
    old, recent = enqueue(db, kept, count=3), enqueue(db, kept, count=2)
    for ids, age in ((old, "8 days"), (recent, "6 days")):  # delivered_retention: 7 days
        query(db, "UPDATE webhooks.alert_delivery_queue SET status = 'delivered',"
                  " delivered_at = now() - %s::interval WHERE delivery_id = ANY(%s)", (age, ids))
    waiting = enqueue(db, disabled, count=2)
    query(db, "SELECT webhooks.disable_endpoint(%s, 'maintenance')", (disabled,))
    query(db, "UPDATE webhooks.alert_delivery_queue SET scheduled_at = now() - interval '30 days'"
              " WHERE delivery_id = ANY(%s)", (waiting,))

    worker = spawn(db)
    eventually(lambda: worker.logged("housekeeping"), message="the worker's housekeeping")
    remaining = dict(query(db, "SELECT delivery_id, status FROM webhooks.alert_delivery_queue"))
    assert remaining == {**dict.fromkeys(recent, "delivered"), **dict.fromkeys(waiting, "dead_letter")}
    assert set(query(db, "SELECT dead_letter_reason FROM webhooks.alert_delivery_queue"
                         " WHERE delivery_id = ANY(%s)", (waiting,))) == {("endpoint disabled",)}
    [done] = [line for line in worker.log_lines() if line.get("event") == "housekeeping"]
    assert (done["purged_delivered"], done["expired_rows"]) == (3, 2)


def test_held_back_deliveries_by_reason_and_circuit_labels_for_at_most_the_label_limit(db, spawn):
    # One endpoint per reason, registered in this order (ids ascending); a row due on each, held back.
    capped = add_endpoint(db, "http://127.0.0.1:9/capped", name="capped", max_in_flight=1)
    enqueue(db, capped, count=6)
    with psycopg.connect(worker_dsn(db), autocommit=True) as conn:  # one in flight: the cap is reached
        assert len(conn.execute("SELECT * FROM webhooks.acquire('elsewhere', 1, 600)").fetchall()) == 1
    disabled = add_endpoint(db, "http://127.0.0.1:9/disabled", name="disabled")
    query(db, "SELECT webhooks.disable_endpoint(%s, 'maintenance')", (disabled,))
    paused = add_endpoint(db, "http://127.0.0.1:9/paused", name="paused")
    query(db, "UPDATE webhooks.webhook_health_metrics SET paused_until = now() + interval '1 hour'"
              " WHERE webhook_id = %s", (paused,))
    tripped = add_endpoint(db, "http://127.0.0.1:9/open", name="tripped")
    query(db, "SELECT webhooks.set_circuit(%s, 'open')", (tripped,))
    limited = add_endpoint(db, "http://127.0.0.1:9/limited", name="limited", rate_limit_per_second=0.001,
                           rate_limit_burst=1)
    query(db, "UPDATE webhooks.webhook_health_metrics SET rate_tokens = 0, rate_refilled_at = now()"
              " WHERE webhook_id = %s", (limited,))
    for endpoint, count in ((disabled, 1), (paused, 2), (tripped, 3), (limited, 4)):
        enqueue(db, endpoint, count=count)
    expected = {"concurrency_cap": 5, "endpoint_disabled": 1, "paused": 2, "circuit_open": 3,
                "rate_limited": 4}

    worker = spawn(db, http={"endpoint_label_limit": 2})
    wait_started([worker])

    def held_back():
        samples = scrape(worker)
        return {dict(labels)["reason"]: value for (name, labels), value in samples.items()
                if name == "webhook_worker_held_back_deliveries"}

    # everything was set up before the worker started, so its first sample shows it all
    eventually(lambda: any(held_back().values()), message="held back deliveries sampled")
    assert held_back() == expected
    labelled = {dict(labels)["endpoint"] for name, labels in scrape(worker)
                if name == "webhook_worker_endpoint_circuit_state"}
    assert labelled == {"capped", "disabled"}  # the first two endpoints by id, no others
    assert all(s == "pending" for s in statuses(db, [r[0] for r in query(
        db, "SELECT delivery_id FROM webhooks.alert_delivery_queue WHERE locked_by IS NULL")]).values())


def test_database_errors_total_counts_each_failed_claim_finish_stats_and_housekeeping_call(own_pg, receiver,
                                                                                          spawn):
    db = own_pg.url
    acquire = "FUNCTION webhooks.acquire(text, integer, integer, text[], text[])"
    purge = "FUNCTION webhooks.purge(integer)"
    endpoint = add_endpoint(db, receiver.url("/held"))
    worker = spawn(db, housekeeping={"interval_seconds": 0.2, "purge_budget_seconds": 0.2})
    wait_started([worker])

    def errors():
        return {dict(labels)["operation"]: value for (name, labels), value in scrape(worker).items()
                if name == "webhook_worker_database_errors_total"}

    assert errors() == {"claim": 0, "finish": 0, "stats": 0, "housekeeping": 0}
    # Retention the database refuses.
    query(db, f"REVOKE EXECUTE ON {purge} FROM webhooks_worker")
    eventually(lambda: errors()["housekeeping"] > 0, message="failed housekeeping counted")
    query(db, f"GRANT EXECUTE ON {purge} TO webhooks_worker")
    # A claim the database refuses (claims pause while the database is unreachable: no liveness).
    query(db, f"REVOKE EXECUTE ON {acquire} FROM webhooks_worker")
    eventually(lambda: errors()["claim"] > 0, message="failed claims counted")
    query(db, f"GRANT EXECUTE ON {acquire} TO webhooks_worker")
    # An outcome, and statistics, while the database is down.
    receiver.script("/held", Reply(hold=True))
    ids = enqueue(db, endpoint)
    eventually(lambda: receiver.holding == 1, message="a request held")
    own_pg.halt("fast")
    receiver.script("/held", Reply(200))
    receiver.release()  # its outcome cannot be written while the database is down
    eventually(lambda: errors()["finish"] > 0 and errors()["stats"] > 0,
               message="failed finishes and statistics counted")
    own_pg.start()
    wait_final(db, ids, message="delivered once the database is back")
    assert statuses(db, ids) == {ids[0]: "delivered"}
    assert worker.process.poll() is None
