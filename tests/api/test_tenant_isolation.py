"""Tokens scoped to a tenant: every /v1 route, called with another tenant's token, finds
nothing of this tenant, leaks nothing and changes nothing; PostgreSQL's row-level security, not only
the API's queries, is what keeps them apart."""

from __future__ import annotations

import psycopg
import pytest

from tests.api.console_client import Browserless, ConsoleServer
from tests.api.server import api_config
from tests.api.test_routes import dead_letter
from tests.support import add_endpoint, enqueue, query, stored
from worker.api.routes import ROUTES
from worker.rules import tokens
from worker.store import tokens as token_store


def scoped_token(db: str, role: str, tenant: str) -> str:
    return stored(db, token_store.create, f"{role}-{tenant}", role, None, tenant)


def in_tenant(db: str, endpoint: int, tenant_id: int) -> None:
    query(db, "UPDATE webhooks.endpoints SET tenant_id = %s WHERE id = %s", (tenant_id, endpoint))


@pytest.fixture
def two_tenants(db, receiver):
    return make_two_tenants(db, receiver)


def make_two_tenants(db, receiver):
    """Tenant acme: an endpoint with a dead letter, a delivered row and a state change; tenant
    globex (`other` is a reserved name): an endpoint with one pending row. Both are granted
    loopback, where the tests' receivers are."""
    grant = '{"allow_networks": ["127.0.0.1/32"]}'
    acme = query(db, "SELECT webhooks.register_tenant('acme', %s)", (grant,))[0][0]
    other = query(db, "SELECT webhooks.register_tenant('globex', %s)", (grant,))[0][0]
    endpoint = add_endpoint(db, receiver.url("/acme"), name="acme-orders")
    in_tenant(db, endpoint, acme)
    dead = dead_letter(db, endpoint, reason="http 400 acme-secret-reason")
    [delivered] = enqueue(db, endpoint, {"acme": "payload"})
    query(db, "UPDATE webhooks.alert_delivery_queue SET status = 'delivered', delivered_at = now()"
              " WHERE delivery_id = %s", (delivered,))
    query(db, "SELECT webhooks.replay(%s)", (delivered,))  # an audit row of acme's
    query(db, "SELECT webhooks.disable_endpoint(%s, 'acme maintenance')", (endpoint,))
    theirs = add_endpoint(db, receiver.url("/other"), name="other-hook")
    in_tenant(db, theirs, other)
    [pending] = enqueue(db, theirs)
    # an operation that matches nothing, stepped to its end here: a running one would change under
    # the test when the API process steps it
    [(operation,)] = query(db, "SELECT webhooks.api_start_replay('{\"event_type\": \"none\"}', NULL, NULL,"
                               " 'admin')")
    query(db, "SELECT count(*) FROM webhooks.api_replay_step(%s, 100)", (operation,))
    assert query(db, "SELECT status FROM webhooks.api_operations WHERE id = %s", (operation,)) == [("done",)]
    return {"acme": acme, "other": other, "endpoint": endpoint, "dead": dead, "delivered": delivered,
            "theirs": theirs, "pending": pending, "operation": operation}


def snapshot(db):
    return (query(db, "SELECT delivery_id, status, attempts, replays, tenant_id"
                      " FROM webhooks.alert_delivery_queue ORDER BY 1"),
            query(db, "SELECT id, name, active, tenant_id, updated_at FROM webhooks.endpoints ORDER BY 1"),
            query(db, "SELECT count(*) FROM webhooks.alert_delivery_log"),
            query(db, "SELECT count(*) FROM webhooks.endpoint_events"),
            query(db, "SELECT id, status FROM webhooks.api_operations ORDER BY 1"))


