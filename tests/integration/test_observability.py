"""Metrics and probes, scraped over HTTP from running worker processes."""

import json

from prometheus_client.parser import text_string_to_metric_families

from tests.receiver import Reply
from tests.support import (
    WORKER_LOGIN,
    add_endpoint,
    all_final,
    enqueue,
    eventually,
    login_dsn,
    query,
    worker_dsn,
)

FAST_RETRY = {"delays": [0.1]}


def scrape(worker):
    status, body = worker.get("/metrics")
    assert status == 200
    samples = {}
    for family in text_string_to_metric_families(body):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples, name, **labels):
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def test_metrics_after_a_known_sequence_of_deliveries(db, receiver, spawn):
    ok = add_endpoint(db, receiver.url("/ok"), name="ops-receiver")
    flaky = add_endpoint(db, receiver.url("/flaky"), retry_schedule=FAST_RETRY)
    bad = add_endpoint(db, receiver.url("/bad"))
    receiver.script("/flaky", Reply(500), Reply(200))
    receiver.script("/bad", Reply(400))
    ids = enqueue(db, ok, count=3) + enqueue(db, flaky) + enqueue(db, bad)
    worker = spawn(db)
    eventually(lambda: all_final(db, ids), message="all final")
    eventually(lambda: value(scrape(worker), "webhook_worker_queue_depth", status="delivered") == 4,
               message="the queue statistics sampled")
    samples = scrape(worker)

    assert value(samples, "webhook_worker_deliveries_total", outcome="delivered") == 4
    assert value(samples, "webhook_worker_deliveries_total", outcome="retried") == 1
    assert value(samples, "webhook_worker_deliveries_total", outcome="dead_lettered") == 1
    assert value(samples, "webhook_worker_attempts_per_delivery_count") == 5
    assert value(samples, "webhook_worker_attempts_per_delivery_sum") == 3 * 1 + 2 + 1
    assert value(samples, "webhook_worker_request_duration_seconds_count") == 6
    assert value(samples, "webhook_worker_in_flight") == 0
    assert value(samples, "webhook_worker_claim_batch_size_count") >= 2
    assert value(samples, "webhook_worker_queue_depth", status="dead_letter") == 1
    assert value(samples, "webhook_worker_queue_depth", status="pending") == 0
    circuit = "webhook_worker_endpoint_circuit_state"
    assert value(samples, circuit, endpoint="ops-receiver", state="closed") == 1
    assert value(samples, circuit, endpoint="ops-receiver", state="open") == 0
    body = worker.get("/metrics")[1]
    assert "127.0.0.1" not in body and "/flaky" not in body  # no URLs in labels


def test_probes_follow_the_database(own_pg, receiver, spawn):
    worker = spawn(own_pg.url)
    eventually(lambda: worker.get("/ready")[0] == 200, message="ready")
    assert worker.get("/health")[0] == 200
    assert worker.get("/startup")[0] == 200
    assert json.loads(worker.get("/ready")[1])["schema_version"] == query(
        own_pg.url, "SELECT max(version) FROM webhooks.schema_migrations")[0][0]

    own_pg.halt("fast")
    eventually(lambda: worker.get("/ready")[0] == 503, message="not ready without the database")
    assert json.loads(worker.get("/ready")[1])["reason"] == "database unreachable"
    assert worker.get("/health")[0] == 200  # alive: restarting it would not help

    own_pg.start()
    eventually(lambda: worker.get("/ready")[0] == 200, timeout=30, message="ready again")
    endpoint = add_endpoint(own_pg.url, receiver.url("/after"))
    [delivery] = enqueue(own_pg.url, endpoint)
    eventually(lambda: all_final(own_pg.url, [delivery]), message="delivering again")
    assert worker.process.poll() is None


def test_without_a_database_a_worker_is_started_and_alive_but_not_ready(unstarted_pg, spawn):
    worker = spawn(login_dsn(unstarted_pg.url, WORKER_LOGIN), as_role=False)
    eventually(lambda: worker.logged("probes and metrics listening"), message="probes up")
    # started and alive: a restart would not bring the database back; only readiness waits for it
    assert worker.get("/health")[0] == 200
    assert worker.get("/startup")[0] == 200
    status, body = worker.get("/ready")
    assert (status, json.loads(body)["reason"]) == (503, "waiting for the database")

    from worker import schema

    unstarted_pg.start()
    schema.migrate(unstarted_pg.url)
    worker_dsn(unstarted_pg.url)
    eventually(lambda: worker.get("/ready")[0] == 200, timeout=30, message="ready")


def test_sigterm_makes_the_worker_unready_at_once(db, receiver, spawn):
    endpoint = add_endpoint(db, receiver.url("/held"))
    receiver.script("/held", Reply(hold=True))
    enqueue(db, endpoint)
    worker = spawn(db)
    eventually(lambda: receiver.holding == 1, message="a request held")
    assert worker.get("/ready")[0] == 200
    import signal

    worker.signal(signal.SIGTERM)
    eventually(lambda: worker.logged("shutdown requested: no more claims"), message="signal handled")
    status, body = worker.get("/ready")
    assert (status, json.loads(body)["reason"]) == (503, "shutting down")
    receiver.release()
    assert worker.process.wait(30) == 0
