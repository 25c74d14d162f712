"""POST /v1/messages/batch: many messages in one request and one transaction, each with its own result."""

from __future__ import annotations

from tests.support import add_endpoint, query


def test_a_batch_queues_new_messages_and_answers_a_reused_key_as_existing(api, role_tokens, db, receiver):
    add_endpoint(db, receiver.url("/a"), name="a", event_types=("order.*",))
    producer = role_tokens["producer"]
    first = api.post("/v1/messages", producer, {"event_type": "order.created", "payload": {"n": 1},
                                                "idempotency_key": "order-1"})
    assert first.status == 202, first.body
    batch = api.post("/v1/messages/batch", producer, {"messages": [
        {"event_type": "order.created", "payload": {"n": 2}, "idempotency_key": "order-2"},
        {"event_type": "order.created", "payload": {"n": 1}, "idempotency_key": "order-1"},
        {"event_type": "order.paid", "payload": {"n": 3}},
    ]})
    assert batch.status == 202, batch.body
    new, existing, generated = batch.json["results"]  # in request order
    assert (new["idempotency_key"], new["created"], len(new["deliveries"])) == ("order-2", True, 1)
    assert existing == {**first.json, "created": False}  # the same deliveries, not made again
    assert generated["created"] and generated["idempotency_key"]  # a key generated for it
    assert query(db, "SELECT count(*) FROM webhooks.alert_delivery_queue") == [(3,)]


def test_one_invalid_message_is_refused_alone_and_the_others_are_queued(api, role_tokens, db, receiver):
    add_endpoint(db, receiver.url("/a"), name="a", event_types=("order.*",))
    batch = api.post("/v1/messages/batch", role_tokens["producer"], {"messages": [
        {"event_type": "order.created", "payload": {"n": 1}, "idempotency_key": "k-1"},
        {"event_type": "order.created", "payload": {"n": 2}, "endpoint": "no-such-endpoint"},
        {"event_type": "order.created", "payload": {"n": 3}, "idempotency_key": "k-3"},
    ]})
    assert batch.status == 202, batch.body
    queued, refused, after = batch.json["results"]
    assert refused["status"] == 422 and refused["field"] == "endpoint", refused
    assert "no endpoint with this name or id" in refused["detail"]
    assert (queued["created"], after["created"]) == (True, True)
    assert query(db, "SELECT idempotency_key FROM webhooks.alert_delivery_queue ORDER BY 1") == [
        ("k-1",), ("k-3",)]


def test_a_batch_over_1000_messages_or_empty_is_refused(api, role_tokens, db):
    message = {"event_type": "order.created", "payload": {}}
    for messages in ([message] * 1001, []):
        refused = api.post("/v1/messages/batch", role_tokens["producer"], {"messages": messages})
        assert refused.status == 422, refused.body
        assert refused.json["field"] == "messages", refused.json
    assert query(db, "SELECT count(*) FROM webhooks.messages") == [(0,)]


def test_get_on_the_batch_path_is_not_read_as_a_message_id(api, role_tokens):
    # /v1/messages/{id} must not take "batch": a 405 names only the methods the batch path has
    answer = api.get("/v1/messages/batch", role_tokens["reader"])
    assert answer.status == 405, answer.body
    assert answer.headers["allow"] == "POST"
    assert api.get("/v1/messages/batches", role_tokens["reader"]).status == 422  # any other id as before
