"""Formats on the wire, operational events, trace context, expiry, finer retry control, --verify."""

import json

import psycopg

from tests.acceptance.test_cli import cli
from tests.receiver import Reply
from tests.support import add_endpoint, all_final, enqueue, eventually, query, statuses, wait_final
from worker.rules import signing

FAST_RETRY = {"delays": [0.1]}
ALERT = {"alert_id": 42, "title": "Disk almost full on db-1", "severity": "critical", "source": "db-1"}


def insert(db, endpoint, payload, **columns):
    names = ", ".join(["webhook_id", "event_type", "payload", *columns])
    marks = ", ".join(["%s"] * (3 + len(columns)))
    with psycopg.connect(db, autocommit=True) as conn:
        return conn.execute(f"INSERT INTO webhooks.alert_delivery_queue ({names}) VALUES ({marks})"
                            " RETURNING delivery_id",
                            (endpoint, "alert.created", json.dumps(payload), *columns.values())).fetchone()[0]


def test_pagerduty_events_are_signed_and_a_replay_keeps_the_dedup_key(db, receiver, spawn):
    secret = signing.generate_secret()
    endpoint = add_endpoint(db, receiver.url("/pd"), secret=secret, body_format="pagerduty",
                            secret_settings={"routing_key": "R0UT1NG"})
    delivery = insert(db, endpoint, ALERT)
    spawn(db)
    eventually(lambda: statuses(db, [delivery])[delivery] == "delivered", message="delivered")
    query(db, "SELECT webhooks.replay(%s)", (delivery,))
    eventually(lambda: len(receiver.to("/pd")) == 2, message="replayed")

    first, second = receiver.to("/pd")
    event_id = query(db, "SELECT event_id FROM webhooks.alert_delivery_queue")[0][0]
    sent = json.loads(first.body)
    assert sent["routing_key"] == "R0UT1NG" and sent["event_action"] == "trigger"
    assert sent["dedup_key"] == json.loads(second.body)["dedup_key"] == event_id
    assert sent["payload"]["summary"] == ALERT["title"] and sent["payload"]["severity"] == "critical"
    signing.verify(secret, first.headers, first.body)  # the signature covers the body as sent


def test_a_payload_a_format_cannot_render_is_a_dead_letter_naming_the_field(db, receiver, spawn):
    endpoint = add_endpoint(db, receiver.url("/slack"), body_format="slack")
    delivery = insert(db, endpoint, {"severity": "critical"})
    spawn(db).expect_errors("payload cannot be rendered")
    eventually(lambda: statuses(db, [delivery])[delivery] == "dead_letter", message="dead letter")
    [(category, reason, attempts)] = query(db, "SELECT failure_category, dead_letter_reason, attempts"
                                               " FROM webhooks.alert_delivery_queue")
    assert (category, attempts) == ("internal", 1) and "payload.title" in reason
    assert receiver.to("/slack") == []


def test_an_operational_event_reaches_the_ops_channel_and_never_the_failing_endpoint(db, receiver, spawn):
    add_endpoint(db, receiver.url("/ops"), event_types=("webhook.circuit.*",), body_format="slack")
    failing = add_endpoint(db, receiver.url("/failing"), retry_schedule=FAST_RETRY, max_attempts=50,
                           circuit_policy={"min_attempts": 5, "sleep_seconds": 600})
    receiver.script("/failing", Reply(503))
    with psycopg.connect(db, autocommit=True) as listener:
        listener.execute("LISTEN webhooks_endpoint_events")
        ids = enqueue(db, failing, count=10)
        spawn(db)
        eventually(lambda: receiver.to("/ops"), message="the ops channel is told")
        notices = [json.loads(n.payload) for n in listener.notifies(timeout=1.0)]
    [to_ops] = receiver.to("/ops")
    assert to_ops.headers["webhook-event-type"] == "webhook.circuit.opened"
    assert json.loads(to_ops.body)["text"].startswith("[WARNING] Endpoint ep-")
    assert {r.headers["webhook-event-type"] for r in receiver.to("/failing")} == {"alert.created"}
    assert {"endpoint_id": failing, "change": "circuit_opened"}.items() <= notices[0].items()
    assert query(db, "SELECT count(*) FROM webhooks.alert_delivery_queue WHERE webhook_id = %s"
                     " AND event_type LIKE 'webhook.%%'", (failing,)) == [(0,)]
    # the failing endpoint's rows wait behind its open circuit; nothing about it was queued for it
    assert not all_final(db, ids)