def test_every_route_with_another_tenants_token_finds_nothing_leaks_nothing_changes_nothing(
        api, db, two_tenants):
    """Each route with globex's reader (its producer to publish) and with globex's tenant
    administrator: acme's rows are not found, not shown and not changed."""
    w = two_tenants
    reader, producer = scoped_token(db, "reader", "globex"), scoped_token(db, "producer", "globex")
    tenant_admin = scoped_token(db, "tenant_admin", "globex")
    before = snapshot(db)
    acme_words = [b"acme", b"secret-reason"]
    ids = {"dead": w["dead"], "delivered": w["delivered"], "endpoint": w["endpoint"],
           "operation": w["operation"]}
    [(message, event_id)] = query(db, "SELECT m.message_id, m.event_id FROM webhooks.messages m"
                                      " JOIN webhooks.alert_delivery_queue q USING (message_id)"
                                      " WHERE q.delivery_id = %s", (w["delivered"],))
    endpoint = f"/v1/endpoints/{ids['endpoint']}"
    # route: the requests tried, each (method, path, body, status for the reader or producer,
    # status for the tenant administrator)
    calls = {
        ("GET", "/v1/token"): [("GET", "/v1/token", None, 200, 200)],
        ("GET", "/v1/openapi.json"): [("GET", "/v1/openapi.json", None, 200, 200)],
        ("POST", "/v1/messages"): [
            ("POST", "/v1/messages", {"event_type": "a.b", "payload": {}, "endpoint": "acme-orders"},
             422, 422),
            ("POST", "/v1/messages", {"event_type": "a.b", "payload": {}, "endpoint": str(w["endpoint"])},
             422, 422)],
        # each item refused alone (its own 422 in the results), nothing queued
        ("POST", "/v1/messages/batch"): [
            ("POST", "/v1/messages/batch", {"messages": [
                {"event_type": "a.b", "payload": {}, "endpoint": "acme-orders"},
                {"event_type": "a.b", "payload": {}, "endpoint": str(w["endpoint"])}]}, 200, 200)],
        ("GET", "/v1/messages"): [
            ("GET", "/v1/messages", None, 200, 200),
            ("GET", f"/v1/messages?idempotency_key={event_id}", None, 200, 200),
            ("GET", "/v1/messages?tenant=acme", None, 422, 422)],
        ("GET", "/v1/messages/{id}"): [("GET", f"/v1/messages/{message}", None, 404, 404)],
        ("GET", "/v1/deliveries"): [
            ("GET", "/v1/deliveries", None, 200, 200),
            ("GET", f"/v1/deliveries?endpoint={w['endpoint']}", None, 422, 422),
            ("GET", "/v1/deliveries?endpoint=acme-orders", None, 422, 422),
            ("GET", "/v1/deliveries?tenant=acme", None, 422, 422)],
        ("GET", "/v1/deliveries/{id}"): [("GET", f"/v1/deliveries/{ids['dead']}", None, 404, 404),
                                         ("GET", f"/v1/deliveries/{ids['delivered']}", None, 404, 404)],
        ("POST", "/v1/deliveries/{id}/replay"): [
            ("POST", f"/v1/deliveries/{ids['dead']}/replay", None, 403, 404)],
        ("GET", "/v1/dead-letters"): [("GET", "/v1/dead-letters", None, 200, 200),
                                      ("GET", "/v1/dead-letters?tenant=acme", None, 422, 422)],
        ("POST", "/v1/dead-letters/replay"): [
            ("POST", "/v1/dead-letters/replay", {"filter": {"endpoint": "acme-orders"}}, 403, 422)],
        ("GET", "/v1/operations/{id}"): [("GET", f"/v1/operations/{ids['operation']}", None, 404, 404)],
        ("POST", "/v1/operations/{id}/cancel"): [
            ("POST", f"/v1/operations/{ids['operation']}/cancel", None, 403, 404)],
        ("GET", "/v1/endpoints"): [("GET", "/v1/endpoints", None, 200, 200),
                                   ("GET", "/v1/endpoints?tenant=acme", None, 422, 422)],
        ("POST", "/v1/endpoints"): [
            ("POST", "/v1/endpoints", {"name": "x", "url": "https://example.com", "tenant": "acme"},
             403, 403)],
        ("GET", "/v1/endpoints/{id}"): [("GET", endpoint, None, 404, 404),
                                        ("GET", "/v1/endpoints/acme-orders", None, 404, 404)],
        ("PATCH", "/v1/endpoints/{id}"): [("PATCH", endpoint, {"max_attempts": 2}, 403, 404),
                                          ("PATCH", "/v1/endpoints/acme-orders", {"max_attempts": 2},
                                           403, 404)],
        ("DELETE", "/v1/endpoints/{id}"): [("DELETE", endpoint, None, 403, 404)],
        ("GET", "/v1/endpoints/{id}/health"): [("GET", f"{endpoint}/health", None, 404, 404)],
        ("POST", "/v1/endpoints/{id}/circuit"): [
            ("POST", f"{endpoint}/circuit", {"action": "reset"}, 403, 404)],
        ("POST", "/v1/endpoints/{id}/enable"): [("POST", f"{endpoint}/enable", None, 403, 404)],
        ("POST", "/v1/endpoints/{id}/disable"): [
            ("POST", f"{endpoint}/disable", {"reason": "x"}, 403, 404)],
        ("POST", "/v1/endpoints/{id}/rotate-secret"): [("POST", f"{endpoint}/rotate-secret", None, 403, 404)],
        ("GET", "/v1/endpoints/{id}/secret"): [("GET", f"{endpoint}/secret", None, 403, 404),
                                               ("GET", "/v1/endpoints/acme-orders/secret", None, 403, 404)],
        ("POST", "/v1/endpoints/{id}/test"): [("POST", f"{endpoint}/test", None, 403, 404),
                                              ("POST", "/v1/endpoints/acme-orders/test", None, 403, 404)],
        ("GET", "/v1/stats"): [("GET", "/v1/stats", None, 200, 200)],
        ("GET", "/v1/config"): [("GET", "/v1/config", None, 200, 403)],
        ("PATCH", "/v1/config"): [("PATCH", "/v1/config", {"max_attempts": 3}, 403, 403)],
        ("GET", "/v1/tenants"): [("GET", "/v1/tenants", None, 403, 403)],
        ("POST", "/v1/tenants"): [("POST", "/v1/tenants", {"name": "x"}, 403, 403)],
        ("GET", "/v1/tenants/{id}"): [("GET", "/v1/tenants/acme", None, 403, 403)],
        ("PATCH", "/v1/tenants/{id}"): [("PATCH", "/v1/tenants/acme", {"max_queued": 1}, 403, 403)],
        ("GET", "/v1/event-types"): [("GET", "/v1/event-types", None, 200, 200)],
        ("GET", "/v1/event-types/{name}"): [("GET", "/v1/event-types/webhook.test", None, 200, 200)],
        ("PUT", "/v1/event-types/{name}"): [("PUT", "/v1/event-types/a.b", {"description": "x"}, 403, 403)],
        ("POST", "/v1/event-types/{name}/deprecate"): [
            ("POST", "/v1/event-types/webhook.test/deprecate", None, 403, 403)],
        ("GET", "/v1/triggers"): [("GET", "/v1/triggers", None, 403, 200)],
        ("GET", "/v1/tokens"): [("GET", "/v1/tokens", None, 403, 403)],
        ("POST", "/v1/tokens"): [("POST", "/v1/tokens", {"name": "x", "role": "admin"}, 403, 403)],
        ("POST", "/v1/tokens/{name}/revoke"): [
            ("POST", "/v1/tokens/tenant_admin-globex/revoke", None, 403, 403)],
        ("POST", "/v1/tenants/{id}/portal-link"): [
            ("POST", "/v1/tenants/acme/portal-link", None, 403, 403)],
    }
    assert set(calls) == {(route.method, route.path) for route in ROUTES}  # every route is tried
    for (method, route), tries in calls.items():
        for verb, path, body, status, admin_status in tries:
            publishes = (method, route) in (("POST", "/v1/messages"), ("POST", "/v1/messages/batch"))
            scoped = producer if publishes else reader
            for token, expected in ((scoped, status), (tenant_admin, admin_status)):
                answer = api.request(verb, path, token, body)
                who = "tenant_admin" if token == tenant_admin else "reader"
                assert answer.status == expected, (verb, path, who, answer.status, answer.body)
                if path != "/v1/openapi.json":
                    asked = (path + repr(body)).encode()  # what the caller gave may be echoed, nothing else
                    for word in acme_words:
                        assert word in asked or word not in answer.body, (verb, path, word, answer.body)
    # what the lists show is the other tenant's alone, to its reader and to its administrator
    for token in (reader, tenant_admin):
        listed = api.get("/v1/deliveries", token).json["items"]
        assert [d["delivery_id"] for d in listed] == [w["pending"]]
        messages = api.get("/v1/messages", token).json["items"]
        assert [[d["delivery_id"] for d in m["deliveries"]] for m in messages] == [[w["pending"]]]
        assert api.get(f"/v1/messages?idempotency_key={event_id}", token).json["items"] == []
        assert api.get("/v1/dead-letters", token).json["items"] == []
        assert [e["id"] for e in api.get("/v1/endpoints", token).json["items"]] == [w["theirs"]]
        assert [e["id"] for e in api.get("/v1/endpoints?tenant=globex", token).json["items"]] == [w["theirs"]]
        stats = api.get("/v1/stats", token).json
        assert {s["status"]: s["deliveries"] for s in stats["queue"]} == {
            "pending": 1, "delivering": 0, "retrying": 0, "delivered": 0, "dead_letter": 0}
        assert stats["held_back"] == []  # acme's disabled endpoint holds rows back: not theirs to see
    assert snapshot(db) == before  # nothing changed
    # the unscoped reader still sees everything, and narrows to a tenant when it asks
    everyone = role_token(db, "reader")
    assert len(api.get("/v1/deliveries", everyone).json["items"]) == 3
    assert [d["delivery_id"] for d in api.get("/v1/deliveries?tenant=globex", everyone).json["items"]] == [
        w["pending"]]
    assert [d["delivery_id"] for d in api.get("/v1/dead-letters?tenant=acme", everyone).json["items"]] == [
        w["dead"]]
    assert len(api.get("/v1/messages", everyone).json["items"]) == 3
    assert [[d["delivery_id"] for d in m["deliveries"]]
            for m in api.get("/v1/messages?tenant=globex", everyone).json["items"]] == [[w["pending"]]]
    assert api.get(f"/v1/messages/{message}", everyone).json["payload"] == {"acme": "payload", "n": 1}
    assert [e["name"] for e in api.get("/v1/endpoints?tenant=acme", everyone).json["items"]] == [
        "acme-orders"]


