"""Every /v1 route: what it answers, for which roles, and how it refuses bad input."""

from __future__ import annotations

import threading

import psycopg
import pytest
from openapi_spec_validator import validate

from tests.api.server import make_token
from tests.support import ROOT, add_endpoint, enqueue, eventually, query
from worker.api.openapi import document, text
from worker.api.routes import ROUTES

ROLES = ("producer", "reader", "admin", "tenant_admin")


def test_the_openapi_document_is_valid_openapi_3_1_and_served_without_a_token(api):
    validate(document())
    answer = api.get("/v1/openapi.json")
    assert answer.status == 200 and answer.json == document()
    documented = {(method.upper(), path) for path, item in document()["paths"].items() for method in item}
    served = {(route.method, route.path) for route in ROUTES}
    assert documented == served


def test_the_committed_document_is_the_generated_one():
    # a change to the contract shows in review: regenerate with
    # `python -m worker.api.openapi > docs/openapi.json`
    committed = (ROOT / "docs" / "openapi.json").read_text()
    assert committed == text(), "docs/openapi.json is stale: python -m worker.api.openapi > docs/openapi.json"


def dead_letter(db, webhook_id, reason="http 400"):
    [delivery_id] = enqueue(db, webhook_id)
    query(
        db,
        "UPDATE webhooks.alert_delivery_queue SET status = 'dead_letter', dead_letter_reason = %s,"
        " failure_category = 'http_4xx', dead_lettered_at = now() WHERE delivery_id = %s",
        (reason, delivery_id),
    )
    return delivery_id


@pytest.fixture
def world(db, receiver):
    """An endpoint with a dead letter and a delivered row, and an endpoint with nothing queued."""
    endpoint = add_endpoint(db, receiver.url("/hook"), name="orders")
    spare = add_endpoint(db, receiver.url("/spare"), name="spare")
    dead = dead_letter(db, endpoint)
    [delivered] = enqueue(db, endpoint)
    query(
        db,
        "UPDATE webhooks.alert_delivery_queue SET status = 'delivered', delivered_at = now()"
        " WHERE delivery_id = %s",
        (delivered,),
    )
    [(operation,)] = query(
        db, "SELECT webhooks.api_start_replay('{\"event_type\": \"none\"}', NULL, NULL, 't')"
    )
    query(db, "SELECT webhooks.upsert_event_type('order.created', 'An order was placed')")
    make_token(db, "reader", name="revocable")
    [(message,)] = query(db, "SELECT message_id FROM webhooks.alert_delivery_queue WHERE delivery_id = %s",
                         (delivered,))
    return {
        "message": message,
        "endpoint": endpoint,
        "spare": spare,
        "dead": dead,
        "delivered": delivered,
        "operation": operation,
    }


def sample_request(method, path, world, role):
    """A request each route can act on, with the world's ids, so an allowed role reaches the database."""
    ids = {
        "/v1/messages/{id}": world["message"],
        "/v1/deliveries/{id}": world["delivered"],
        "/v1/deliveries/{id}/replay": world["dead"],
        "/v1/operations/{id}": world["operation"],
        "/v1/tenants/{id}": "default",
        "/v1/tokens/{name}/revoke": "revocable",
        "/v1/event-types/{name}": "order.created",
        "/v1/event-types/{name}/deprecate": "order.created",
    }
    target = ids.get(path, world["spare"] if method == "DELETE" else world["endpoint"])
    url = path.replace("{id}", str(target)).replace("{name}", str(target))
    bodies = {
        ("POST", "/v1/messages"): {"event_type": "order.created", "payload": {"n": 1}, "endpoint": "orders"},
        ("POST", "/v1/messages/batch"): {"messages": [
            {"event_type": "order.created", "payload": {"n": 1}, "endpoint": "orders"}]},
        ("POST", "/v1/dead-letters/replay"): {"filter": {"endpoint": "orders"}, "max": 1},
        ("POST", "/v1/endpoints"): {"name": f"new-{role}", "url": "https://example.com/hook"},
        ("PATCH", "/v1/endpoints/{id}"): {"max_attempts": 5},
        ("POST", "/v1/endpoints/{id}/circuit"): {"action": "reset"},
        ("POST", "/v1/endpoints/{id}/disable"): {"reason": "maintenance"},
        ("PATCH", "/v1/config"): {"max_attempts": 12},
        ("POST", "/v1/tenants"): {"name": f"tenant-{role}"},
        ("PATCH", "/v1/tenants/{id}"): {"max_queued": 1000},
        ("PUT", "/v1/event-types/{name}"): {"description": f"set by {role}"},
        ("POST", "/v1/tokens"): {"name": f"made-by-{role}", "role": "reader"},
    }
    return url, bodies.get((method, path))


