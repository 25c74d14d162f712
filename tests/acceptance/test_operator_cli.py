"""The operator's commands, run as subprocesses against a real database, and retention."""

import json

from tests.acceptance.test_cli import cli
from tests.support import TEST_KEYRING, add_endpoint, enqueue, query
from worker.encryption import SIGNING_SECRET


def run(db, *args):
    result = cli(*args, env={"DATABASE_URL": db})
    assert result.returncode == 0, result.stderr
    return result.stdout


def as_json(db, *args):
    return json.loads(run(db, *args, "--json"))


def dead_letter(db, endpoint, count, category="http_4xx", event_type="alert.created"):
    ids = enqueue(db, endpoint, count=count, event_type=event_type)
    query(db, "UPDATE webhooks.alert_delivery_queue SET status = 'dead_letter', failure_category = %s,"
              " dead_letter_reason = 'test', dead_lettered_at = now() WHERE delivery_id = ANY(%s)",
          (category, ids))
    return ids


def test_endpoints_show_update_and_rotate_secret(db):
    run(db, "endpoints", "add", "--name", "ops", "--url", "https://hooks.example.test/T0/SECRETPATH")
    run(db, "endpoints", "update", "ops", "--max-in-flight", "3", "--rate-limit", "5", "--burst", "2",
        "--event-type", "alert.*")
    shown = as_json(db, "endpoints", "show", "ops")
    limits = (shown["max_in_flight"], float(shown["rate_limit_per_second"]), shown["rate_limit_burst"])
    assert limits == (3, 5, 2)
    assert shown["event_types"] == ["alert.*"] and shown["secrets"] == 1
    rotated = as_json(db, "endpoints", "rotate-secret", "ops", "--expire-old-after", "24")
    assert rotated["secrets"] == 2 and rotated["signing_secret"].startswith("whsec_")
    secrets = query(db, "SELECT signing_secrets FROM webhooks.endpoints")[0][0]
    assert TEST_KEYRING.open(secrets[0]["secret"], SIGNING_SECRET, shown["id"]) == rotated["signing_secret"]
    assert secrets[0]["expires_at"] is None
    assert secrets[1]["expires_at"] is not None
    text = run(db, "endpoints", "show", "ops")
    assert "SECRETPATH" not in text and "whsec_" not in text
    bad = cli("endpoints", "update", "ops", "--max-attempts", "0", env={"DATABASE_URL": db})
    assert bad.returncode == 2 and "--max-attempts" in bad.stderr


def test_enqueue_status_and_deliveries_show(db):
    endpoint = add_endpoint(db, "http://127.0.0.1:9/x", name="target")
    queued = as_json(db, "enqueue", "--endpoint", "target", "--payload", '{"hello": 1}', "--key", "k-1")
    status = as_json(db, "status")
    assert {row["status"]: row["deliveries"] for row in status["queue"]}["pending"] == 1
    assert [e["name"] for e in status["endpoints"]] == ["target"]
    [by_id] = as_json(db, "deliveries", "show", str(queued["delivery_id"]))
    [by_key] = as_json(db, "deliveries", "show", "--key", "k-1")
    assert by_id["delivery_id"] == by_key["delivery_id"] == queued["delivery_id"]
    assert by_id["webhook_id"] == endpoint and by_id["history"] == []
    missing = cli("deliveries", "show", "999999", env={"DATABASE_URL": db})
    assert missing.returncode == 1 and "no such delivery" in missing.stderr


