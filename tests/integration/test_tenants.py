"""Tenants: the schema's boundary, fairness between tenants in the claim, and their
fleet-wide limits, in SQL."""

from __future__ import annotations

import json

import psycopg
import pytest

from tests.acceptance.test_cli import cli
from tests.receiver import Reply
from tests.support import LOOPBACK, add_endpoint, enqueue, eventually, query, statuses, wait_final
from worker.observability import Metrics


def tenant(dsn: str, name: str, **limits: object) -> int:
    """A tenant whose endpoints may reach the tests' receivers on loopback: the operator grants it
    the network, as it would grant an internal one (its own allow_networks are not the tenant's)."""
    limits.setdefault("allow_networks", LOOPBACK)
    return int(query(dsn, "SELECT webhooks.register_tenant(%s, %s)", (name, json.dumps(limits)))[0][0])


def endpoint_of(dsn: str, tenant_id: int, **settings: object) -> int:
    endpoint = add_endpoint(dsn, "http://127.0.0.1:9/hook", **settings)
    query(dsn, "UPDATE webhooks.endpoints SET tenant_id = %s WHERE id = %s", (tenant_id, endpoint))
    return endpoint


def acquire(dsn: str, batch: int = 10, tenants: list[str] | None = None,
            exclude: list[str] | None = None) -> list[tuple[int, int, str, int]]:
    """(delivery_id, endpoint, lease_token, attempt) of one claim."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(
            "SELECT delivery_id, webhook_id, lease_token::text, attempt"
            " FROM webhooks.acquire('w', %s, 30, %s, %s)", (batch, tenants, exclude)).fetchall()


def deliver(dsn: str, claimed: list[tuple[int, int, str, int]]) -> None:
    outcomes = [{"delivery_id": d, "lease_token": t, "attempt": a, "outcome": "delivered", "http_status": 200}
                for d, _, t, a in claimed]
    query(dsn, "SELECT * FROM webhooks.finish('w', %s)", (json.dumps(outcomes),))


def test_without_tenants_everything_belongs_to_default(db):
    endpoint = add_endpoint(db, "http://127.0.0.1:9/hook")
    [delivery] = enqueue(db, endpoint)
    assert query(db, "SELECT id, name FROM webhooks.tenants") == [(1, "default")]
    assert query(db, "SELECT tenant_id FROM webhooks.endpoints WHERE id = %s", (endpoint,)) == [(1,)]
    assert query(db, "SELECT tenant_id FROM webhooks.alert_delivery_queue WHERE delivery_id = %s",
                 (delivery,)) == [(1,)]


def test_queue_and_audit_rows_carry_the_endpoints_tenant_not_the_producers_word(db):
    acme = tenant(db, "acme")
    endpoint = endpoint_of(db, acme)
    # the owner could write the column; the trigger sets it from the endpoint all the same
    [(delivery,)] = query(db, "INSERT INTO webhooks.alert_delivery_queue (webhook_id, event_type, payload,"
                              " tenant_id) VALUES (%s, 'a.b', '{}', 1) RETURNING delivery_id", (endpoint,))
    assert query(db, "SELECT tenant_id FROM webhooks.alert_delivery_queue WHERE delivery_id = %s",
                 (delivery,)) == [(acme,)]
    deliver(db, acquire(db))
    assert query(db, "SELECT DISTINCT tenant_id FROM webhooks.alert_delivery_log WHERE delivery_id = %s",
                 (delivery,)) == [(acme,)]


def test_finish_writes_its_audit_rows_tenant_itself_and_other_writers_get_it_from_the_trigger(db):
    # finish() writes a row per attempt: it gives the tenant it read with the endpoint, so the
    # trigger's look-up per row is not paid there; release() leaves it to the trigger
    acme = tenant(db, "acme")
    endpoint = endpoint_of(db, acme)
    first, second = enqueue(db, endpoint, count=2)
    leases = {d: (t, a) for d, _, t, a in acquire(db)}
    trigger_calls = ("SELECT coalesce(sum(calls), 0) FROM pg_stat_xact_user_functions"
                     " WHERE schemaname = 'webhooks' AND funcname = 'fill_log_tenant'")
    with psycopg.connect(db) as conn:  # one transaction: the function counters are its own
        conn.execute("SET track_functions = 'pl'")
        token, attempt = leases[first]
        conn.execute("SELECT * FROM webhooks.finish('w', %s)", (json.dumps(
            [{"delivery_id": first, "lease_token": token, "attempt": attempt, "outcome": "delivered",
              "http_status": 200}]),))
        by_finish = conn.execute(trigger_calls).fetchone()[0]
        conn.execute("SELECT webhooks.release('w', %s)",
                     (json.dumps([{"delivery_id": second, "lease_token": leases[second][0]}]),))
        by_release = conn.execute(trigger_calls).fetchone()[0] - by_finish
    assert (by_finish, by_release) == (0, 1)
    assert query(db, "SELECT delivery_id, outcome, tenant_id FROM webhooks.alert_delivery_log"
                     " ORDER BY delivery_id") == [(first, "delivered", acme), (second, "released", acme)]


def test_a_tenant_with_many_endpoints_and_a_backlog_cannot_starve_a_tenant_with_one(db):
    big, small = tenant(db, "big"), tenant(db, "small")
    big_endpoints = [endpoint_of(db, big) for _ in range(30)]
    for endpoint in big_endpoints:
        enqueue(db, endpoint, count=20)
    lone = endpoint_of(db, small)
    small_rows = set(enqueue(db, lone, count=10))  # queued after the big tenant's 600
    claims_until_done = None
    for claim in range(1, 16):
        claimed = acquire(db, batch=10)
        assert claimed, claim
        small_rows -= {d for d, *_ in claimed}
        # the batch is shared between the tenants with due rows: the small one gets half
        assert sum(1 for _, e, *_ in claimed if e == lone) == (5 if claim <= 2 else 0), claim
        deliver(db, claimed)
        if not small_rows and claims_until_done is None:
            claims_until_done = claim
    # without fairness between tenants its endpoint is one of 31 and waits its turn: ~30 claims
    assert claims_until_done == 2


def test_a_tenants_rate_limit_holds_across_all_its_endpoints(db):
    limited = tenant(db, "limited", rate_limit_per_second=0.001, rate_limit_burst=3)
    endpoints = [endpoint_of(db, limited) for _ in range(4)]
    for endpoint in endpoints:
        enqueue(db, endpoint, count=5)
    other = add_endpoint(db, "http://127.0.0.1:9/other")
    enqueue(db, other, count=2)
    first = acquire(db, batch=50)
    assert sum(1 for _, e, *_ in first if e in endpoints) == 3  # the burst, shared by its endpoints
    assert sum(1 for _, e, *_ in first if e == other) == 2  # another tenant is not held by it
    deliver(db, first)
    assert acquire(db, batch=50) == []  # out of tokens: the rest waits, not refused
    assert query(db, "SELECT count(*) FROM webhooks.alert_delivery_queue WHERE tenant_id = %s"
                     " AND status = 'pending'", (limited,)) == [(17,)]
    # an idle worker is told to sleep until a token is due, not woken at once
    assert query(db, "SELECT webhooks.next_due_in() > 60")[0][0] is True
    assert query(db, "SELECT reason, sum(rows)::int FROM webhooks.held_back GROUP BY 1") == [
        ("tenant_rate_limited", 17)]
    query(db, "UPDATE webhooks.stats_sample SET sampled_at = now() - interval '1 hour'")
    metrics = Metrics()
    metrics.record_stats(query(db, "SELECT webhooks.queue_stats(100, '10 seconds')")[0][0])
    held = {s.labels["reason"]: s.value for family in metrics.registry.collect() for s in family.samples
            if s.name == "webhook_worker_held_back_deliveries"}
    assert held["tenant_rate_limited"] == 17 and "no_pool" not in held


def test_a_tenants_in_flight_cap_holds_across_its_endpoints(db):
    capped = tenant(db, "capped", max_in_flight=2)
    endpoints = [endpoint_of(db, capped) for _ in range(3)]
    for endpoint in endpoints:
        enqueue(db, endpoint, count=3)
    first = acquire(db, batch=50)
    assert len(first) == 2
    assert acquire(db, batch=50) == []  # two in flight: nothing more until one finishes
    # woken by the finish that frees a place: until then only the leases' end is due
    assert query(db, "SELECT webhooks.next_due_in()")[0][0] > 20
    assert query(db, "SELECT reason, sum(rows)::int FROM webhooks.held_back GROUP BY 1") == [
        ("tenant_concurrency_cap", 7)]
    deliver(db, first[:1])
    assert len(acquire(db, batch=50)) == 1


def test_a_tenants_endpoint_limit_refuses_one_more_whoever_inserts(db):
    few = tenant(db, "few", max_endpoints=2)
    endpoint_of(db, few)
    endpoint_of(db, few)
    with pytest.raises(psycopg.errors.CheckViolation, match="tenant few: at its limit of 2 endpoints"):
        endpoint_of(db, few)
    assert query(db, "SELECT count(*) FROM webhooks.endpoints WHERE tenant_id = %s", (few,)) == [(2,)]


def test_a_pool_claims_only_its_tenants_rows(db):
    big = tenant(db, "big")
    own = endpoint_of(db, big)
    shared = add_endpoint(db, "http://127.0.0.1:9/shared")
    tenant(db, "idle")
    own_rows, shared_rows = enqueue(db, own, count=3), enqueue(db, shared, count=3)
    # a pool does not wake for rows it may not claim
    assert query(db, "SELECT webhooks.next_due_in(%s, NULL)", (["idle"],))[0][0] is None
    assert query(db, "SELECT webhooks.next_due_in(%s, NULL)", (["big"],))[0][0] == 0
    assert acquire(db, tenants=["idle"]) == []
    assert {d for d, *_ in acquire(db, tenants=["big"])} == set(own_rows)
    assert {d for d, *_ in acquire(db, exclude=["big"])} == set(shared_rows)


def test_tenant_limits_are_checked_naming_the_field(db):
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="unknown field max_rows"):
        tenant(db, "x", max_rows=3)
    with pytest.raises(psycopg.errors.CheckViolation):
        tenant(db, "y", max_in_flight=0)
    with pytest.raises(psycopg.errors.NoDataFound, match="no tenant named 'nobody'"):
        query(db, "SELECT webhooks.update_tenant('nobody', '{}')")


def test_a_worker_pool_delivers_only_its_tenants_rows_and_the_rest_waits_for_theirs(db, receiver, spawn):
    big = tenant(db, "big")
    own = add_endpoint(db, receiver.url("/own"))
    query(db, "UPDATE webhooks.endpoints SET tenant_id = %s WHERE id = %s", (big, own))
    shared = add_endpoint(db, receiver.url("/shared"))
    own_rows, shared_rows = enqueue(db, own, count=3), enqueue(db, shared, count=3)
    spawn(db, "big-pool", worker={"tenants": ["big"]})
    wait_final(db, own_rows, message="the pool delivers its tenant's rows")
    assert set(statuses(db, shared_rows).values()) == {"pending"}
    # rows no live pool serves are visible, and why
    assert query(db, "SELECT reason, webhook_id, rows FROM webhooks.held_back") == [("no_pool", shared, 3)]
    assert {r.path for r in receiver.requests} == {"/own"}
    spawn(db, "the-rest", worker={"exclude_tenants": ["big"]})
    wait_final(db, shared_rows, message="the other pool delivers the rest")


def test_queue_statistics_by_tenant_are_bounded_like_the_endpoint_label(db):
    acme, zeta = tenant(db, "acme"), tenant(db, "zeta")
    enqueue(db, add_endpoint(db, "http://127.0.0.1:9/d"), count=1)
    enqueue(db, endpoint_of(db, acme), count=2)
    enqueue(db, endpoint_of(db, zeta), count=3)
    query(db, "UPDATE webhooks.stats_sample SET sampled_at = now() - interval '1 hour'")
    [(sample,)] = query(db, "SELECT webhooks.queue_stats(2, '10 seconds')")
    # the first two tenants by id by name, the rest as `other`
    assert sample["tenants"] == [
        {"tenant": "acme", "status": "pending", "deliveries": 2},
        {"tenant": "default", "status": "pending", "deliveries": 1},
        {"tenant": "other", "status": "pending", "deliveries": 3}]
    metrics = Metrics()
    metrics.record_stats(sample)
    exported = {tuple(s.labels.values()): s.value for family in metrics.registry.collect()
                for s in family.samples if s.name == "webhook_worker_tenant_queue_depth"}
    assert exported[("other", "pending")] == 3 and exported[("acme", "dead_letter")] == 0
    assert len(exported) == 3 * 5  # three tenant labels, every status


def test_the_delivery_counter_counts_each_tenant_bounded_like_the_queue_depth_label(db, receiver, spawn):
    from prometheus_client.parser import text_string_to_metric_families

    acme, zeta = tenant(db, "acme"), tenant(db, "zeta")
    endpoints = {name: add_endpoint(db, receiver.url(f"/{name}")) for name in ("default", "acme", "zeta")}
    for tenant_id, name in ((acme, "acme"), (zeta, "zeta")):
        query(db, "UPDATE webhooks.endpoints SET tenant_id = %s WHERE id = %s", (tenant_id, endpoints[name]))
    rows = (enqueue(db, endpoints["default"], count=1) + enqueue(db, endpoints["acme"], count=2)
            + enqueue(db, endpoints["zeta"], count=3))
    # the first two tenants by id (default, acme) by name, zeta as `other`
    worker = spawn(db, http={"endpoint_label_limit": 2})
    wait_final(db, rows, message="every tenant's rows delivered")

    def delivered() -> dict[tuple[str, str], float]:
        status, body = worker.get("/metrics")
        assert status == 200
        return {(s.labels["outcome"], s.labels["tenant"]): s.value
                for family in text_string_to_metric_families(body) for s in family.samples
                if s.name == "webhook_worker_deliveries_total"}

    # the counts are written after the rows are: wait for the last of them
    series = eventually(lambda: (d := delivered()).get(("delivered", "other")) == 3 and d,
                        message="zeta's deliveries counted as other")
    assert series[("delivered", "default")] == 1
    assert series[("delivered", "acme")] == 2
    assert {tenant for _, tenant in series} == {"default", "acme", "other"}
    # each tenant's every outcome is exported from its first count, at zero until it happens
    assert series[("dead_lettered", "acme")] == 0 and series[("retried", "other")] == 0
    assert len(series) == 3 * 5


def test_no_tenant_may_take_the_overflow_label_s_name(db):
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="tenant name 'other': reserved"):
        tenant(db, "other")
    assert query(db, "SELECT count(*) FROM webhooks.tenants WHERE name = 'other'") == [(0,)]


# --- operational events stay in their tenant -----------------------------------------------------

def operational_rows(dsn: str) -> dict[int, list[tuple[str, str, str]]]:
    """Each subscriber's queued operational events: (event type, endpoint it is about, reason)."""
    found: dict[int, list[tuple[str, str, str]]] = {}
    for subscriber, event_type, about, reason, row_tenant, subscriber_tenant in query(
            dsn, "SELECT q.webhook_id, q.event_type, q.payload ->> 'endpoint_name', q.payload ->> 'reason',"
                 " q.tenant_id, e.tenant_id FROM webhooks.deliveries q"
                 " JOIN webhooks.endpoints e ON e.id = q.webhook_id"
                 " WHERE q.event_type LIKE 'webhook.%%' ORDER BY q.delivery_id"):
        assert row_tenant == subscriber_tenant  # each row is its subscriber's, in its quota
        found.setdefault(subscriber, []).append((event_type, about, reason))
    return found