@pytest.mark.parametrize(
    ("method", "path"), [(r.method, r.path) for r in ROUTES if not r.public], ids=lambda v: v
)
def test_every_route_for_every_role(api, role_tokens, world, method, path):
    allowed = next(r.roles for r in ROUTES if (r.method, r.path) == (method, path))
    url, body = sample_request(method, path, world, "none")
    assert api.request(method, url, None, body).status == 401
    for role in ROLES:
        url, body = sample_request(method, path, world, role)
        answer = api.request(method, url, role_tokens[role], body)
        if role in allowed:
            # past authentication and the role check, and the database role's grants allowed it
            assert answer.status < 400 or answer.status in (404, 409), (role, answer.status, answer.body)
        else:
            assert answer.status == 403, (role, answer.status, answer.body)
            assert answer.json["type"].endswith("/forbidden") and role in answer.json["detail"]


def test_publish_then_the_same_key_again(api, role_tokens, db, receiver):
    add_endpoint(db, receiver.url("/a"), name="a", event_types=("order.*",))
    add_endpoint(db, receiver.url("/b"), name="b", event_types=("order.created",))
    add_endpoint(db, receiver.url("/c"), name="c", event_types=("invoice.*",))
    message = {
        "event_type": "order.created",
        "payload": {"id": 7},
        "idempotency_key": "order-7",
        "ordering_key": "customer-1",
        "priority": 5,
    }
    trace = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    first = api.post("/v1/messages", role_tokens["producer"], message, headers={"traceparent": trace})
    assert first.status == 202, first.body
    followed = api.get(first.headers["location"], role_tokens["reader"])  # where the deliveries are
    assert sorted(d["delivery_id"] for d in followed.json["items"]) == sorted(
        d["delivery_id"] for d in first.json["deliveries"])
    assert sorted(d["endpoint_name"] for d in first.json["deliveries"]) == ["a", "b"]
    again = api.post("/v1/messages", role_tokens["producer"], message)
    assert again.status == 200 and again.json["created"] is False
    assert again.json["deliveries"] == first.json["deliveries"]
    rows = query(
        db, "SELECT idempotency_key, ordering_key, priority, traceparent FROM webhooks.alert_delivery_queue"
    )
    assert rows == [("order-7", "customer-1", 5, trace)] * 2


def test_of_two_publishes_of_one_key_at_once_the_second_answers_with_the_first_s_deliveries(db, receiver):
    # The race made deterministic: the first publish holds its transaction open while the second,
    # in another session, waits on the key's conflict; once the first commits, the second must
    # answer with the deliveries the first made, not with none (as its insert's snapshot saw them).
    add_endpoint(db, receiver.url("/a"), name="a", event_types=("order.*",))
    add_endpoint(db, receiver.url("/b"), name="b", event_types=("order.*",))
    publish = ("SELECT delivery_id, webhook_id, created FROM webhooks.api_publish(%s, %s::jsonb, NULL, %s)"
               " ORDER BY webhook_id")
    answers: list[list[tuple[int, int, bool]]] = []
    with psycopg.connect(db) as first, psycopg.connect(db, autocommit=True) as second:
        won = first.execute(publish, ("order.paid", "{}", "order-8")).fetchall()
        waiting = second.execute("SELECT pg_backend_pid()").fetchone()[0]
        thread = threading.Thread(target=lambda: answers.append(
            second.execute(publish, ("order.paid", "{}", "order-8")).fetchall()))
        thread.start()
        eventually(lambda: query(db, "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s",
                                 (waiting,)) == [("Lock",)], message="the second publish waiting on the key")
        first.commit()
        thread.join(30)
    assert [created for *_, created in won] == [True, True]
    assert answers == [[(delivery, endpoint, False) for delivery, endpoint, _ in won]]
    assert query(db, "SELECT count(*) FROM webhooks.alert_delivery_queue") == [(2,)]


