"""`webhook-worker event-types list|set|deprecate|unmatched` and `endpoints test` as an operator runs
them, and what `endpoints show` says of subscriptions no current type matches."""

from __future__ import annotations

import json

from tests.acceptance.test_cli import cli
from tests.support import add_endpoint, query

INVOICE_SCHEMA = {"type": "object", "required": ["invoice_id"]}


def test_the_catalogue_is_set_listed_deprecated_and_its_unmatched_subscriptions_shown(db, tmp_path):
    env = {"DATABASE_URL": db}
    schema_file = tmp_path / "invoice.json"
    schema_file.write_text(json.dumps(INVOICE_SCHEMA))
    added = cli("event-types", "set", "invoice.paid", "--description", "An invoice was paid",
                "--schema-file", str(schema_file), env=env)
    assert added.returncode == 0 and "event type invoice.paid added" in added.stdout, added.stderr
    replaced = cli("event-types", "set", "invoice.paid", "--description", "Paid",
                   "--schema", json.dumps(INVOICE_SCHEMA), "--json", env=env)
    assert replaced.returncode == 0, replaced.stderr
    assert json.loads(replaced.stdout) == {"name": "invoice.paid", "description": "Paid",
                                           "schema": INVOICE_SCHEMA, "deprecated": False, "created": False}
    listed = json.loads(cli("event-types", "list", "--json", env=env).stdout)
    assert {"name": "invoice.paid", "description": "Paid", "schema": INVOICE_SCHEMA,
            "deprecated": False, "problem": None} in listed
    table = cli("event-types", "list", env=env).stdout
    assert "invoice.paid" in table and "webhook.test" in table
    assert cli("event-types", "deprecate", "invoice.paid", env=env).returncode == 0
    assert query(db, "SELECT deprecated FROM webhooks.event_types WHERE name = 'invoice.paid'") == [(True,)]
    current = json.loads(cli("event-types", "list", "--current", "--json", env=env).stdout)
    assert "invoice.paid" not in [t["name"] for t in current]
    # an endpoint subscribed to a deprecated type and to a typo
    add_endpoint(db, "https://hooks.example.test/a", name="billing", event_types=("invoice.paid", "invoce.*"))
    unmatched = json.loads(cli("event-types", "unmatched", "--json", env=env).stdout)
    assert [(u["endpoint_name"], u["pattern"], u["problem"]) for u in unmatched] == [
        ("billing", "invoce.*", "unknown"), ("billing", "invoice.paid", "deprecated")]
    shown = cli("endpoints", "show", "billing", env=env)
    assert "subscriptions matching no current event type: invoce.* (unknown), invoice.paid (deprecated)" \
        in shown.stdout, shown.stdout
    assert json.loads(cli("endpoints", "show", "billing", "--json", env=env).stdout)[
        "unmatched_subscriptions"] == [{"pattern": "invoce.*", "problem": "unknown"},
                                       {"pattern": "invoice.paid", "problem": "deprecated"}]
    assert cli("event-types", "deprecate", "invoice.paid", "--undo", env=env).returncode == 0
    unmatched = json.loads(cli("event-types", "unmatched", "--json", env=env).stdout)
    assert [u["pattern"] for u in unmatched] == ["invoce.*"]


def test_a_bad_schema_is_refused_naming_the_option_and_nothing_is_written(db):
    env = {"DATABASE_URL": db}
    before = query(db, "SELECT count(*) FROM webhooks.event_types")
    bad = cli("event-types", "set", "a.b", "--schema", '{"type": 5}', env=env)
    assert bad.returncode == 2 and bad.stderr.startswith("webhook-worker: --schema: "), bad.stderr
    reserved = cli("event-types", "set", "webhook.mine", env=env)
    assert reserved.returncode == 2 and "NAME: types starting with 'webhook.'" in reserved.stderr
    assert query(db, "SELECT count(*) FROM webhooks.event_types") == before


def test_endpoints_test_queues_a_test_event_to_that_endpoint_alone(db):
    target = add_endpoint(db, "https://hooks.example.test/t", name="target", event_types=("order.*",))
    add_endpoint(db, "https://hooks.example.test/b", name="bystander")
    sent = cli("endpoints", "test", "target", "--json", env={"DATABASE_URL": db})
    assert sent.returncode == 0, sent.stderr
    delivery = json.loads(sent.stdout)["delivery_id"]
    assert query(db, "SELECT delivery_id, webhook_id, event_type FROM webhooks.alert_delivery_queue") == [
        (delivery, target, "webhook.test")]
    said = cli("endpoints", "test", str(target), env={"DATABASE_URL": db})
    assert said.returncode == 0 and "webhook-worker deliveries show" in said.stdout