def test_operational_events_reach_only_their_tenants_subscribers_and_the_operators_channel(db):
    acme = tenant(db, "acme")
    tenant(db, "globex")
    query(db, "UPDATE webhooks.delivery_config SET dead_letter_alert_threshold = 1")
    ops = {name: add_endpoint(db, f"http://127.0.0.1:9/{name}-ops", name=f"{name}-ops", tenant=name,
                              event_types=("webhook.*",)) for name in ("acme", "globex")}
    operator = add_endpoint(db, "http://127.0.0.1:9/operator", name="operator-ops",
                            event_types=("webhook.*",), operational_all_tenants=True)
    # their endpoints: a circuit that opens, a dead letter that trips the notice, a 410 that
    # disables, and an operator's disable with a reason
    orders = {name: add_endpoint(db, "http://127.0.0.1:9/orders", name=f"{name}-orders", tenant=name,
                                 circuit_policy={"min_attempts": 2, "failure_ratio": 0.5})
              for name in ("acme", "globex")}
    billing = {name: add_endpoint(db, "http://127.0.0.1:9/billing", name=f"{name}-billing", tenant=name)
               for name in ("acme", "globex")}
    for endpoint in orders.values():
        enqueue(db, endpoint, count=2)
    claimed = acquire(db, batch=10)
    assert sorted(e for _, e, *_ in claimed) == sorted([*orders.values()] * 2)
    outcomes = []
    for number, (delivery, _, token, attempt) in enumerate(sorted(claimed)):
        failure = ({"outcome": "retry", "http_status": 503, "failure_category": "http_5xx"} if number % 2 == 0
                   else {"outcome": "dead_letter", "http_status": 410, "failure_category": "http_4xx",
                         "disable_endpoint": True})
        outcomes.append({"delivery_id": delivery, "lease_token": token, "attempt": attempt, **failure})
    query(db, "SELECT * FROM webhooks.finish('w', %s)", (json.dumps(outcomes),))
    query(db, "SELECT webhooks.disable_endpoint(%s, 'Globex contract 4711 unpaid')", (billing["globex"],))
    query(db, "SELECT webhooks.disable_endpoint(%s, 'Acme moved to invoices')", (billing["acme"],))

    found = operational_rows(db)
    for name, other in (("acme", "globex"), ("globex", "acme")):
        events = found[ops[name]]
        assert sorted((t, about) for t, about, _ in events) == sorted([
            ("webhook.circuit.opened", f"{name}-orders"),
            ("webhook.endpoint.dead_letters", f"{name}-orders"),
            ("webhook.endpoint.disabled", f"{name}-orders"),
            ("webhook.endpoint.disabled", f"{name}-billing")])
        assert not any(other in about or other.title() in (reason or "") for _, about, reason in events)
    disabled = ("webhook.endpoint.disabled", "globex-billing", "Globex contract 4711 unpaid")
    assert disabled in found[ops["globex"]]
    # the operator's channel, marked for it, gets every tenant's, and says whose each is
    assert sorted(found[operator]) == sorted(found[ops["acme"]] + found[ops["globex"]])
    assert query(db, "SELECT DISTINCT payload ->> 'tenant' FROM webhooks.deliveries"
                     " WHERE webhook_id = %s ORDER BY 1", (operator,)) == [("acme",), ("globex",)]
    assert set(found) == {*ops.values(), operator}
    # acme's scoped readers (row-level security) see only acme's: no globex event is theirs to read
    with psycopg.connect(db) as conn:
        conn.execute("SET ROLE webhooks_reader")
        conn.execute("SELECT set_config('webhooks.tenant', %s, true)", (str(acme),))
        seen = conn.execute("SELECT payload::text FROM webhooks.deliveries"
                            " WHERE event_type LIKE 'webhook.%%'").fetchall()
    assert len(seen) == 4 and not any("globex" in text.lower() for (text,) in seen)