def test_a_session_that_published_while_the_queue_was_small_does_not_scan_it_once_it_has_grown(db, receiver):
    # A long-lived API connection caches its plans for api_publish() while the queue is small (after
    # five calls, generic ones); the rows that answer a publish must still be found by their index
    # when the queue has grown and nothing has analyzed it since (autovacuum off here, so it cannot).
    add_endpoint(db, receiver.url("/a"), name="a", event_types=("order.*",))
    add_endpoint(db, receiver.url("/b"), name="b", event_types=("order.*",))
    query(db, "ALTER TABLE webhooks.alert_delivery_queue SET (autovacuum_enabled = false)")
    publish = "SELECT webhook_id, created FROM webhooks.api_publish('order.paid', '{}', NULL, %s)"
    with psycopg.connect(db, autocommit=True) as conn:
        for i in range(10):
            conn.execute(publish, (f"small-{i}",))
        query(db, "INSERT INTO webhooks.alert_delivery_queue (webhook_id, event_type, payload)"
                  " SELECT e.id, 'order.paid', '{}' FROM webhooks.endpoints e, generate_series(1, 5000)")
        with conn.transaction():
            new = conn.execute(publish, ("grown-1",)).fetchall()
            again = conn.execute(publish, ("grown-1",)).fetchall()
            [(scans,)] = conn.execute("SELECT seq_scan FROM pg_stat_xact_user_tables"
                                      " WHERE relid = 'webhooks.alert_delivery_queue'::regclass").fetchall()
    assert [created for _, created in new] == [True, True] and [c for _, c in again] == [False, False]
    assert scans == 0


def test_an_idempotency_key_reused_for_another_message_is_refused_and_writes_nothing(api, role_tokens, db,
                                                                                    receiver):
    add_endpoint(db, receiver.url("/orders"), name="orders", event_types=("order.*",))
    producer = role_tokens["producer"]
    paid = {"event_type": "order.paid", "payload": {"order": 42}, "idempotency_key": "order-42-paid"}
    assert api.post("/v1/messages", producer, paid).status == 202
    before = query(db, "SELECT delivery_id, event_type, payload FROM webhooks.deliveries")
    for other in ({**paid, "event_type": "order.refunded"}, {**paid, "payload": {"order": 43}}):
        refused = api.post("/v1/messages", producer, other)
        assert refused.status == 409, refused.body
        assert refused.json["field"] == "idempotency_key" and "another message" in refused.json["detail"]
    assert query(db, "SELECT delivery_id, event_type, payload FROM webhooks.deliveries") == before
    again = api.post("/v1/messages", producer, paid)  # the same message: the deliveries it made
    assert again.status == 200 and again.json["created"] is False
    assert [d["delivery_id"] for d in again.json["deliveries"]] == [before[0][0]]


def test_publish_to_one_endpoint_by_name_or_id(api, role_tokens, db, receiver):
    endpoint = add_endpoint(db, receiver.url("/a"), name="only", event_types=("other.*",))
    by_name = api.post(
        "/v1/messages", role_tokens["producer"], {"event_type": "x.y", "payload": [1, 2], "endpoint": "only"}
    )
    by_id = api.post(
        "/v1/messages", role_tokens["admin"], {"event_type": "x.y", "payload": "text", "endpoint": endpoint}
    )
    assert by_name.status == by_id.status == 202
    assert (
        by_name.json["deliveries"][0]["endpoint_id"] == endpoint == by_id.json["deliveries"][0]["endpoint_id"]
    )