def test_traceparent_arrives_unchanged_and_is_in_every_log_line_of_the_delivery(db, receiver, spawn):
    traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    endpoint = add_endpoint(db, receiver.url("/traced"), retry_schedule=FAST_RETRY)
    receiver.script("/traced", Reply(500), Reply(200))
    delivery = insert(db, endpoint, ALERT, traceparent=traceparent)
    worker = spawn(db, logging={"level": "debug"})
    eventually(lambda: statuses(db, [delivery])[delivery] == "delivered", message="delivered")
    assert {r.headers["traceparent"] for r in receiver.to("/traced")} == {traceparent}
    lines = [line for line in worker.log_lines() if line.get("delivery_id") == delivery]
    assert len(lines) >= 2 and all(line["traceparent"] == traceparent for line in lines)


def test_an_expired_delivery_is_never_sent(db, receiver, spawn):
    endpoint = add_endpoint(db, receiver.url("/late"))
    with_ttl = add_endpoint(db, receiver.url("/ttl"))
    query(db, "SELECT webhooks.update_endpoint(%s, '{\"delivery_ttl\": \"1 second\"}')", (with_ttl,))
    with psycopg.connect(db, autocommit=True) as conn:
        explicit = conn.execute(
            "INSERT INTO webhooks.alert_delivery_queue (webhook_id, event_type, payload, expires_at,"
            " next_retry_at) VALUES (%s, 'alert.created', '{}', now() + interval '1 second',"
            " now() + interval '2 seconds') RETURNING delivery_id", (endpoint,)).fetchone()[0]
    [by_ttl] = enqueue(db, with_ttl, deliver_after=2.0)
    spawn(db)
    wait_final(db, [explicit, by_ttl], message="both final")
    final = query(db, "SELECT DISTINCT status, failure_category, dead_letter_reason"
                      " FROM webhooks.alert_delivery_queue")
    assert final == [("dead_letter", "expired", "expired before delivery")]
    assert receiver.to("/late") == [] and receiver.to("/ttl") == []


def test_category_minimum_delays_hold_at_the_receiver(db, receiver, spawn):
    endpoint = add_endpoint(db, receiver.url("/min"), retry_schedule=FAST_RETRY)
    query(db, "SELECT webhooks.update_endpoint(%s, %s)",
          (endpoint, json.dumps({"retry_policy": {"category_min_delays": {"http_5xx": 1.5}}})))
    receiver.script("/min", Reply(502), Reply(200))
    [delivery] = enqueue(db, endpoint)
    spawn(db)
    eventually(lambda: statuses(db, [delivery])[delivery] == "delivered", message="delivered")
    first, second = receiver.to("/min")
    gap = second.at - first.at
    print(f"minimum delay 1.5 s after http_5xx (schedule says 0.1 s): observed {gap:.2f} s")
    assert gap >= 1.5


def test_registration_with_verify_enables_only_an_endpoint_that_echoes_the_challenge(db, receiver):
    receiver.script("/echo", Reply(200, echo=True))
    receiver.script("/deaf", Reply(200, body=b"ok"))
    env = {"DATABASE_URL": db, "WEBHOOK_WORKER_SECURITY__ALLOW_NETWORKS": "[127.0.0.1/32]"}
    good = cli("endpoints", "add", "--name", "echoes", "--url", receiver.url("/echo"), "--verify", env=env)
    assert good.returncode == 0, good.stderr
    bad = cli("endpoints", "add", "--name", "deaf", "--url", receiver.url("/deaf"), "--verify", env=env)
    assert bad.returncode == 1 and "did not contain the challenge" in bad.stderr
    assert query(db, "SELECT name, active, disabled_reason FROM webhooks.endpoints ORDER BY id") == [
        ("echoes", True, None), ("deaf", False, "awaiting verification")]
    challenge = json.loads(receiver.to("/echo")[0].body)
    assert challenge["type"] == "webhook.endpoint.verification" and len(challenge["challenge"]) >= 24
    long_url = cli("endpoints", "add", "--name", "long", "--url", "https://x.test/" + "a" * 8200, env=env)
    assert long_url.returncode == 2 and "longer than 2,048 characters" in long_url.stderr
