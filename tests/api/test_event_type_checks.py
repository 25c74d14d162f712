"""A publish over the API is checked against the event-type catalogue: a catalogued type's JSON
Schema, and (with api.require_known_event_types) that the type is catalogued at all."""

from __future__ import annotations

import json

from tests.api.server import ApiServer, api_config, make_token
from tests.support import add_endpoint, query

INVOICE_SCHEMA = {"type": "object", "required": ["invoice_id"],
                  "properties": {"invoice_id": {"type": "string"}, "lines": {"type": "array",
                                 "items": {"type": "object", "required": ["amount"],
                                           "properties": {"amount": {"type": "integer"}}}}}}


def queued(db: str, event_type: str) -> int:
    return query(db, "SELECT count(*) FROM webhooks.alert_delivery_queue WHERE event_type = %s",
                 (event_type,))[0][0]


def test_a_payload_that_breaks_its_types_schema_is_refused_naming_where(api, db):
    add_endpoint(db, "http://127.0.0.1:9/hook", event_types=["invoice.*"])
    query(db, "SELECT webhooks.upsert_event_type('invoice.paid', '', %s)", (json.dumps(INVOICE_SCHEMA),))
    producer = make_token(db, "producer")
    bad = api.post("/v1/messages", producer, {"event_type": "invoice.paid",
                                              "payload": {"invoice_id": "in_1", "lines": [{"amount": "12"}]}})
    assert bad.status == 422, bad.body
    problem = bad.json
    assert problem["field"] == "payload"
    # in JSON's words, not Python's ('12' is not of type 'integer')
    assert problem["detail"] == ('payload: at /lines/0/amount: expected an integer, got the string "12" '
                                 '(the schema of event type "invoice.paid")'), problem
    assert queued(db, "invoice.paid") == 0
    good = api.post("/v1/messages", producer, {"event_type": "invoice.paid",
                                               "payload": {"invoice_id": "in_1", "lines": [{"amount": 12}]}})
    assert good.status == 202, good.body
    assert queued(db, "invoice.paid") == 1
    # an uncatalogued type is accepted while api.require_known_event_types is off
    assert api.post("/v1/messages", producer, {"event_type": "invoice.voided", "payload": {}}).status == 202


def test_unknown_types_are_refused_when_the_setting_requires_known_ones(db):
    add_endpoint(db, "http://127.0.0.1:9/hook", event_types=["invoice.*"])
    query(db, "SELECT webhooks.upsert_event_type('invoice.paid')")
    server = ApiServer(api_config(db, require_known_event_types=True)).start()
    try:
        producer = make_token(db, "producer")
        refused = server.post("/v1/messages", producer, {"event_type": "invoice.voided", "payload": {}})
        assert refused.status == 422 and refused.json["field"] == "event_type", refused.body
        assert "not in the event-type catalogue" in refused.json["detail"]
        known = server.post("/v1/messages", producer, {"event_type": "invoice.paid", "payload": {}})
        assert known.status == 202, known.body
        assert queued(db, "invoice.voided") == 0
    finally:
        server.stop()