def test_dlq_list_and_replay_one_filtered_rate_limited_and_resumable(db):
    first = add_endpoint(db, "http://127.0.0.1:9/a", name="first")
    second = add_endpoint(db, "http://127.0.0.1:9/b", name="second")
    rejected = dead_letter(db, first, 5, "http_4xx")
    timed_out = dead_letter(db, first, 3, "timeout")
    dead_letter(db, second, 4, "http_4xx", event_type="billing.paid")

    assert len(as_json(db, "dlq", "list")) == 12
    assert [r["delivery_id"] for r in as_json(db, "dlq", "list", "--category", "timeout")] == timed_out
    assert len(as_json(db, "dlq", "list", "--endpoint", "second", "--event-type", "billing.paid")) == 4

    assert "queued again" in run(db, "replay", str(rejected[0]))
    assert as_json(db, "replay", "--all", "--endpoint", "first", "--category", "http_4xx", "--batch", "2",
                   "--rate", "1000") == {"replayed": 4}
    # an interrupted bulk replay continues where it stopped
    interrupted = as_json(db, "replay", "--all", "--endpoint", "second", "--max", "3", "--batch", "2")
    assert interrupted == {"replayed": 3}
    assert as_json(db, "replay", "--all", "--endpoint", "second") == {"replayed": 1}
    assert len(as_json(db, "dlq", "list")) == 3
    usage = cli("replay", env={"DATABASE_URL": db})
    assert usage.returncode == 2 and "--all" in usage.stderr


def test_config_show_and_set(db):
    assert as_json(db, "config", "show")["max_attempts"] == 10
    run(db, "config", "set", "max_attempts", "5")
    run(db, "config", "set", "retry_schedule", '{"delays": [1, 2]}')
    run(db, "config", "set", "rate_limit_per_second", "null")
    shown = as_json(db, "config", "show")
    assert shown["max_attempts"] == 5 and shown["retry_schedule"] == {"delays": [1, 2]}
    for args, expected in ((("max_attempts", "0"), "max_attempts:"), (("nonsense", "1"), "not a setting"),
                           (("retry_schedule", '{"delays": []}'), "retry_schedule:"),
                           (("lease_seconds", "1"), "lease_seconds:")):
        result = cli("config", "set", *args, env={"DATABASE_URL": db})
        assert result.returncode == 2, result.stderr
        assert expected in result.stderr and result.stderr.strip().count("\n") == 0


def test_retention_removes_exactly_what_it_should_in_batches(db):
    endpoint = add_endpoint(db, "http://127.0.0.1:9/x")
    old = enqueue(db, endpoint, count=25)
    recent = enqueue(db, endpoint, count=5)
    waiting = enqueue(db, endpoint, count=3)
    dead = dead_letter(db, endpoint, 2)
    query(db, "UPDATE webhooks.alert_delivery_queue SET status = 'delivered',"
              " delivered_at = now() - interval '8 days' WHERE delivery_id = ANY(%s)", (old,))
    query(db, "UPDATE webhooks.alert_delivery_queue SET status = 'delivered',"
              " delivered_at = now() - interval '6 days' WHERE delivery_id = ANY(%s)", (recent,))
    # an audit log partition from long ago, and old rows in the default partition
    query(db, "CREATE TABLE webhooks.alert_delivery_log_20200101 PARTITION OF webhooks.alert_delivery_log"
              " FOR VALUES FROM ('2020-01-01') TO ('2020-01-02')")
    query(db, "INSERT INTO webhooks.alert_delivery_log (delivery_id, webhook_id, attempt, outcome, logged_at)"
              " SELECT 1, %s, 1, 'delivered', t FROM unnest(ARRAY['2020-01-01 12:00'::timestamptz,"
              " '2019-06-01', '2019-06-02', now()]) t", (endpoint,))

    purged = [query(db, "SELECT * FROM webhooks.purge(10)")[0] for _ in range(4)]
    assert [p[0] for p in purged] == [10, 10, 5, 0]
    assert purged[0][1] == 1 and sum(p[2] for p in purged) == 2
    assert query(db, "SELECT to_regclass('webhooks.alert_delivery_log_20200101')") == [(None,)]
    remaining = {r[0] for r in query(db, "SELECT delivery_id FROM webhooks.alert_delivery_queue")}
    assert remaining == set(recent + waiting + dead)
    assert query(db, "SELECT count(*) FROM webhooks.alert_delivery_log") == [(1,)]
    # dead letters stay until an operator purges them
    assert as_json(db, "purge", "--dead-letters-older-than", "0 seconds")["dead_letters"] == 2
    assert {r[0] for r in query(db, "SELECT delivery_id FROM webhooks.alert_delivery_queue")} == set(
        recent + waiting)


