"""A publish checks its token in its own statement: one round trip to PostgreSQL once its event type's
catalogue entry is read, and what the token, the catalogue and the limiter answer is what they
answered before, from the next request on."""

from __future__ import annotations

import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from bench.sections.api import RoundTripCounter
from tests.api.server import ApiServer, api_config, make_token
from tests.support import add_endpoint, query, stored
from worker.store import event_types
from worker.store import tokens as token_store
from worker.web.context import Catalogue

MESSAGE = {"event_type": "order.created", "payload": {"order": 1}}


@pytest.fixture
def counted(db):
    """An API whose connections to PostgreSQL go through a RoundTripCounter."""
    relay = RoundTripCounter("127.0.0.1", int(conninfo_to_dict(db)["port"]))
    server = ApiServer(api_config(make_conninfo(db, port=str(relay.port)))).start()
    yield server, relay
    server.stop()
    relay.stop()


def test_a_publish_and_a_batch_take_one_round_trip_token_check_included(counted, db, receiver):
    server, relay = counted
    add_endpoint(db, receiver.url("/a"), name="a", event_types=("order.*",))
    producer = make_token(db, "producer")
    assert server.post("/v1/messages", producer, MESSAGE).status == 202  # the pool's connection made
    trips: list[int] = []
    paid = {**MESSAGE, "event_type": "order.paid"}
    for path, body in (("/v1/messages", {**MESSAGE, "idempotency_key": "one"}),
                       ("/v1/messages/batch", {"messages": [{**MESSAGE, "idempotency_key": f"b-{i}"}
                                                            for i in range(3)]}),
                       ("/v1/messages", paid),  # a type not read yet
                       ("/v1/messages/batch", {"messages": [MESSAGE, paid]})):
        before = relay.round_trips
        answer = server.post(path, producer, body)
        assert answer.status == 202, answer.body
        trips.append(relay.round_trips - before)
    # the publish's statement alone, which checks the token and the catalogue's version; before it,
    # for a type this process has not read, one that reads its catalogue entry
    assert trips == [1, 1, 2, 1]
    assert query(db, "SELECT count(*) FROM webhooks.alert_delivery_queue") == [(8,)]


def test_a_token_revoked_is_refused_on_the_very_next_publish(api, db, receiver):
    add_endpoint(db, receiver.url("/a"), name="a", event_types=("order.*",))
    token = make_token(db, "producer", name="soon-revoked")
    assert api.post("/v1/messages", token, MESSAGE).status == 202
    assert api.post("/v1/messages/batch", token, {"messages": [MESSAGE]}).status == 202
    assert stored(db, token_store.revoke, "soon-revoked")
    assert api.post("/v1/messages", token, MESSAGE).status == 401
    assert api.post("/v1/messages/batch", token, {"messages": [MESSAGE]}).status == 401
    assert query(db, "SELECT count(*) FROM webhooks.alert_delivery_queue") == [(2,)]


def test_a_catalogue_change_is_seen_by_the_very_next_publish(api, role_tokens, db, receiver):
    add_endpoint(db, receiver.url("/a"), name="a", event_types=("order.*",))
    producer = role_tokens["producer"]
    assert api.post("/v1/messages", producer, MESSAGE).status == 202
    assert api.post("/v1/messages/batch", producer, {"messages": [MESSAGE]}).status == 202
    stored(db, event_types.upsert, "order.created", schema={"type": "object", "required": ["customer"]})
    refused = api.post("/v1/messages", producer, MESSAGE)
    assert refused.status == 422 and refused.json["field"] == "payload", refused.body
    [item] = api.post("/v1/messages/batch", producer, {"messages": [MESSAGE]}).json["results"]
    assert item["status"] == 422 and item["field"] == "payload", item
    assert api.post("/v1/messages", producer, {**MESSAGE, "payload": {"customer": 7}}).status == 202
    assert query(db, "SELECT count(*) FROM webhooks.alert_delivery_queue") == [(3,)]


