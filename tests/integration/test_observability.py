"""Metrics and probes, scraped over HTTP from running worker processes."""

import json
import re
import threading

import psycopg
from prometheus_client.parser import text_string_to_metric_families

from tests.receiver import Reply
from tests.support import (
    CONNECT_TIMEOUT_SECONDS,
    HANG_SECONDS,
    ROOT,
    WORKER_LOGIN,
    add_endpoint,
    enqueue,
    eventually,
    login_dsn,
    query,
    wait_final,
    wait_started,
    worker_dsn,
)
from worker.observability import DATABASE_OPERATIONS

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
    """The sample's value; a series that is not exported fails the test (it does not read as 0)."""
    key = (name, tuple(sorted(labels.items())))
    assert key in samples, f"series {name}{labels} not exported"
    return samples[key]


def sampled(samples, name, **labels):
    """The sample's value, or None while the series is not exported yet (for waiting on it)."""
    return samples.get((name, tuple(sorted(labels.items()))))


def test_metrics_after_a_known_sequence_of_deliveries(db, receiver, spawn):
    ok = add_endpoint(db, receiver.url("/ok"), name="ops-receiver")
    flaky = add_endpoint(db, receiver.url("/flaky"), retry_schedule=FAST_RETRY)
    bad = add_endpoint(db, receiver.url("/bad"))
    receiver.script("/flaky", Reply(500), Reply(200))
    receiver.script("/bad", Reply(400))
    ids = enqueue(db, ok, count=3) + enqueue(db, flaky) + enqueue(db, bad)
    worker = spawn(db)
    wait_final(db, ids, message="all final")
    eventually(lambda: sampled(scrape(worker), "webhook_worker_queue_depth", status="delivered") == 4,
               message="the queue statistics sampled")
    samples = scrape(worker)

    assert value(samples, "webhook_worker_deliveries_total", outcome="delivered", tenant="default") == 4
    assert value(samples, "webhook_worker_deliveries_total", outcome="retried", tenant="default") == 1
    assert value(samples, "webhook_worker_deliveries_total", outcome="dead_lettered", tenant="default") == 1
    assert value(samples, "webhook_worker_attempts_per_delivery_count") == 5
    assert value(samples, "webhook_worker_attempts_per_delivery_sum") == 3 * 1 + 2 + 1
    assert value(samples, "webhook_worker_request_duration_seconds_count") == 6
    assert value(samples, "webhook_worker_in_flight") == 0
    assert value(samples, "webhook_worker_claim_batch_size_count") >= 2
    claims = value(samples, "webhook_worker_database_call_duration_seconds_count", operation="claim")
    writes = value(samples, "webhook_worker_database_call_duration_seconds_count", operation="finish")
    assert claims >= 2 and writes >= 2
    assert value(samples, "webhook_worker_database_call_duration_seconds_sum", operation="claim") > 0
    assert value(samples, "webhook_worker_queue_depth", status="dead_letter") == 1
    assert value(samples, "webhook_worker_queue_depth", status="pending") == 0
    circuit = "webhook_worker_endpoint_circuit_state"
    assert value(samples, circuit, endpoint="ops-receiver", state="closed") == 1
    assert value(samples, circuit, endpoint="ops-receiver", state="open") == 0
    body = worker.get("/metrics")[1]
    assert "127.0.0.1" not in body and "/flaky" not in body  # no URLs in labels
    # libraries' own records reach the log from warning up at level info: psycopg-pool's per-call
    # info lines ("connection given by …") would cost CPU on every database call
    chatter = [line for line in worker.log_lines() if line.get("level") in ("debug", "info")
               and not line.get("logger", "webhook-worker").startswith("webhook-worker")]
    assert not chatter, chatter[:3]


def test_retention_exports_what_it_purged_and_in_how_many_batches(db, spawn):
    endpoint = add_endpoint(db, "http://127.0.0.1:9/x")
    old, recent = enqueue(db, endpoint, count=5), enqueue(db, endpoint, count=1)
    for ids, age in ((old, "8 days"), (recent, "1 day")):  # delivered_retention: 7 days
        query(db, "UPDATE webhooks.alert_delivery_queue SET status = 'delivered',"
                  " delivered_at = now() - %s::interval WHERE delivery_id = ANY(%s)", (age, ids))
    worker = spawn(db, housekeeping={"purge_batch_size": 2})
    eventually(lambda: worker.logged("housekeeping"), message="the worker's housekeeping")
    samples = scrape(worker)
    assert value(samples, "webhook_worker_purged_rows_total", kind="delivered") == 5
    assert value(samples, "webhook_worker_purged_rows_total", kind="log") == 0
    assert value(samples, "webhook_worker_purge_batches_total") == 3  # 2 + 2 + 1: the last not full
    assert value(samples, "webhook_worker_purge_behind") == 0
    assert query(db, "SELECT delivery_id FROM webhooks.alert_delivery_queue") == [(recent[0],)]


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
    eventually(lambda: worker.get("/ready")[0] == 200, message="ready again")
    endpoint = add_endpoint(own_pg.url, receiver.url("/after"))
    [delivery] = enqueue(own_pg.url, endpoint)
    wait_final(own_pg.url, [delivery], message="delivering again")
    assert worker.process.poll() is None