def role_token(db, role):
    return stored(db, token_store.create, f"{role}-all", role, None)


def test_a_scoped_producer_publishes_only_to_its_tenants_endpoints(api, db, two_tenants):
    w = two_tenants
    producer = scoped_token(db, "producer", "globex")
    query(db, "SELECT webhooks.enable_endpoint(%s, 'test')", (w["endpoint"],))
    answer = api.post("/v1/messages", producer, {"event_type": "order.paid", "payload": {"n": 1}})
    assert answer.status == 202, answer.body
    assert [d["endpoint_id"] for d in answer.json["deliveries"]] == [w["theirs"]]  # fan-out: its own only


def test_publishing_beyond_the_tenants_queued_quota_gets_429_with_retry_after(
        api, db, two_tenants, role_tokens):
    w = two_tenants
    query(db, "SELECT webhooks.update_tenant('globex', '{\"max_queued\": 2}')")
    producer = scoped_token(db, "producer", "globex")
    assert api.post("/v1/messages", producer, {"event_type": "a", "payload": {}}).status == 202  # 2 queued
    refused = api.post("/v1/messages", producer, {"event_type": "a", "payload": {}})
    assert refused.status == 429 and int(refused.headers["retry-after"]) > 0, refused.body
    assert "tenant globex: at its quota of 2 queued deliveries" in refused.json["detail"]
    # an unscoped token is held to the tenant's quota too, for that tenant's endpoint
    full = api.post("/v1/messages", role_tokens["producer"],
                    {"event_type": "a", "payload": {}, "endpoint": "other-hook"})
    assert full.status == 429
    # a batch queues what fits, in order, and answers 429 for the rest (tests/api/test_gate_api.py)
    query(db, "SELECT webhooks.update_tenant('globex', '{\"max_queued\": 3}')")
    batch = api.post("/v1/messages/batch", producer, {"messages": [
        {"event_type": "a", "payload": {}}, {"event_type": "a", "payload": {}}]})
    assert batch.status == 202 and int(batch.headers["retry-after"]) > 0, batch.body
    assert [r["status"] if "status" in r else r["created"] for r in batch.json["results"]] == [True, 429]
    # a producer writing SQL is never refused: its rows wait under the tenant's limits
    enqueue(db, w["theirs"], count=3)
    assert query(db, "SELECT count(*) FROM webhooks.alert_delivery_queue WHERE tenant_id = %s",
                 (w["other"],)) == [(6,)]