@pytest.mark.parametrize("path", ["/v1/messages", "/v1/messages/batch"])
def test_the_token_is_answered_before_the_body_and_a_reader_publishes_nothing(api, role_tokens, db,
                                                                              receiver, path):
    add_endpoint(db, receiver.url("/a"), name="a", event_types=("order.*",))
    good = MESSAGE if path == "/v1/messages" else {"messages": [MESSAGE]}
    unknown = "whk_" + "x" * 43
    assert api.post(path, unknown, {"no": "such field"}).status == 401
    assert api.post(path, unknown, good).status == 401
    assert api.post(path, role_tokens["reader"], {"no": "such field"}).status == 403
    refused = api.post(path, role_tokens["reader"], good)
    assert refused.status == 403 and "reader" in refused.json["detail"], refused.body
    assert api.post(path, role_tokens["producer"], {"no": "such field"}).status == 422
    assert query(db, "SELECT count(*) FROM webhooks.alert_delivery_queue") == [(0,)]
    # with the type's catalogue entry kept, the token is checked by the publish's statement alone
    assert api.post(path, role_tokens["producer"], good).status == 202
    assert api.post(path, role_tokens["reader"], good).status == 403
    assert api.post(path, unknown, good).status == 401
    assert query(db, "SELECT count(*) FROM webhooks.alert_delivery_queue") == [(1,)]


def test_failed_publishes_count_against_the_address_and_a_good_token_still_publishes_from_it(db, receiver):
    add_endpoint(db, receiver.url("/a"), name="a", event_types=("order.*",))
    server = ApiServer(api_config(db, failed_auth_per_minute=3)).start()
    try:
        producer = make_token(db, "producer")
        statuses = [server.post("/v1/messages", "whk_" + c * 43, MESSAGE).status for c in "wxyz"]
        assert statuses == [401, 401, 401, 429]
        # locked out, its address still publishes with a good token, once and again
        assert [server.post("/v1/messages", producer, MESSAGE).status for _ in range(2)] == [202, 202]
        assert server.post("/v1/messages/batch", "whk_" + "v" * 43, {"messages": [MESSAGE]}).status == 429
        metrics = server.metrics()
        assert 'webhook_api_failed_authentications_total{reason="invalid"} 3.0' in metrics
        assert 'webhook_api_failed_authentications_total{reason="rate_limited"} 2.0' in metrics
    finally:
        server.stop()
    assert query(db, "SELECT count(*) FROM webhooks.alert_delivery_queue") == [(2,)]


def test_a_catalogue_change_made_in_sql_is_seen_by_the_next_publish_too(api, role_tokens, db, receiver):
    # the version moves with any statement on the table, not only through upsert_event_type()
    add_endpoint(db, receiver.url("/a"), name="a", event_types=("order.*",))
    producer = role_tokens["producer"]
    stored(db, event_types.upsert, "order.created", schema={"type": "object", "required": ["customer"]})
    assert api.post("/v1/messages", producer, MESSAGE).status == 422
    query(db, "DELETE FROM webhooks.event_types WHERE name = 'order.created'")
    assert api.post("/v1/messages", producer, MESSAGE).status == 202


def test_the_catalogue_kept_is_one_version_bounded_and_never_older():
    kept = Catalogue(max_kept=3)
    assert kept.entries(["a"]) is None
    entry = event_types.EventType("a", "", {"type": "object"}, False)
    kept.keep(5, ["a", "b"], {"a": entry})
    assert kept.entries(["a", "b"]) == (5, {"a": entry})  # b: read, not catalogued
    assert kept.entries(["a", "c"]) is None
    kept.keep(4, ["c"], {})  # an older read: dropped
    assert kept.entries(["c"]) is None and kept.entries(["a"]) == (5, {"a": entry})
    kept.keep(6, ["c"], {})  # a newer one: what was kept at 5 is gone
    assert kept.entries(["c"]) == (6, {}) and kept.entries(["a"]) is None
    kept.keep(6, ["d", "e", "f"], {})  # past the bound: starts again
    assert kept.entries(["d", "e", "f"]) == (6, {}) and kept.entries(["c"]) is None


def test_a_batch_whose_every_message_is_refused_before_the_database_still_has_its_token_checked(api, db,
                                                                                               receiver):
    add_endpoint(db, receiver.url("/a"), name="a", event_types=("order.*",))
    token = make_token(db, "producer", name="soon-revoked")
    assert api.post("/v1/messages", token, MESSAGE).status == 202  # the type's catalogue entry is kept
    unsendable = {"messages": [{**MESSAGE, "payload": {"note": "\u0000"}}]}  # refused before SQL
    answer = api.post("/v1/messages/batch", token, unsendable)
    assert answer.status == 200 and "\\u0000" in answer.json["results"][0]["detail"], answer.body
    assert stored(db, token_store.revoke, "soon-revoked")
    assert api.post("/v1/messages/batch", token, unsendable).status == 401
    assert api.post("/v1/messages/batch", token[:-4] + "AAAA", unsendable).status == 401
