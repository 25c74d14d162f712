"""The one gate for queueing (webhooks.queue_deliveries(), sql/functions/enqueue.sql): every function
that queues a delivery goes through it, and the rules it holds apply to each way in alike."""

from __future__ import annotations

import re

import psycopg
import pytest

from tests.support import add_endpoint, query

GATE = "queue_deliveries"
# Writing a delivery: a new row, or a finished one put back in the queue (a replay counts it).
INSERTS = re.compile(r"\bINSERT\s+INTO\s+(?:webhooks\s*\.\s*)?alert_delivery_queue\b", re.IGNORECASE)
REQUEUES = re.compile(r"\breplays\s*=\s*(?:\w+\s*\.\s*)?replays\s*\+\s*1", re.IGNORECASE)
# Every way in that is a function: each must reach the gate, directly or through another of these.
WAYS_IN = ("enqueue", "publish", "observer_queue_alert", "api_publish", "api_publish_batch", "api_publish_as",
           "api_publish_batch_as", "send_test_event", "replay", "replay_dead_letters", "api_replay_step",
           "publish_operational", "record_endpoint_event", "table_trigger_fire", "table_trigger_invoke",
           "table_trigger_backfill_step")


def function_sources(db: str) -> dict[str, str]:
    """Every function of every schema but the system's, by name, with its source (overloads joined)."""
    found: dict[str, str] = {}
    for name, source in query(db, "SELECT p.proname, p.prosrc FROM pg_proc p"
                                  " JOIN pg_namespace n ON n.oid = p.pronamespace"
                                  " WHERE n.nspname NOT IN ('pg_catalog', 'information_schema')"):
        found[name] = found.get(name, "") + "\n" + source
    return found


def test_every_function_that_queues_a_delivery_goes_through_the_gate(db):
    sources = function_sources(db)
    writers = sorted(name for name, source in sources.items()
                     if INSERTS.search(source) or REQUEUES.search(source))
    assert writers == [GATE], f"functions writing deliveries past the gate: {set(writers) - {GATE}}"

    def reaches(name: str, seen: frozenset[str] = frozenset()) -> bool:
        source = sources.get(name, "")
        if re.search(rf"\b{GATE}\s*\(", source):
            return True
        called = {other for other in sources if other not in seen | {name}
                  and re.search(rf"\bwebhooks\s*\.\s*{other}\s*\(", source)}
        return any(reaches(other, seen | {name}) for other in called)

    assert [name for name in WAYS_IN if not reaches(name)] == []


def test_the_gate_is_granted_to_nobody(db):
    # a caller could say it is the worker, whom no quota refuses and who may queue 'webhook.*' types
    assert query(db, "SELECT count(*) FROM pg_proc p, aclexplode(coalesce(p.proacl, '{}')) a"
                     " WHERE p.proname = %s AND a.grantee <> p.proowner", (GATE,)) == [(0,)]


def test_a_message_none_of_whose_subscribers_in_a_tenant_is_enabled_is_kept_for_that_tenant(db):
    # one publish, two tenants: acme's subscriber is enabled, globex's only one is disabled. Each
    # tenant's part is a message of its own: globex's is kept as a dead letter, not dropped.
    globex = query(db, "SELECT webhooks.register_tenant('globex')")[0][0]
    acme_hook = add_endpoint(db, "http://127.0.0.1:9/a", name="acme-hook", event_types=("order.*",))
    globex_hook = add_endpoint(db, "http://127.0.0.1:9/g", name="globex-hook", event_types=("order.*",))
    query(db, "UPDATE webhooks.endpoints SET tenant_id = %s WHERE id = %s", (globex, globex_hook))
    query(db, "SELECT webhooks.disable_endpoint(%s, 'maintenance')", (globex_hook,))
    assert query(db, "SELECT webhooks.publish('order.paid', '{\"n\": 1}')") == [(2,)]
    assert query(db, "SELECT webhook_id, status, failure_category, attempts"
                     " FROM webhooks.alert_delivery_queue ORDER BY webhook_id") == [
        (acme_hook, "pending", None, 0), (globex_hook, "dead_letter", "disabled", 0)]


