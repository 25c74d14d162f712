"""The event-type catalogue's rules without a database: names, schemas, payloads against schemas,
the publish decision, the setting that refuses unknown types, and the token scope rule."""

from __future__ import annotations

import pytest

from worker.config import load_config
from worker.errors import ConfigError
from worker.rules import tokens
from worker.rules.event_types import (
    EventType,
    EventTypeError,
    PayloadProblem,
    PublishProblem,
    json_pointer,
    name_problem,
    payload_problem,
    publish_problem,
    schema_from_text,
    schema_problem,
)

INVOICE = {
    "type": "object",
    "required": ["invoice_id", "lines"],
    "properties": {
        "invoice_id": {"type": "string"},
        "lines": {"type": "array", "items": {"type": "object", "properties": {"amount": {"type": "number"}}}},
        "a/b~c": {"type": "integer"},
    },
}


def test_a_json_pointer_escapes_tilde_and_slash_and_is_empty_for_the_document():
    assert json_pointer([]) == ""
    assert json_pointer(["lines", 0, "amount"]) == "/lines/0/amount"
    assert json_pointer(["a/b~c"]) == "/a~1b~0c"


def test_a_payload_that_follows_its_schema_has_no_problem():
    assert payload_problem(INVOICE, {"invoice_id": "i1", "lines": [{"amount": 3}]}) is None
    assert payload_problem(None, "anything") is None


def test_the_first_error_is_named_by_its_json_pointer():
    problem = payload_problem(INVOICE, {"invoice_id": "i1", "lines": [{"amount": 3}, {"amount": "ten"}]})
    assert problem == PayloadProblem("/lines/1/amount", 'expected a number, got the string "ten"')
    assert str(problem) == 'payload at /lines/1/amount: expected a number, got the string "ten"'
    assert payload_problem(INVOICE, {"invoice_id": "i1", "lines": [], "a/b~c": "x"}).pointer == "/a~1b~0c"
    # a missing property is an error of the object that lacks it: the payload itself here
    missing = payload_problem(INVOICE, {"lines": []})
    assert missing == PayloadProblem("", 'missing the required field "invoice_id"')
    assert str(missing) == 'payload: missing the required field "invoice_id"'


def test_a_long_message_is_cut():
    problem = payload_problem({"type": "object", "additionalProperties": False}, {"k" * 1000: 1})
    assert problem is not None and len(problem.message) == 300 and problem.message.endswith("…")


def test_a_schema_that_is_no_json_schema_is_refused_naming_where():
    assert schema_problem(INVOICE) is None
    assert schema_problem(True) is None
    assert schema_problem([1]) == "a JSON Schema is an object or a boolean"
    assert schema_problem({"type": "nonsense"}).startswith('at /type: "nonsense" is not valid')
    assert schema_problem({"properties": {"a": {"minimum": "zero"}}}) == (
        'at /properties/a/minimum: expected a number, got the string "zero"')


@pytest.mark.parametrize(("name", "problem"), [
    ("invoice.paid", None),
    ("", "must not be empty"),
    ("é" * 128, None),
    ("é" * 129, "at most 256 bytes (UTF-8)"),
    ("bad\nname", "must be printable (no control characters)"),
    ("invoice.*", "must not contain '*', which subscriptions use as a wildcard"),
    ("webhook.test", "types starting with 'webhook.' are the worker's own"),
])
def test_catalogue_names_follow_the_queues_rule_without_wildcards_or_reserved_types(name, problem):
    assert name_problem(name) == problem


def test_an_unknown_type_is_refused_only_when_the_setting_says_so():
    assert publish_problem("order.created", None, {}, require_known=False) is None
    refused = publish_problem("order.created", None, {}, require_known=True)
    assert refused == PublishProblem(
        "event_type", '"order.created" is not in the event-type catalogue '
                      "(api.require_known_event_types refuses unknown types)")


def test_a_catalogued_type_s_payload_is_checked_and_a_deprecated_one_still_accepted():
    known = EventType("invoice.paid", "", INVOICE, deprecated=True)
    valid = {"invoice_id": "i", "lines": []}
    assert publish_problem("invoice.paid", known, valid, require_known=True) is None
    refused = publish_problem("invoice.paid", known, {"invoice_id": 7, "lines": []}, require_known=False)
    assert refused == PublishProblem(
        "payload", "at /invoice_id: expected a string, got the number 7 "
                   '(the schema of event type "invoice.paid")', "/invoice_id")
    assert publish_problem("free.form", EventType("free.form", "", None, False), [1, 2], True) is None


def test_require_known_event_types_is_off_by_default_and_a_wrong_value_names_the_key(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("database:\n  url: postgresql://x/y\n")
    assert load_config(path, {}).api.require_known_event_types is False
    path.write_text("database:\n  url: postgresql://x/y\napi:\n  require_known_event_types: true\n")
    assert load_config(path, {}).api.require_known_event_types is True
    path.write_text("database:\n  url: postgresql://x/y\napi:\n  require_known_event_types: sometimes\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path, {})
    assert "api.require_known_event_types" in str(caught.value)
    path.write_text("database:\n  url: postgresql://x/y\napi:\n  require_known_event_type: true\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path, {})
    assert "api.require_known_event_type" in str(caught.value)


def test_a_tenant_admin_token_needs_a_tenant_and_an_admin_token_cannot_have_one():
    assert "tenant_admin" in tokens.ROLES
    assert tokens.scope_problem("tenant_admin", None) == (
        "a tenant_admin token administers one tenant: name it")
    assert tokens.scope_problem("tenant_admin", "acme") is None
    assert tokens.scope_problem("admin", "acme") == (
        "an admin token is every tenant's; a tenant's administrator is role tenant_admin")
    assert tokens.scope_problem("admin", None) is None
    assert tokens.scope_problem("reader", "acme") is None and tokens.scope_problem("producer", None) is None


@pytest.mark.parametrize(("key", "value"), [("schema_validation_budget_seconds", "0"),
                                            ("schema_validation_budget_seconds", "forever"),
                                            ("schema_validation_processes", "0")])
def test_the_schema_checks_settings_are_bounded_and_a_wrong_value_names_the_key(tmp_path, key, value):
    path = tmp_path / "config.yaml"
    path.write_text("database:\n  url: postgresql://x/y\n")
    api = load_config(path, {}).api
    assert (api.schema_validation_budget_seconds, api.schema_validation_processes) == (1.0, 1)
    path.write_text(f"database:\n  url: postgresql://x/y\napi:\n  {key}: {value}\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path, {})
    assert f"api.{key}" in str(caught.value)


def test_a_schema_text_nested_past_what_json_reads_is_refused_as_too_deep():
    with pytest.raises(EventTypeError) as caught:
        schema_from_text("[" * 100_000 + "]" * 100_000)
    assert str(caught.value) == "schema: nested more than 64 deep (objects and arrays within each other)"