def test_row_level_security_itself_keeps_a_scoped_session_to_its_tenant(db, two_tenants):
    """Not the views or the API's WHERE clauses: the tables, read and written as the reader role."""
    w = two_tenants
    with psycopg.connect(db) as conn:
        conn.execute("SET LOCAL ROLE webhooks_reader")
        conn.execute("SELECT set_config('webhooks.tenant', %s, true)", (str(w["other"]),))
        for table, rows in (("alert_delivery_queue", 1), ("messages", 1), ("deliveries", 1),
                            ("alert_delivery_log", 0), ("endpoints", 1),
                            ("webhook_health_metrics", 1), ("endpoint_events", 0), ("tenants", 1),
                            ("api_operations", 0)):
            count = conn.execute(f"SELECT count(*) FROM webhooks.{table}").fetchone()[0]
            assert count == rows, table
        conn.rollback()
    with psycopg.connect(db) as conn:
        # unset, as for the worker's functions, producers and dashboards: nothing is filtered
        conn.execute("SET LOCAL ROLE webhooks_reader")
        assert conn.execute("SELECT count(*) FROM webhooks.alert_delivery_queue").fetchone()[0] == 3
        assert conn.execute("SELECT count(*) FROM webhooks.messages").fetchone()[0] == 3


def test_only_producer_reader_and_tenant_admin_tokens_can_be_scoped(db, two_tenants):
    with pytest.raises(ValueError, match=r"^tenant: an admin"):
        stored(db, token_store.create, "admin-other", "admin", None, "globex")
    with psycopg.connect(db, autocommit=True) as conn, pytest.raises(psycopg.errors.CheckViolation):
        conn.execute("SELECT webhooks.api_create_token('admin-other', 'admin', %s, NULL, 'globex')",
                     (tokens.token_hash(tokens.generate_token()),))
    with pytest.raises(psycopg.errors.NoDataFound):
        stored(db, token_store.create, "reader-nobody", "reader", None, "nobody")
    assert query(db, "SELECT count(*) FROM webhooks.api_tokens") == [(0,)]


