"""GET /v1/messages and /v1/messages/{id}: what was published, once, however it was published (the API or
a producer's INSERT), with its deliveries per endpoint and their status; filters and keyset pages."""

from __future__ import annotations

from tests.support import add_endpoint, enqueue, query


def test_a_published_message_and_one_inserted_with_sql_are_listed_with_their_deliveries(
        api, role_tokens, db, receiver):
    a = add_endpoint(db, receiver.url("/a"), name="a", event_types=("order.*", "invoice.*"))
    b = add_endpoint(db, receiver.url("/b"), name="b", event_types=("order.*",))
    c = add_endpoint(db, receiver.url("/c"), name="c", event_types=("invoice.*",))
    message = {"event_type": "order.created", "payload": {"order": 7}, "idempotency_key": "order-7"}
    published = api.post("/v1/messages", role_tokens["producer"], message)
    assert published.status == 202, published.body
    # a producer writing SQL: one event to two endpoints, in one statement
    inserted = query(
        db, "INSERT INTO webhooks.alert_delivery_queue (webhook_id, event_id, event_type, payload, metadata)"
            " VALUES (%s, 'inv-1', 'invoice.paid', '{\"invoice\": 1}', '{\"source\": \"billing\"}'),"
            "        (%s, 'inv-1', 'invoice.paid', '{\"invoice\": 1}', '{\"source\": \"billing\"}')"
            " RETURNING delivery_id", (a, c))
    delivered = inserted[1][0]
    query(db, "UPDATE webhooks.alert_delivery_queue SET status = 'delivered', delivered_at = now(),"
              " attempts = 1, last_http_status = 204 WHERE delivery_id = %s", (delivered,))

    listed = api.get("/v1/messages", role_tokens["reader"])
    assert listed.status == 200, listed.body
    assert listed.json["next_cursor"] is None
    sql_message, api_message = listed.json["items"]  # newest first, each event once
    assert (sql_message["event_id"], sql_message["event_type"]) == ("inv-1", "invoice.paid")
    assert [(d["endpoint_id"], d["endpoint_name"], d["status"]) for d in sql_message["deliveries"]] == [
        (a, "a", "pending"), (c, "c", "delivered")]
    assert sql_message["deliveries"][1]["last_http_status"] == 204
    assert [d["delivery_id"] for d in sql_message["deliveries"]] == [r[0] for r in inserted]
    assert (api_message["event_id"], api_message["event_type"]) == ("order-7", "order.created")
    assert [(d["delivery_id"], d["endpoint_name"], d["status"], d["idempotency_key"])
            for d in api_message["deliveries"]] == [
        (d["delivery_id"], d["endpoint_name"], "pending", "order-7") for d in published.json["deliveries"]]
    assert {d["endpoint_id"] for d in api_message["deliveries"]} == {a, b}
    assert "payload" not in api_message  # the payload on the message's own page

    shown = api.get(f"/v1/messages/{sql_message['message_id']}", role_tokens["reader"])
    assert shown.status == 200, shown.body
    assert shown.json["payload"] == {"invoice": 1} and shown.json["metadata"] == {"source": "billing"}
    assert shown.json["deliveries"] == sql_message["deliveries"]
    assert api.get(f"/v1/messages/{api_message['message_id']}", role_tokens["admin"]).json["payload"] == {
        "order": 7}
    missing = api.get("/v1/messages/999999", role_tokens["reader"])
    assert missing.status == 404 and "message 999999" in missing.json["detail"]


def test_messages_filter_by_event_type_key_and_time_and_page_by_cursor(api, role_tokens, db, receiver):
    endpoint = add_endpoint(db, receiver.url("/hook"), name="hook")
    enqueue(db, endpoint, event_type="alert.created", count=4)  # four events, four messages
    enqueue(db, endpoint, event_type="alert.resolved")
    # a producer that gives the row a key of its own, apart from the event id
    query(db, "INSERT INTO webhooks.alert_delivery_queue (webhook_id, event_id, idempotency_key, event_type,"
              " payload) VALUES (%s, 'evt-9', 'row-key-9', 'alert.resolved', '{}')", (endpoint,))
    ids = [r[0] for r in query(db, "SELECT message_id FROM webhooks.messages ORDER BY message_id DESC")]
    assert len(ids) == 6
    # publication times an hour apart, oldest first
    query(db, "UPDATE webhooks.messages SET created_at = timestamptz '2030-01-01 00:00Z'"
              " + make_interval(hours => (SELECT count(*) FROM webhooks.messages o"
              "                           WHERE o.message_id < messages.message_id)::integer)")
    reader = role_tokens["reader"]

    def listed(params: str) -> list[int]:
        answer = api.get(f"/v1/messages?{params}", reader)
        assert answer.status == 200, (params, answer.body)
        return [m["message_id"] for m in answer.json["items"]]

    assert listed("event_type=alert.resolved") == ids[:2]
    assert listed("event_type=alert.none") == []
    assert listed("idempotency_key=evt-9") == ids[:1]  # by its event id
    assert listed("idempotency_key=row-key-9") == ids[:1]  # by the key its delivery carries
    assert listed("since=2030-01-01T02:00:00Z") == ids[:4]  # inclusive
    assert listed("until=2030-01-01T02:00:00Z") == ids[4:]  # exclusive
    assert listed("since=2030-01-01T01:00:00Z&until=2030-01-01T03:00:00Z&event_type=alert.created") == [
        ids[3], ids[4]]

    pages, cursor = [], None
    while True:
        answer = api.get("/v1/messages?limit=4" + (f"&cursor={cursor}" if cursor else ""), reader)
        assert answer.status == 200, answer.body
        pages.append([m["message_id"] for m in answer.json["items"]])
        cursor = answer.json["next_cursor"]
        if cursor is None:
            break
    assert pages == [ids[:4], ids[4:]]
    # a message published after the first page does not shift the next one
    first = api.get("/v1/messages?limit=2", reader).json
    enqueue(db, endpoint)
    after = api.get(f"/v1/messages?limit=2&cursor={first['next_cursor']}", reader).json
    assert [m["message_id"] for m in after["items"]] == ids[2:4]

    for params, field in (("limit=1001", "limit"), ("limit=0", "limit"), ("cursor=abc", "cursor"),
                          ("since=yesterday", "since"), ("tenant=nobody", "tenant")):
        refused = api.get(f"/v1/messages?{params}", reader)
        assert refused.status == 422 and refused.json["field"] == field, (params, refused.body)
    assert api.get("/v1/messages?limit=1000", reader).status == 200
    assert api.get("/v1/messages/abc", reader).status in (404, 422)