def test_without_a_database_a_worker_is_started_and_alive_but_not_ready(unstarted_pg, spawn):
    worker = spawn(login_dsn(unstarted_pg.url, WORKER_LOGIN), as_role=False)
    eventually(lambda: worker.logged("probes and metrics listening"), message="probes up")
    # started and alive: a restart would not bring the database back; only readiness waits for it
    assert worker.get("/health")[0] == 200
    assert worker.get("/startup")[0] == 200
    [startup_row] = [row for row in (ROOT / "README.md").read_text().splitlines()
                     if row.startswith("| `/startup` |")]
    assert "before it has reached the database" in startup_row  # README says what this probe means
    status, body = worker.get("/ready")
    assert (status, json.loads(body)["reason"]) == (503, "waiting for the database")

    from worker import schema

    unstarted_pg.start()
    schema.migrate(unstarted_pg.url)
    worker_dsn(unstarted_pg.url)
    eventually(lambda: worker.get("/ready")[0] == 200, message="ready")


def test_a_worker_whose_claims_are_blocked_is_not_ready(db, spawn):
    # Claims wait while the worker's liveness registration is lost; /ready says so, even though the
    # database answers. Here another session takes the worker id's lock as the liveness session ends.
    worker = spawn(db, "blocked")
    wait_started([worker])
    eventually(lambda: worker.get("/ready")[0] == 200, message="ready")
    with psycopg.connect(db, autocommit=True) as holder:
        [(pid,)] = query(db, "SELECT pid FROM pg_stat_activity"
                             " WHERE application_name LIKE '%blocked liveness'")
        # queued behind the liveness session's lock before that session ends, so it is ours next
        taking = threading.Thread(target=holder.execute, args=(
            "SELECT pg_advisory_lock(webhooks.worker_lock_key('blocked'))",))
        taking.start()
        waiting = ("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
                   " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())")
        eventually(lambda: query(db, waiting) == [(1,)], message="the lock asked for")
        query(db, "SELECT pg_terminate_backend(%s)", (pid,))
        taking.join(HANG_SECONDS)
        blocked = eventually(lambda: (r := worker.get("/ready"))[0] == 503 and json.loads(r[1]),
                             message="unready while claims are blocked")
        assert blocked["reason"] == "claims blocked: the worker's liveness registration is not held"
    eventually(lambda: worker.get("/ready")[0] == 200, message="ready again once registered")
    # meanwhile it said, as it should, that another session held its id
    worker.expect_errors(*{line["event"] for line in worker.log_lines()
                           if str(line.get("event")).startswith("worker.id: 'blocked' is already in use")})


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
    assert worker.process.wait(HANG_SECONDS) == 0


def test_a_fresh_worker_exports_every_database_error_operation_at_zero(db, spawn):
    worker = spawn(db)
    wait_started([worker])
    samples = scrape(worker)
    exported = {dict(labels).get("operation") for name, labels in samples
                if name == "webhook_worker_database_errors_total"}
    assert exported == set(DATABASE_OPERATIONS)
    assert all(value(samples, "webhook_worker_database_errors_total", operation=op) == 0
               for op in DATABASE_OPERATIONS)


def test_every_database_error_operation_counted_is_one_initialised_at_zero():
    # the series are created from DATABASE_OPERATIONS; a label counted elsewhere would appear late
    source = "\n".join(path.read_text() for path in (ROOT / "worker").rglob("*.py"))
    counted = set(re.findall(r"database_errors\.labels\(\s*[\"'](\w+)[\"']", source))
    assert counted and counted <= set(DATABASE_OPERATIONS), counted - set(DATABASE_OPERATIONS)


def test_with_json_logging_every_line_is_one_json_object_while_the_database_is_down(unstarted_pg, spawn):
    worker = spawn(login_dsn(unstarted_pg.url, WORKER_LOGIN), as_role=False)
    # Each retry line follows a wait for a connection of up to the connect timeout: the cap is sized
    # from those waits, and the wait fails early only if the worker stops doing anything at all.
    eventually(lambda: sum(1 for line in worker.log_lines()
                           if line.get("event") == "database not reachable; retrying") >= 2,
               timeout=HANG_SECONDS + 2 * CONNECT_TIMEOUT_SECONDS, progress=worker.activity,
               message="the worker waiting for its database")
    # psycopg-pool logs each failed connection attempt through the standard logging module
    eventually(lambda: "error connecting" in worker.log_path.read_text(),
               message="the connection pool's own messages")
    assert worker.stop() == 0
    lines = worker.log_path.read_text().splitlines()
    parsed, not_json = [], []
    for line in lines:
        try:
            parsed.append(json.loads(line))
        except json.JSONDecodeError:
            not_json.append(line)
    assert lines and not not_json, f"{len(not_json)} of {len(lines)} lines are not JSON: {not_json[:5]}"
    assert all(isinstance(e, dict) and {"event", "level", "timestamp"} <= e.keys() for e in parsed)
    assert any(entry.get("logger", "").startswith("psycopg.pool") for entry in parsed)
