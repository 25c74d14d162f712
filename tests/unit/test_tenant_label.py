"""The delivery counter's `tenant` label: bounded like the endpoint label, `other` for the rest."""

from worker.observability import DELIVERY_OUTCOMES, OTHER_TENANTS, Metrics, tenant_label
from worker.rules import tenants


def delivery_series(metrics: Metrics) -> dict[tuple[str, str], float]:
    return {(s.labels["outcome"], s.labels["tenant"]): s.value for family in metrics.registry.collect()
            for s in family.samples if s.name == "webhook_worker_deliveries_total"}


def test_the_first_tenants_by_id_keep_their_name_and_the_rest_are_other():
    assert tenant_label("default", 1, 2) == "default"
    assert tenant_label("acme", 2, 2) == "acme"
    assert tenant_label("zeta", 3, 2) == OTHER_TENANTS == "other"
    assert tenant_label("default", 1, 0) == "other"  # a limit of 0 names no tenant


def test_a_single_tenant_deployment_exports_default_series_only_each_outcome_from_the_start():
    metrics = Metrics(tenant_label_limit=100)
    assert delivery_series(metrics) == {(outcome, "default"): 0 for outcome in DELIVERY_OUTCOMES}
    metrics.count_outcome("delivered")
    metrics.count_outcome("delivered", "default", 1)
    assert delivery_series(metrics)[("delivered", "default")] == 2
    assert {tenant for _, tenant in delivery_series(metrics)} == {"default"}


def test_a_tenant_s_every_outcome_exists_from_its_first_count_and_overflow_is_summed():
    metrics = Metrics(tenant_label_limit=2)
    metrics.count_outcome("retried", "acme", 2)
    series = delivery_series(metrics)
    assert {outcome for outcome, tenant in series if tenant == "acme"} == set(DELIVERY_OUTCOMES)
    assert series[("retried", "acme")] == 1 and series[("delivered", "acme")] == 0
    metrics.count_outcome("delivered", "zeta", 3)
    metrics.count_outcome("delivered", "omega", 4)
    series = delivery_series(metrics)
    assert series[("delivered", "other")] == 2
    assert {tenant for _, tenant in series} == {"default", "acme", "other"}  # bounded: no zeta, omega


def test_no_tenant_may_be_named_like_the_overflow_label():
    problem = tenants.name_problem(OTHER_TENANTS)
    assert problem is not None and "reserved" in problem
    assert tenants.name_problem("others") is None
