"""The gate's rules as the API, the console and the CLI meet them: test events held to the tenant's
quota, refused for a disabled endpoint and limited per endpoint; batches judged message by message,
queued in order while they fit in the tenant's quota."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.acceptance.test_cli import cli
from tests.api.console_client import ConsoleServer
from tests.api.server import api_config
from tests.api.test_console import logged_in
from tests.api.test_tenant_isolation import scoped_token
from tests.support import add_endpoint, query

UNFINISHED = ("SELECT count(*) FROM webhooks.alert_delivery_queue"
              " WHERE status IN ('pending', 'retrying', 'delivering')")


@pytest.fixture
def console(db: str) -> Iterator[ConsoleServer]:
    server = ConsoleServer(api_config(db)).start()
    yield server
    server.stop()


def acme(db: str, max_queued: int | None) -> int:
    """Tenant acme with this max_queued and one endpoint, `orders`, subscribed to order.*."""
    tenant = query(db, "SELECT webhooks.register_tenant('acme')")[0][0]
    endpoint = add_endpoint(db, "http://127.0.0.1:9/orders", name="orders", event_types=("order.*",))
    query(db, "UPDATE webhooks.endpoints SET tenant_id = %s WHERE id = %s", (tenant, endpoint))
    if max_queued is not None:
        query(db, "SELECT webhooks.update_tenant('acme', %s)", (f'{{"max_queued": {max_queued}}}',))
    return endpoint


# --- test events ------------------------------------------------------------------------------------

def test_test_events_are_held_to_the_tenants_quota_as_publishing_is(api, db):
    endpoint = acme(db, max_queued=3)
    producer, admin = scoped_token(db, "producer", "acme"), scoped_token(db, "tenant_admin", "acme")
    for _ in range(3):
        assert api.post("/v1/messages", producer, {"event_type": "order.paid", "payload": {}}).status == 202
    assert api.post("/v1/messages", producer, {"event_type": "order.paid", "payload": {}}).status == 429
    for _ in range(10):
        refused = api.post(f"/v1/endpoints/{endpoint}/test", admin)
        assert refused.status == 429, refused.body
        assert int(refused.headers["retry-after"]) > 0
        assert "tenant acme: at its quota of 3 queued deliveries" in refused.json["detail"]
    assert query(db, UNFINISHED) == [(3,)]


def test_a_test_event_to_a_disabled_endpoint_is_refused_and_leaves_nothing_to_wait_for(api, db, role_tokens,
                                                                                       console):
    endpoint = add_endpoint(db, "http://127.0.0.1:9/orders", name="orders")
    admin = role_tokens["admin"]
    assert api.post(f"/v1/endpoints/{endpoint}/disable", admin).status == 200
    refused = api.post(f"/v1/endpoints/{endpoint}/test", admin)
    assert refused.status == 409, refused.body
    assert "the endpoint is disabled" in refused.json["detail"]
    # the console and the CLI refuse it in the same words
    person = logged_in(console, db, "admin")
    page = person.post(f"/console/endpoints/{endpoint}/test", {"csrf": person.csrf()})
    assert page.status == 409 and b"the endpoint is disabled" in page.body
    ran = cli("endpoints", "test", "orders", env={"DATABASE_URL": db})
    assert ran.returncode != 0 and "the endpoint is disabled" in ran.stderr, ran.stderr
    assert query(db, "SELECT count(*) FROM webhooks.alert_delivery_queue") == [(0,)]
    # nothing queued, so nothing holds off its deletion
    assert api.request("DELETE", f"/v1/endpoints/{endpoint}", admin).status == 204


def test_test_events_are_limited_per_endpoint_in_the_api_and_the_console_alike(api, db, role_tokens, console):
    limited = add_endpoint(db, "http://127.0.0.1:9/a", name="limited")
    other = add_endpoint(db, "http://127.0.0.1:9/b", name="other")
    admin = role_tokens["admin"]
    person = logged_in(console, db, "admin")
    for n in range(10):  # the limit: 10 a minute, whichever way they are sent
        if n % 2:
            assert api.post(f"/v1/endpoints/{limited}/test", admin).status == 202
        else:
            sent = person.post(f"/console/endpoints/{limited}/test", {"csrf": person.csrf()})
            assert sent.status == 303, sent.body
    refused = api.post(f"/v1/endpoints/{limited}/test", admin)
    assert refused.status == 429, refused.body
    assert 1 <= int(refused.headers["retry-after"]) <= 60
    assert "at most 10 test events a minute" in refused.json["detail"]
    page = person.post(f"/console/endpoints/{limited}/test", {"csrf": person.csrf()})
    assert page.status == 429 and 1 <= int(page.headers["retry-after"]) <= 60
    assert api.post(f"/v1/endpoints/{other}/test", admin).status == 202  # per endpoint
    assert query(db, "SELECT webhook_id, count(*) FROM webhooks.alert_delivery_queue"
                     " GROUP BY 1 ORDER BY 1") == [(limited, 10), (other, 1)]
    # a minute later, it may send again
    query(db, "UPDATE webhooks.test_event_sends SET sent_at = ARRAY(SELECT t - interval '61 seconds'"
              " FROM unnest(sent_at) t)")
    assert api.post(f"/v1/endpoints/{limited}/test", admin).status == 202


# --- batches ----------------------------------------------------------------------------------------

def test_a_malformed_message_is_refused_alone_with_its_index(api, db, role_tokens):
    add_endpoint(db, "http://127.0.0.1:9/orders", name="orders", event_types=("order.*",))
    batch = api.post("/v1/messages/batch", role_tokens["producer"], {"messages": [
        {"event_type": "order.created", "payload": {"n": 0}},
        {"event_type": ""},
        {"event_type": "order.created", "payload": {}, "colour": "red"},
        {"event_type": "order.created", "payload": {}, "priority": 99999},
        {"event_type": "order.created", "payload": {"n": 4}},
    ]})
    assert batch.status == 202, batch.body
    results = batch.json["results"]
    assert [r.get("created") for r in results] == [True, None, None, None, True]
    assert [(r["status"], r["index"], r["field"]) for r in results[1:4]] == [
        (422, 1, "event_type"), (422, 2, "colour"), (422, 3, "priority")]
    assert query(db, "SELECT payload FROM webhooks.deliveries ORDER BY delivery_id") == [
        ({"n": 0},), ({"n": 4},)]


@pytest.mark.parametrize("body, field", [
    ({"messages": "order.created"}, "messages"),
    ({"messages": [{"event_type": "order.created", "payload": {}}, 7]}, "messages.1"),
    ({"messages": [{"event_type": "order.created", "payload": {}}], "extra": 1}, "extra"),
    ({}, "messages"),
])
def test_only_a_malformed_envelope_refuses_the_whole_batch(api, db, role_tokens, body, field):
    add_endpoint(db, "http://127.0.0.1:9/orders", name="orders", event_types=("order.*",))
    refused = api.post("/v1/messages/batch", role_tokens["producer"], body)
    assert (refused.status, refused.json["field"]) == (422, field), refused.body
    assert query(db, "SELECT count(*) FROM webhooks.alert_delivery_queue") == [(0,)]


def test_a_batch_larger_than_the_free_room_queues_what_fits_in_order(api, db):
    endpoint = acme(db, max_queued=3)
    producer = scoped_token(db, "producer", "acme")
    messages = [{"event_type": "order.paid", "payload": {"n": n}, "idempotency_key": f"k{n}"}
                for n in range(5)]
    batch = api.post("/v1/messages/batch", producer, {"messages": messages})
    assert batch.status == 202, batch.body
    assert int(batch.headers["retry-after"]) > 0
    results = batch.json["results"]
    assert [r.get("created") for r in results[:3]] == [True, True, True]
    assert [(r["status"], r["index"]) for r in results[3:]] == [(429, 3), (429, 4)]
    assert "at its quota of 3 queued deliveries" in results[3]["detail"]
    assert "an earlier message" in results[4]["detail"]
    # once the queue drains, the rest is sent again, and what was queued answers as queued
    query(db, "UPDATE webhooks.alert_delivery_queue SET status = 'delivered', delivered_at = now()")
    again = api.post("/v1/messages/batch", producer, {"messages": messages})
    assert [r.get("created") for r in again.json["results"]] == [False, False, False, True, True]
    assert query(db, "SELECT count(*) FROM webhooks.alert_delivery_queue WHERE webhook_id = %s",
                 (endpoint,)) == [(5,)]


def test_a_message_that_can_never_fit_says_so_and_stops_nothing(api, db):
    endpoint = acme(db, max_queued=1)
    second = add_endpoint(db, "http://127.0.0.1:9/audit", name="audit", event_types=("order.*",))
    query(db, "UPDATE webhooks.endpoints SET tenant_id = (SELECT tenant_id FROM webhooks.endpoints"
              " WHERE id = %s) WHERE id = %s", (endpoint, second))
    producer = scoped_token(db, "producer", "acme")
    single = api.post("/v1/messages", producer, {"event_type": "order.paid", "payload": {}})
    assert single.status == 429 and "retry-after" not in single.headers, single.body
    assert "it can never be queued" in single.json["detail"]
    batch = api.post("/v1/messages/batch", producer, {"messages": [
        {"event_type": "order.paid", "payload": {}},  # to both endpoints: 2 rows, the quota is 1
        {"event_type": "order.created", "payload": {}, "endpoint": "audit"},
    ]})
    assert batch.status == 202, batch.body
    never, queued = batch.json["results"]
    assert (never["status"], never["index"]) == (429, 0) and "it can never be queued" in never["detail"]
    assert queued["created"] is True and "retry-after" not in batch.headers
    assert query(db, UNFINISHED) == [(1,)]