def test_only_an_operator_marks_an_endpoint_for_every_tenants_operational_events(db):
    acme = tenant(db, "acme")
    endpoint = add_endpoint(db, "http://127.0.0.1:9/ops", name="acme-ops", tenant="acme")
    refused = "operational_all_tenants: only an operator may mark an endpoint"
    for statement, params in (
            ("SELECT webhooks.update_endpoint(%s, '{\"operational_all_tenants\": true}')", (endpoint,)),
            ("UPDATE webhooks.endpoints SET operational_all_tenants = true WHERE id = %s", (endpoint,)),
            ("SELECT webhooks.register_endpoint('acme-2', 'x', 'x', '[]', p_tenant => 'acme',"
             " p_operational_all_tenants => true) WHERE %s IS NOT NULL", (endpoint,))):
        with psycopg.connect(db) as conn, pytest.raises(psycopg.errors.InsufficientPrivilege, match=refused):
            # a session kept to acme, as the API keeps a scoped token's transaction
            conn.execute("SELECT set_config('webhooks.tenant', %s, true)", (str(acme),))
            conn.execute(statement, params)
    assert query(db, "SELECT name, operational_all_tenants FROM webhooks.endpoints") == [("acme-ops", False)]
    # the operator (no tenant set) may, and a scoped session may still change the endpoint's other
    # settings and unmark it
    query(db, "SELECT webhooks.update_endpoint(%s, '{\"operational_all_tenants\": true}')", (endpoint,))
    with psycopg.connect(db) as conn:
        conn.execute("SELECT set_config('webhooks.tenant', %s, true)", (str(acme),))
        for change in ('{"max_attempts": 3}', '{"operational_all_tenants": false}'):
            conn.execute("SELECT webhooks.update_endpoint(%s, %s)", (endpoint, change))
    assert query(db, "SELECT max_attempts, operational_all_tenants FROM webhooks.endpoints") == [(3, False)]