def test_purge_goes_on_batch_after_batch_until_nothing_is_left(db):
    endpoint = add_endpoint(db, "http://127.0.0.1:9/x")
    query(db, "INSERT INTO webhooks.alert_delivery_queue"
              " (webhook_id, event_type, payload, status, delivered_at)"
              " SELECT %s, 'alert.created', '{}', 'delivered', now() - interval '8 days'"
              " FROM generate_series(1, 20500)", (endpoint,))
    assert as_json(db, "purge")["delivered_rows"] == 20500  # three batches of at most 10,000
    assert query(db, "SELECT count(*) FROM webhooks.alert_delivery_queue") == [(0,)]


def test_endpoints_disable_enable_and_circuit_control(db):
    endpoint = add_endpoint(db, "http://127.0.0.1:9/x", name="paging")
    assert "disabled" in run(db, "endpoints", "disable", "paging", "--reason", "maintenance window")
    assert "already disabled" in run(db, "endpoints", "disable", "paging")
    disabled = query(db, "SELECT active, disabled_reason FROM webhooks.endpoints")
    assert disabled == [(False, "maintenance window")]
    assert "enabled" in run(db, "endpoints", "enable", str(endpoint))

    run(db, "endpoints", "circuit", "paging", "open", "--until", "2999-01-01T00:00:00Z")
    assert query(db, "SELECT circuit_state FROM webhooks.webhook_health_metrics") == [("open",)]
    run(db, "endpoints", "circuit", "paging", "open")
    assert query(db, "SELECT circuit_state FROM webhooks.webhook_health_metrics") == [("forced_open",)]
    run(db, "endpoints", "circuit", "paging", "close")
    assert query(db, "SELECT circuit_state FROM webhooks.webhook_health_metrics") == [("forced_closed",)]
    run(db, "endpoints", "circuit", "paging", "reset")
    assert query(db, "SELECT circuit_state FROM webhooks.webhook_health_metrics") == [("closed",)]
    changes = [r[0] for r in query(db, "SELECT change FROM webhooks.endpoint_events ORDER BY id")]
    assert changes == ["disabled", "enabled", "circuit_forced_open", "circuit_forced_open",
                       "circuit_forced_closed", "circuit_reset"]
    assert [e["name"] for e in as_json(db, "endpoints", "list")] == ["paging"]
    unknown = cli("endpoints", "circuit", "nobody", "reset", env={"DATABASE_URL": db})
    assert unknown.returncode == 1 and "no endpoint" in unknown.stderr  # a lookup that finds nothing


def test_endpoints_add_takes_the_rate_limit_options_as_readme_shows_them(db):
    # the options arrive as a float and ints; the SQL function takes numeric
    run(db, "endpoints", "add", "--name", "ops", "--url", "https://hooks.example.test/T0/x",
        "--rate-limit", "20", "--burst", "5", "--max-in-flight", "2")
    run(db, "endpoints", "add", "--name", "slow", "--url", "https://hooks.example.test/T0/y",
        "--rate-limit", "0.5")
    add_endpoint(db, "https://hooks.example.test/T0/z", name="python", rate_limit_per_second=2.5)
    limits = query(db, "SELECT name, rate_limit_per_second, rate_limit_burst, max_in_flight"
                       " FROM webhooks.endpoints ORDER BY id")
    assert [(n, float(r), b, m) for n, r, b, m in limits] == [
        ("ops", 20.0, 5, 2), ("slow", 0.5, None, None), ("python", 2.5, None, None)]
