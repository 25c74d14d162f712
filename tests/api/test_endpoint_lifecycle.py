"""Deleting an endpoint keeps its history, and can drop its waiting rows as dead letters that say why;
a message only disabled endpoints subscribe to is kept."""

from __future__ import annotations

import psycopg
import pytest

from tests.api.test_routes import dead_letter
from tests.support import add_endpoint, enqueue, query

URL = "https://example.com/hook"


def deliver(db, delivery_id):
    query(db, "UPDATE webhooks.alert_delivery_queue SET status = 'delivered', delivered_at = now()"
              " WHERE delivery_id = %s", (delivery_id,))


def test_an_endpoint_with_only_finished_rows_is_deleted_and_its_history_stays(api, role_tokens, db,
                                                                             receiver):
    admin, reader = role_tokens["admin"], role_tokens["reader"]
    endpoint = add_endpoint(db, receiver.url("/orders"), name="orders")
    dead = dead_letter(db, endpoint)
    [delivered] = enqueue(db, endpoint)
    deliver(db, delivered)
    query(db, "SELECT webhooks.replay(%s)", (delivered,))  # an audit row, then delivered again
    deliver(db, delivered)
    query(db, "SELECT webhooks.disable_endpoint(%s, 'retiring it')", (endpoint,))
    audit = query(db, "SELECT count(*) FROM webhooks.alert_delivery_log WHERE webhook_id = %s", (endpoint,))
    events = query(db, "SELECT change FROM webhooks.endpoint_events WHERE webhook_id = %s", (endpoint,))
    assert audit[0][0] > 0 and events

    deleted = api.request("DELETE", "/v1/endpoints/orders", admin)
    assert deleted.status == 204, deleted.body
    assert api.get(f"/v1/endpoints/{endpoint}", reader).status == 404
    assert endpoint not in [e["id"] for e in api.get("/v1/endpoints", reader).json["items"]]
    # the finished rows and the audit keep their history, the endpoint's id and name readable as deleted
    for delivery_id in (dead, delivered):
        shown = api.get(f"/v1/deliveries/{delivery_id}", reader)
        assert shown.status == 200, shown.body
        assert (shown.json["endpoint_id"], shown.json["endpoint_name"]) == (endpoint, "orders")
        assert shown.json["endpoint_deleted_at"] is not None
    listed = api.get("/v1/dead-letters", reader).json["items"]
    assert [(d["delivery_id"], d["endpoint_name"]) for d in listed] == [(dead, "orders")]
    assert query(db, "SELECT count(*) FROM webhooks.alert_delivery_log WHERE webhook_id = %s",
                 (endpoint,)) == audit
    assert query(db, "SELECT change FROM webhooks.endpoint_events WHERE webhook_id = %s",
                 (endpoint,)) == events
    # nothing sends to it again: its rows are not replayed, and no row can be queued for it
    refused = api.post(f"/v1/deliveries/{dead}/replay", admin)
    assert refused.status == 409 and "deleted" in refused.json["detail"], refused.body
    with pytest.raises(psycopg.errors.ForeignKeyViolation):
        enqueue(db, endpoint)
    # its name is free again; the new endpoint is another id, and the old history stays the old one's
    again = api.post("/v1/endpoints", admin, {"name": "orders", "url": URL})
    assert again.status == 201 and again.json["id"] != endpoint, again.body
    assert api.get(f"/v1/deliveries/{dead}", reader).json["endpoint_id"] == endpoint


@pytest.mark.parametrize("status", ["pending", "retrying", "delivering"])
def test_an_endpoint_with_an_unfinished_row_is_not_deleted(api, role_tokens, db, receiver, status):
    admin = role_tokens["admin"]
    endpoint = add_endpoint(db, receiver.url("/orders"), name="orders")
    [row] = enqueue(db, endpoint)
    if status == "retrying":
        query(db, "UPDATE webhooks.alert_delivery_queue SET status = 'retrying' WHERE delivery_id = %s",
              (row,))
    elif status == "delivering":
        query(db, "UPDATE webhooks.alert_delivery_queue SET status = 'delivering', locked_by = 'w',"
                  " lease_token = gen_random_uuid(), locked_until = now() + interval '1 minute'"
                  " WHERE delivery_id = %s", (row,))
    refused = api.request("DELETE", f"/v1/endpoints/{endpoint}", admin)
    assert refused.status == 409, refused.body
    if status == "delivering":
        assert "has 1 deliveries being sent now: disable it" in refused.json["detail"]
        # dropping waiting rows leaves one being sent alone: its outcome is still to be written
        refused = api.request("DELETE", f"/v1/endpoints/{endpoint}?drop_pending=true", admin)
        assert refused.status == 409 and "being sent now" in refused.json["detail"], refused.body
    else:
        assert "still has 1 deliveries waiting (pending or retrying)" in refused.json["detail"]
        assert "drop_pending" in refused.json["detail"]
    assert query(db, "SELECT count(*) FROM webhooks.endpoints WHERE id = %s", (endpoint,)) == [(1,)]
    # once it is finished (here: dead-lettered), the endpoint goes
    query(db, "UPDATE webhooks.alert_delivery_queue SET status = 'dead_letter', dead_lettered_at = now(),"
              " lease_token = NULL, locked_until = NULL, locked_by = NULL WHERE delivery_id = %s", (row,))
    assert api.request("DELETE", f"/v1/endpoints/{endpoint}", admin).status == 204