def test_a_worker_delivers_each_tenants_operational_events_to_its_own_subscriber_only(db, receiver, spawn):
    tenant(db, "acme")
    tenant(db, "globex")
    query(db, "UPDATE webhooks.delivery_config SET dead_letter_alert_threshold = 1")
    for name in ("acme", "globex"):
        add_endpoint(db, receiver.url(f"/{name}-ops"), name=f"{name}-ops", tenant=name,
                     event_types=("webhook.*",))
    add_endpoint(db, receiver.url("/operator-ops"), name="operator-ops", event_types=("webhook.*",),
                 operational_all_tenants=True)
    failing = add_endpoint(db, receiver.url("/acme-failing"), name="acme-failing", tenant="acme",
                           retry_schedule={"delays": [0.1]}, max_attempts=50,
                           circuit_policy={"min_attempts": 3, "sleep_seconds": 600})
    gone = add_endpoint(db, receiver.url("/globex-gone"), name="globex-gone", tenant="globex")
    add_endpoint(db, receiver.url("/globex-billing"), name="globex-billing", tenant="globex")
    receiver.script("/acme-failing", Reply(503))
    receiver.script("/globex-gone", Reply(410))
    enqueue(db, failing, count=5)
    enqueue(db, gone)
    disabled = cli("endpoints", "disable", "globex-billing", "--reason", "Globex contract 4711 unpaid",
                   env={"DATABASE_URL": db})
    assert disabled.returncode == 0, disabled.stderr
    spawn(db)

    def events(path: str) -> list[dict[str, object]]:
        return [{**json.loads(r.body), "type": r.headers["webhook-event-type"]} for r in receiver.to(path)]

    expected = {"/acme-ops": 1, "/globex-ops": 3, "/operator-ops": 4}
    eventually(lambda: all(len(receiver.to(path)) >= n for path, n in expected.items()),
               message="every subscriber told")
    acme, globex, everyone = events("/acme-ops"), events("/globex-ops"), events("/operator-ops")
    assert [(e["type"], e["endpoint_name"]) for e in acme] == [("webhook.circuit.opened", "acme-failing")]
    assert sorted((e["type"], e["endpoint_name"]) for e in globex) == [
        ("webhook.endpoint.dead_letters", "globex-gone"), ("webhook.endpoint.disabled", "globex-billing"),
        ("webhook.endpoint.disabled", "globex-gone")]
    assert {"reason": "Globex contract 4711 unpaid", "tenant": "globex"}.items() <= next(
        e for e in globex if e["endpoint_name"] == "globex-billing").items()
    assert sorted(map(json.dumps, everyone)) == sorted(map(json.dumps, acme + globex))
    # and no other operational row was queued for either tenant's subscriber
    assert query(db, "SELECT e.name, count(*) FROM webhooks.alert_delivery_queue q"
                     " JOIN webhooks.endpoints e ON e.id = q.webhook_id WHERE q.event_type LIKE 'webhook.%%'"
                     " GROUP BY 1 ORDER BY 1") == [("acme-ops", 1), ("globex-ops", 3), ("operator-ops", 4)]