def queue_rows(db):
    return query(db, "SELECT count(*) FROM webhooks.alert_delivery_queue")[0][0]


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        (b"{not json", 400, None),
        (b"", 400, None),
        (b"[1, 2]", 422, "(body)"),
        (b'{"payload": {}}', 422, "event_type"),
        (b'{"event_type": "a.b"}', 422, "payload"),
        (b'{"event_type": 5, "payload": {}}', 422, "event_type"),
        (b'{"event_type": "a.b", "payload": {}, "priority": "high"}', 422, "priority"),
        (b'{"event_type": "a.b", "payload": {}, "colour": "red"}', 422, "colour"),
        (b'{"event_type": "a.b", "payload": {}, "endpoint": "nowhere"}', 422, "endpoint"),
        (b'{"event_type": "a\\nb", "payload": {}}', 422, "event_type"),
        (b'{"event_type": "webhook.fake", "payload": {}}', 422, "event_type"),
        (b'{"event_type": "a.b", "payload": {}, "expires_at": "tomorrow"}', 422, "expires_at"),
    ],
    ids=[
        "invalid json",
        "empty",
        "array",
        "no event type",
        "no payload",
        "wrong type",
        "wrong type 2",
        "unknown field",
        "unknown endpoint",
        "control character",
        "reserved type",
        "bad timestamp",
    ],
)
def test_publish_refuses_bad_input_and_writes_nothing(api, role_tokens, db, receiver, body, status, field):
    add_endpoint(db, receiver.url("/a"), name="target")
    answer = api.post("/v1/messages", role_tokens["producer"], raw=body)
    assert answer.status == status, answer.body
    assert answer.headers["content-type"].startswith("application/problem+json")
    if field is not None:
        assert answer.json["field"] == field and answer.json["detail"].startswith(field)
    assert queue_rows(db) == 0


def test_publish_refuses_a_bad_traceparent_and_an_oversized_payload(api, role_tokens, db, receiver):
    add_endpoint(db, receiver.url("/a"), name="target")
    message = {"event_type": "a.b", "payload": {}, "endpoint": "target"}
    bad_trace = api.post("/v1/messages", role_tokens["producer"], message, headers={"traceparent": "00-zz"})
    assert bad_trace.status == 422 and bad_trace.json["field"] == "traceparent"
    query(db, "UPDATE webhooks.delivery_config SET max_payload_bytes = 1024")
    large = api.post("/v1/messages", role_tokens["producer"], {**message, "payload": {"x": "y" * 2000}})
    assert large.status == 413 and large.json["field"] == "payload" and "limit" in large.json["detail"]
    huge = api.post("/v1/messages", role_tokens["producer"], raw=b'{"payload": "' + b"x" * 2_000_000 + b'"}')
    assert huge.status == 413
    assert queue_rows(db) == 0


def test_deliveries_page_stably_while_rows_are_inserted(api, role_tokens, db, receiver):
    endpoint = add_endpoint(db, receiver.url("/a"), name="paged")
    first = enqueue(db, endpoint, count=5)
    seen, cursor = [], None
    while True:
        path = "/v1/deliveries?endpoint=paged&limit=2" + (f"&cursor={cursor}" if cursor else "")
        page = api.get(path, role_tokens["reader"])
        assert page.status == 200, page.body
        seen += [row["delivery_id"] for row in page.json["items"]]
        enqueue(db, endpoint)  # a row inserted between pages does not shift the pages
        cursor = page.json["next_cursor"]
        if cursor is None:
            break
    assert seen == sorted(first, reverse=True)