def test_admins_add_read_and_change_tenants_over_http(api, db, role_tokens):
    admin = role_tokens["admin"]
    created = api.post("/v1/tenants", admin, {"name": "acme", "rate_limit_per_second": 20, "max_queued": 500})
    assert created.status == 201, created.body
    shown = created.json
    assert (shown["name"], float(shown["rate_limit_per_second"]), shown["max_queued"]) == ("acme", 20.0, 500)
    assert api.post("/v1/tenants", admin, {"name": "acme"}).status == 409
    bad = api.post("/v1/tenants", admin, {"name": "b", "max_in_flight": 0})
    assert bad.status == 422 and bad.json["field"] == "max_in_flight"
    assert api.post("/v1/tenants", admin, {"name": "has space"}).json["field"] == "name"
    changed = api.request("PATCH", "/v1/tenants/acme", admin, {"max_queued": None, "max_in_flight": 4})
    assert changed.status == 200, changed.body
    assert (changed.json["max_queued"], changed.json["max_in_flight"]) == (None, 4)
    assert api.get(f"/v1/tenants/{created.json['id']}", admin).json["name"] == "acme"
    assert [t["name"] for t in api.get("/v1/tenants", admin).json["items"]] == ["default", "acme"]
    assert api.get("/v1/tenants/nobody", admin).status == 404
    assert api.request("PATCH", "/v1/tenants/acme", admin, {}).status == 422
    assert api.get("/v1/tenants", role_tokens["reader"]).status == 403
    assert query(db, "SELECT name, max_in_flight, max_queued FROM webhooks.tenants ORDER BY id") == [
        ("default", None, None), ("acme", 4, None)]


def test_a_scoped_readers_console_shows_only_its_tenant(db, two_tenants):
    w = two_tenants
    server = ConsoleServer(api_config(db)).start()
    try:
        person = Browserless(server)
        assert person.login(scoped_token(db, "reader", "globex")).status == 303
        pages = {path: person.get(path) for path in (
            "/console/", "/console/endpoints", "/console/dead-letters", f"/console/deliveries/{w['dead']}")}
        assert pages[f"/console/deliveries/{w['dead']}"].status == 404
        for path, answer in pages.items():
            assert b"acme" not in answer.body, path
        assert b"other-hook" in pages["/console/endpoints"].body
        everyone = Browserless(server)
        assert everyone.login(role_token(db, "reader")).status == 303
        assert b"acme-orders" in everyone.get("/console/endpoints").body  # unscoped: every tenant
    finally:
        server.stop()


def test_the_console_pages_filter_by_tenant(db, two_tenants):
    w = two_tenants
    dead_letter(db, w["theirs"], reason="http 400 other-reason")
    server = ConsoleServer(api_config(db)).start()
    try:
        person = Browserless(server)
        assert person.login(role_token(db, "admin")).status == 303
        everything = person.get("/console/dead-letters").body.decode()
        assert "acme-secret-reason" in everything and "other-reason" in everything
        assert 'id="f-tenant"' in everything  # the filter is offered when there are tenants
        other_only = person.get("/console/dead-letters?tenant=globex").body.decode()
        assert "other-reason" in other_only and "acme-secret-reason" not in other_only
        endpoints = person.get("/console/endpoints?tenant=globex").body.decode()
        assert "other-hook" in endpoints and "acme-orders" not in endpoints
        overview = person.get("/console/?tenant=acme").body.decode()
        assert "acme-orders" in overview and "other-hook" not in overview
        unknown = person.get("/console/dead-letters?tenant=nobody")
        assert unknown.status == 422 and "tenant" in unknown.body.decode()
        # a scoped reader cannot widen or change its tenant
        scoped = Browserless(server)
        assert scoped.login(scoped_token(db, "reader", "globex")).status == 303
        assert scoped.get("/console/dead-letters?tenant=acme").status == 422
    finally:
        server.stop()
