"""Tenants (issue 21): the schema's boundary, fairness between tenants in the claim, and their
fleet-wide limits, in SQL."""

from __future__ import annotations

import json

import psycopg
import pytest

from tests.support import add_endpoint, enqueue, eventually, query, statuses, wait_final
from worker.observability import Metrics


def tenant(dsn: str, name: str, **limits: object) -> int:
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