@pytest.mark.parametrize("role", ["admin", "tenant_admin"])
def test_an_endpoint_deleted_with_drop_pending_leaves_its_waiting_rows_as_dead_letters_that_say_why(
        api, role_tokens, db, receiver, role):
    token, reader = role_tokens[role], role_tokens["reader"]
    endpoint = add_endpoint(db, receiver.url("/orders"), name="orders")
    pending = enqueue(db, endpoint, count=2, deliver_after=3600)
    [retrying] = enqueue(db, endpoint, deliver_after=3600)
    query(db, "UPDATE webhooks.alert_delivery_queue SET status = 'retrying', attempts = 2"
              " WHERE delivery_id = %s", (retrying,))
    dead = dead_letter(db, endpoint)
    assert api.request("DELETE", f"/v1/endpoints/{endpoint}?drop_pending=false", token).status == 409

    deleted = api.request("DELETE", "/v1/endpoints/orders?drop_pending=true", token)
    assert deleted.status == 204, deleted.body
    dropped = [*pending, retrying]
    rows = query(db, "SELECT delivery_id, status, failure_category, dead_letter_reason, attempts"
                     " FROM webhooks.alert_delivery_queue WHERE delivery_id = ANY(%s) ORDER BY 1", (dropped,))
    assert [r[1:3] for r in rows] == [("dead_letter", "endpoint_deleted")] * 3
    reason = rows[0][3]
    assert f"orders (id {endpoint})" in reason and "not sent again" in reason
    assert "api:" in reason  # who deleted it
    # each drop is in the audit log, with the attempts the row had used
    assert query(db, "SELECT delivery_id, attempt, outcome, failure_category FROM webhooks.alert_delivery_log"
                     " WHERE delivery_id = ANY(%s) ORDER BY 1", (dropped,)) == [
        (pending[0], 0, "dead_letter", "endpoint_deleted"),
        (pending[1], 0, "dead_letter", "endpoint_deleted"),
        (retrying, 2, "dead_letter", "endpoint_deleted")]
    listed = api.get("/v1/dead-letters?category=endpoint_deleted", reader)
    assert listed.status == 200, listed.body
    assert sorted(d["delivery_id"] for d in listed.json["items"]) == dropped
    assert {(d["endpoint_id"], d["endpoint_name"]) for d in listed.json["items"]} == {(endpoint, "orders")}
    assert all(d["endpoint_deleted_at"] is not None for d in listed.json["items"])
    # not replayable, and the refusal says why
    for delivery_id in (dropped[0], dead):
        refused = api.post(f"/v1/deliveries/{delivery_id}/replay", token)
        assert refused.status == 409, refused.body
        assert f"belongs to endpoint orders (id {endpoint}), deleted" in refused.json["detail"]
        assert "never sent again" in refused.json["detail"]


def test_a_dead_letter_of_a_deleted_endpoint_is_not_listed_under_its_names_new_owner(api, role_tokens, db,
                                                                                      receiver):
    admin, reader = role_tokens["admin"], role_tokens["reader"]
    old = add_endpoint(db, receiver.url("/old"), name="billing")
    old_dead = dead_letter(db, old)
    assert api.request("DELETE", "/v1/endpoints/billing", admin).status == 204
    new = api.post("/v1/endpoints", admin, {"name": "billing", "url": URL}).json["id"]
    new_dead = dead_letter(db, new)
    listed = api.get("/v1/dead-letters", reader).json["items"]
    assert [(d["delivery_id"], d["endpoint_id"], d["endpoint_name"], d["endpoint_deleted_at"] is not None)
            for d in listed] == [(old_dead, old, "billing", True), (new_dead, new, "billing", False)]
    # filtered by the name, only the current owner's
    assert [d["delivery_id"] for d in api.get("/v1/dead-letters?endpoint=billing", reader).json["items"]] == [
        new_dead]
    assert f"belongs to endpoint billing (id {old}), deleted" in api.post(
        f"/v1/deliveries/{old_dead}/replay", admin).json["detail"]
    assert api.post(f"/v1/deliveries/{new_dead}/replay", admin).status == 202
    refused = api.post(f"/v1/deliveries/{new_dead}/replay", admin)
    assert refused.status == 409 and "is pending: only dead letters and delivered rows" in refused.json[
        "detail"], refused.body