def test_operational_events_follow_the_disabled_rule_too(db):
    # the worker's own events go to explicit subscribers; a disabled one keeps them as dead letters
    subject = add_endpoint(db, "http://127.0.0.1:9/s", name="subject")
    ops = add_endpoint(db, "http://127.0.0.1:9/ops", name="ops", event_types=("webhook.endpoint.*",))
    query(db, "SELECT webhooks.disable_endpoint(%s, 'maintenance')", (ops,))
    query(db, "SELECT webhooks.disable_endpoint(%s, 'going away')", (subject,))
    assert query(db, "SELECT webhook_id, event_type, status, failure_category"
                     " FROM webhooks.alert_delivery_queue ORDER BY delivery_id") == [
        (ops, "webhook.endpoint.disabled", "dead_letter", "disabled")]


def test_a_session_kept_to_a_tenant_queues_for_its_tenant_only(db):
    globex = query(db, "SELECT webhooks.register_tenant('globex')")[0][0]
    mine = add_endpoint(db, "http://127.0.0.1:9/m", name="mine", event_types=("order.*",))
    theirs = add_endpoint(db, "http://127.0.0.1:9/t", name="theirs", event_types=("order.*",))
    query(db, "UPDATE webhooks.endpoints SET tenant_id = %s WHERE id = %s", (globex, mine))
    with psycopg.connect(db) as conn:
        conn.execute("SELECT set_config('webhooks.tenant', %s, true)", (str(globex),))
        assert conn.execute("SELECT webhooks.publish('order.paid', '{}')").fetchone() == (1,)
        with pytest.raises(psycopg.errors.ForeignKeyViolation, match="no such endpoint"):
            conn.execute("SELECT webhooks.enqueue(%s, 'order.paid', '{}')", (theirs,))
    assert query(db, "SELECT count(*) FROM webhooks.alert_delivery_queue") == [(0,)]  # rolled back
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute(f"SET webhooks.tenant = {globex}")
        conn.execute("SELECT webhooks.publish('order.paid', '{}')")
    assert query(db, "SELECT DISTINCT webhook_id FROM webhooks.alert_delivery_queue") == [(mine,)]


def test_the_gate_takes_many_requests_in_one_call_as_a_statement_trigger_would(db):
    # a statement-level trigger with a transition table passes its rows at once: one call, one
    # INSERT, each row answered with its ordinal; the rules hold per request (here, per tenant: the
    # other tenant's only subscriber is disabled, so it keeps each message as a dead letter)
    hook = add_endpoint(db, "http://127.0.0.1:9/h", name="h", event_types=("row.*",))
    globex = query(db, "SELECT webhooks.register_tenant('globex')")[0][0]
    off = add_endpoint(db, "http://127.0.0.1:9/off", name="off", event_types=("row.*",))
    query(db, "UPDATE webhooks.endpoints SET tenant_id = %s WHERE id = %s", (globex, off))
    query(db, "SELECT webhooks.disable_endpoint(%s, 'maintenance')", (off,))
    requests = """ARRAY(
            SELECT ROW(n, NULL, 'row.changed', NULL, 'row-' || n, jsonb_build_object('n', n), NULL, NULL,
                       NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)::webhooks.delivery_request
            FROM generate_series(1, 50) n)"""
    rows = query(db, f"SELECT g.ordinal, g.webhook_id, g.created FROM webhooks.queue_deliveries({requests},"
                     " 'producer') g ORDER BY g.ordinal, g.webhook_id")
    assert rows == [(n, endpoint, True) for n in range(1, 51) for endpoint in (hook, off)]
    assert query(db, "SELECT webhook_id, status, count(*), count(DISTINCT message_id)"
                     " FROM webhooks.alert_delivery_queue GROUP BY 1, 2 ORDER BY 1") == [
        (hook, "pending", 50, 50), (off, "dead_letter", 50, 50)]
    # again: every key is there already, so nothing is made and each answers its row
    again = query(db, f"SELECT g.ordinal, g.created FROM webhooks.queue_deliveries({requests}, 'producer') g")
    assert sorted(again) == [(n, False) for n in range(1, 51) for _ in (hook, off)]