def test_deliveries_filters_and_lookup_by_key(api, role_tokens, db, receiver):
    endpoint = add_endpoint(db, receiver.url("/a"), name="filtered")
    dead = dead_letter(db, endpoint)
    [pending] = enqueue(db, endpoint, event_type="other.thing")
    reader = role_tokens["reader"]
    assert [r["delivery_id"] for r in api.get("/v1/deliveries?status=dead_letter", reader).json["items"]] == [
        dead
    ]
    assert [
        r["delivery_id"] for r in api.get("/v1/deliveries?event_type=other.thing", reader).json["items"]
    ] == [pending]
    [(key,)] = query(
        db, "SELECT idempotency_key FROM webhooks.alert_delivery_queue WHERE delivery_id = %s", (pending,)
    )
    assert [
        r["delivery_id"] for r in api.get(f"/v1/deliveries?idempotency_key={key}", reader).json["items"]
    ] == [pending]
    assert (
        api.get("/v1/deliveries?since=2000-01-01T00:00:00Z&category=http_4xx", reader).json["items"][0][
            "delivery_id"
        ]
        == dead
    )
    detail = api.get(f"/v1/deliveries/{dead}", reader)
    assert detail.status == 200 and detail.json["payload"] == {"n": 1}


@pytest.mark.parametrize(
    ("path", "field"),
    [
        ("/v1/deliveries?cursor=bm90LWEtY3Vyc29y", "cursor"),
        ("/v1/deliveries?cursor=%%%", "cursor"),
        ("/v1/dead-letters?cursor=WzFd", "cursor"),
        ("/v1/deliveries?limit=1001", "limit"),
        ("/v1/deliveries?limit=0", "limit"),
        ("/v1/deliveries?status=lost", "status"),
        ("/v1/deliveries?category=http_418", "category"),
        ("/v1/dead-letters?category=oops", "category"),
        ("/v1/dead-letters?category=Disabled", "category"),
        ("/v1/deliveries?since=yesterday", "since"),
        ("/v1/deliveries?since=2026-01-01T00:00:00", "since"),
        ("/v1/deliveries?colour=red", "colour"),
        ("/v1/deliveries?endpoint=nowhere", "endpoint"),
        ("/v1/deliveries/abc", "id"),
        ("/v1/deliveries/99999999999999999999", "id"),
        ("/v1/endpoints?cursor=xyz", "cursor"),
        ("/v1/endpoints/1/health?hours=0", "hours"),
    ],
    ids=lambda v: v,
)
def test_bad_query_parameters_name_the_parameter(api, role_tokens, world, path, field):
    answer = api.get(path, role_tokens["reader"])
    assert answer.status == 422, answer.body
    assert answer.json["field"] == field


@pytest.mark.parametrize(
    "path",
    ["/v1/deliveries/987654", "/v1/operations/987654", "/v1/endpoints/987654", "/v1/endpoints/nobody/health"],
)
def test_unknown_ids_are_404(api, role_tokens, path):
    answer = api.get(path, role_tokens["admin"])
    assert answer.status == 404 and answer.json["type"].endswith("/not-found")


def test_replay_one_and_refuse_a_row_that_is_not_finished(api, role_tokens, db, world):
    admin = role_tokens["admin"]
    answer = api.post(f"/v1/deliveries/{world['dead']}/replay", admin)
    assert answer.status == 202 and answer.json == {"delivery_id": world["dead"], "status": "pending"}
    again = api.post(f"/v1/deliveries/{world['dead']}/replay", admin)
    assert again.status == 409 and "pending" in again.json["detail"]
    assert api.post("/v1/deliveries/987654/replay", admin).status == 404
    assert api.post(f"/v1/deliveries/{world['delivered']}/replay", admin, {"extra": 1}).status == 422