def test_a_message_only_disabled_endpoints_subscribe_to_is_kept_as_dead_letters(api, role_tokens, db,
                                                                                receiver):
    producer, admin = role_tokens["producer"], role_tokens["admin"]
    orders = add_endpoint(db, receiver.url("/orders"), name="orders", event_types=("order.*",))
    audit = add_endpoint(db, receiver.url("/audit"), name="audit", event_types=("order.paid",))
    for endpoint in (orders, audit):
        query(db, "SELECT webhooks.disable_endpoint(%s, 'maintenance')", (endpoint,))

    published = api.post("/v1/messages", producer, {"event_type": "order.paid", "payload": {"order": 42}})
    assert published.status == 202 and published.json["created"] is True, published.body
    assert sorted(d["endpoint_name"] for d in published.json["deliveries"]) == ["audit", "orders"]
    [(count,)] = query(db, "SELECT webhooks.publish('order.shipped', '{\"order\": 42}')")  # SQL fan-out
    assert count == 1
    rows = query(db, "SELECT webhook_id, event_type, status, failure_category, dead_letter_reason,"
                     " attempts FROM webhooks.alert_delivery_queue ORDER BY delivery_id")
    assert [r[:5] for r in rows] == [
        (orders, "order.paid", "dead_letter", "disabled", rows[0][4]),
        (audit, "order.paid", "dead_letter", "disabled", rows[0][4]),
        (orders, "order.shipped", "dead_letter", "disabled", rows[0][4]),
    ]
    assert "endpoint disabled" in rows[0][4] and all(r[5] == 0 for r in rows)  # no attempt was made
    assert query(db, "SELECT count(*) FROM webhooks.alert_delivery_log") == [(0,)]
    # found among the dead letters by its category, and replayed once the endpoint is enabled
    listed = api.get("/v1/dead-letters?category=disabled&endpoint=orders", role_tokens["reader"]).json
    first = next(d["delivery_id"] for d in published.json["deliveries"] if d["endpoint_name"] == "orders")
    assert first in [d["delivery_id"] for d in listed["items"]]
    assert api.post("/v1/endpoints/orders/enable", admin).status == 200
    assert api.post(f"/v1/deliveries/{first}/replay", admin).status == 202
    assert query(db, "SELECT status, replays FROM webhooks.alert_delivery_queue WHERE delivery_id = %s",
                 (first,)) == [("pending", 1)]


def test_a_message_that_reaches_an_enabled_endpoint_gives_the_disabled_ones_nothing(api, role_tokens, db,
                                                                                   receiver):
    disabled = add_endpoint(db, receiver.url("/off"), name="off", event_types=("order.*",))
    enabled = add_endpoint(db, receiver.url("/on"), name="on", event_types=("order.*",))
    query(db, "SELECT webhooks.disable_endpoint(%s, 'maintenance')", (disabled,))
    published = api.post("/v1/messages", role_tokens["producer"], {"event_type": "order.paid", "payload": {}})
    assert [d["endpoint_id"] for d in published.json["deliveries"]] == [enabled]
    query(db, "SELECT webhooks.publish('order.shipped', '{}')")
    assert query(db, "SELECT DISTINCT webhook_id, status FROM webhooks.alert_delivery_queue") == [
        (enabled, "pending")]


def test_a_url_whose_host_is_no_domain_name_is_refused_not_a_500(api, role_tokens, db, receiver):
    # found by schemathesis: the host cannot be written in IDNA, so resolving it raised UnicodeError
    admin = role_tokens["admin"]
    endpoint = add_endpoint(db, receiver.url("/orders"), name="orders")
    for method, path, body in (("POST", "/v1/endpoints", {"name": "odd", "url": "https://\u0087l\u00af\u00e2.&/"}),
                               ("PATCH", f"/v1/endpoints/{endpoint}", {"url": "https://\u0087l\u00af\u00e2.&/"})):
        answer = api.request(method, path, admin, body)
        assert answer.status == 422 and answer.json["field"] == "url", answer.body