def test_two_admins_replaying_one_row_at_once_give_one_replay(api, role_tokens, db, receiver):
    endpoint = add_endpoint(db, receiver.url("/a"), name="raced")
    for _round in range(5):
        dead = dead_letter(db, endpoint)
        barrier = threading.Barrier(2)
        statuses = []

        def replay(dead=dead, barrier=barrier, statuses=statuses):
            barrier.wait()
            statuses.append(api.post(f"/v1/deliveries/{dead}/replay", role_tokens["admin"]).status)

        threads = [threading.Thread(target=replay) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert sorted(statuses) == [202, 409]
        assert query(
            db, "SELECT replays FROM webhooks.alert_delivery_queue WHERE delivery_id = %s", (dead,)
        ) == [(1,)]
        assert query(
            db,
            "SELECT count(*) FROM webhooks.alert_delivery_log WHERE delivery_id = %s"
            " AND outcome = 'replayed'",
            (dead,),
        ) == [(1,)]


BODY_ROUTES = [(r.method, r.path) for r in ROUTES if r.method in ("POST", "PATCH", "PUT")]


def written(db):
    """Everything a refused request must leave as it was."""
    return query(
        db,
        "SELECT (SELECT count(*) FROM webhooks.alert_delivery_queue),"
        " (SELECT count(*) FROM webhooks.alert_delivery_queue WHERE status = 'dead_letter'),"
        " (SELECT count(*) FROM webhooks.endpoints), (SELECT count(*) FROM webhooks.api_operations),"
        " (SELECT count(*) FROM webhooks.endpoint_events),"
        " (SELECT row_to_json(c)::text FROM webhooks.delivery_config c)",
    )


@pytest.mark.parametrize(("method", "path"), BODY_ROUTES, ids=lambda v: v)
def test_every_route_taking_a_body_refuses_bad_bodies_and_writes_nothing(
    api, role_tokens, db, world, method, path
):
    admin = role_tokens["admin"]
    url, _ = sample_request(method, path, world, "admin")
    before = written(db)
    invalid_json = api.request(method, url, admin, raw=b'{"oops": ')
    assert invalid_json.status == 400 and invalid_json.json["type"].endswith("/invalid-json"), (
        invalid_json.body
    )
    unknown = api.request(method, url, admin, {"no_such_field": 1})
    assert unknown.status == 422, unknown.body
    assert unknown.json["field"] == "no_such_field" or "no_such_field" in unknown.json["detail"]
    wrong_type = api.request(method, url, admin, raw=b'"a string"')
    assert wrong_type.status == 422, wrong_type.body
    oversized = api.request(method, url, admin, raw=b'{"x": "' + b"y" * (2 * 1024 * 1024) + b'"}')
    assert oversized.status == 413 and oversized.json["type"].endswith("/body-too-large"), oversized.body
    assert written(db) == before


@pytest.mark.parametrize(("method", "path"), [(r.method, r.path) for r in ROUTES if "{id}" in r.path],
                         ids=lambda v: v)
def test_every_route_with_an_id_answers_404_for_an_unknown_one(api, role_tokens, db, world, method, path):
    _, body = sample_request(method, path, world, "admin")
    before = written(db)
    answer = api.request(method, path.replace("{id}", "987654321"), role_tokens["admin"], body)
    assert answer.status == 404 and answer.json["type"].endswith("/not-found"), answer.body
    assert written(db) == before


def test_publish_without_a_key_answers_the_generated_event_id_to_look_it_up_by(
    api, role_tokens, db, receiver
):
    add_endpoint(db, receiver.url("/a"), name="keyless")
    published = api.post("/v1/messages", role_tokens["producer"], {"event_type": "a.b", "payload": {}})
    key = published.json["idempotency_key"]
    assert published.status == 202 and key.startswith("evt_")
    found = api.get(f"/v1/deliveries?idempotency_key={key}", role_tokens["reader"])
    assert [d["delivery_id"] for d in found.json["items"]] == [published.json["deliveries"][0]["delivery_id"]]


def test_a_body_not_sent_as_json_is_refused_with_415_and_405_says_what_is_allowed(api, role_tokens, db,
                                                                                  receiver):
    add_endpoint(db, receiver.url("/a"), name="a", event_types=("order.*",))
    producer = role_tokens["producer"]
    body = {"event_type": "order.paid", "payload": {}}
    for content_type in ("text/plain", "application/x-www-form-urlencoded", "application/jsonx"):
        refused = api.post("/v1/messages", producer, body, headers={"Content-Type": content_type})
        assert refused.status == 415, (content_type, refused.body)
        assert refused.json["type"].endswith("/unsupported-media-type")
    assert query(db, "SELECT count(*) FROM webhooks.alert_delivery_queue") == [(0,)]
    for n, content_type in enumerate(("application/json; charset=utf-8", "application/cloudevents+json")):
        accepted = api.post("/v1/messages", producer, {**body, "idempotency_key": f"k{n}"},
                            headers={"Content-Type": content_type})
        assert accepted.status == 202, (content_type, accepted.body)
    wrong_method = api.request("DELETE", "/v1/messages", producer)
    assert wrong_method.status == 405 and wrong_method.headers["allow"] == "GET, POST"


def _deep(levels):
    value: list = []
    for _ in range(levels - 1):
        value = [value]
    return value


@pytest.mark.parametrize(
    ("method", "path", "body", "field"),
    [
        ("POST", "/v1/messages", {"event_type": "a.b", "payload": {}, "priority": 40000}, "priority"),
        ("POST", "/v1/messages", {"event_type": "a.b", "payload": {"x": "a\u0000b"}}, "payload"),
        ("POST", "/v1/messages", {"event_type": "a.b", "payload": _deep(255)}, "payload"),
        ("POST", "/v1/dead-letters/replay", {"max": 3000000000}, "max"),
        ("POST", "/v1/tenants", {"name": "big", "max_endpoints": 3000000000}, "max_endpoints"),
        ("POST", "/v1/tenants", {"name": "big", "max_in_flight": 3000000000}, "max_in_flight"),
        ("POST", "/v1/endpoints", {"name": "big", "url": "https://example.com/", "max_in_flight": 3000000000},
         "max_in_flight"),
        ("GET", "/v1/deliveries?event_type=a%00b", None, "event_type"),
        ("GET", "/v1/tenants/%00", None, "id"),
        ("GET", "/v1/endpoints/a%00b", None, "id"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_values_the_database_cannot_take_are_422_naming_the_field(api, role_tokens, db, method, path, body,
                                                                 field):
    admin = role_tokens["admin"]
    before = written(db)
    answer = api.request(method, path, admin, body)
    assert answer.status == 422 and answer.json["field"] == field, answer.body
    assert written(db) == before


def test_an_integer_beyond_64_bits_is_refused_not_rounded(api, role_tokens, db):
    producer = role_tokens["producer"]
    for number in (b"18446744073709551617", b"-9223372036854775809"):
        raw = b'{"event_type": "a.b", "payload": {"n": ' + number + b"}}"
        answer = api.request("POST", "/v1/messages", producer, raw=raw)
        assert answer.status == 422 and number.decode() in answer.json["detail"], answer.body
    # within 64 bits, and long digit runs inside strings, are taken as they are
    raw = b'{"event_type": "a.b", "payload": {"n": 18446744073709551615, "s": "12345678901234567890123"}}'
    assert api.request("POST", "/v1/messages", producer, raw=raw).status == 202


def test_a_payload_254_levels_deep_is_published_and_read_back(api, role_tokens, db, receiver):
    # orjson writes at most 254 levels: the payload inside its delivery's answer is one level more
    add_endpoint(db, receiver.url("/a"), name="deep")
    message = {"event_type": "a.b", "payload": _deep(254)}
    published = api.post("/v1/messages", role_tokens["producer"], message)
    assert published.status == 202, published.body
    delivery_id = published.json["deliveries"][0]["delivery_id"]
    answer = api.get(f"/v1/deliveries/{delivery_id}", role_tokens["reader"])
    assert answer.status == 200, answer.body
    assert answer.json["payload"] == _deep(254)
    assert answer.json["created_at"][10] == "T"  # RFC 3339, as every other answer writes it
