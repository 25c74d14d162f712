"""Self-service over HTTP: a tenant administrator's token manages its tenant's endpoints, deliveries
and dead letters as an admin does; signing secrets and test events; the event-type catalogue; tokens
and an endpoint's tenant for unscoped admins."""

from __future__ import annotations

import json

import pytest

from tests.api.server import make_token
from tests.api.test_routes import dead_letter
from tests.support import add_endpoint, eventually, query, statuses
from worker.rules import signing, tokens

INVOICE_SCHEMA = {"type": "object", "required": ["invoice_id"],
                  "properties": {"invoice_id": {"type": "string"}}}


@pytest.fixture
def acme(db, receiver):
    """Tenant acme with an administrator token, and tenant globex with an endpoint and a dead letter;
    both granted loopback, where the tests' receivers are."""
    for name in ("acme", "globex"):
        query(db, "SELECT webhooks.register_tenant(%s, '{\"allow_networks\": [\"127.0.0.1/32\"]}')", (name,))
    theirs = add_endpoint(db, receiver.url("/globex"), name="globex-hook", tenant="globex")
    return {"token": make_token(db, "tenant_admin", name="acme-admin", tenant="acme"), "theirs": theirs,
            "their_dead": dead_letter(db, theirs)}


def test_a_tenant_admin_manages_its_tenants_endpoints_and_deliveries_over_http(api, db, receiver, acme,
                                                                                spawn):
    admin = acme["token"]
    assert api.get("/v1/token", admin).json == {"name": "acme-admin", "role": "tenant_admin"}
    created = api.post("/v1/endpoints", admin, {"name": "acme-orders", "url": receiver.url("/acme"),
                                                "event_types": ["order.*"]})
    assert created.status == 201, created.body
    endpoint, first_secret = created.json["id"], created.json["signing_secret"]
    assert created.json["tenant"] == "acme"  # its tenant, without naming it
    assert query(db, "SELECT t.name FROM webhooks.endpoints e JOIN webhooks.tenants t ON t.id = e.tenant_id"
                     " WHERE e.id = %s", (endpoint,)) == [("acme",)]
    path = f"/v1/endpoints/{endpoint}"
    assert api.request("PATCH", path, admin, {"timeout_seconds": 4}).json["timeout_seconds"] == 4
    assert api.post(f"{path}/disable", admin, {"reason": "maintenance"}).json["changed"] is True
    assert api.post(f"{path}/enable", admin).json["changed"] is True
    assert api.post(f"{path}/circuit", admin, {"action": "open"}).json["change"] == "circuit_forced_open"
    assert api.post(f"{path}/circuit", admin, {"action": "reset"}).status == 200
    assert api.get(f"{path}/health", admin).status == 200
    # the secret: read back (the receiver needs it), then rotated and read again, newest first
    read = api.get(f"{path}/secret", admin)
    assert read.status == 200 and read.json["signing_secret"] == first_secret, read.body
    assert read.json["secrets"] == [{"secret": first_secret, "expires_at": None}]
    rotated = api.post(f"{path}/rotate-secret", admin, {"expire_old_after_hours": 1})
    assert rotated.status == 200 and rotated.json["active_secrets"] == 2
    read = api.get(f"{path}/secret", admin).json
    assert read["signing_secret"] == rotated.json["signing_secret"]
    assert [s["secret"] for s in read["secrets"]] == [rotated.json["signing_secret"], first_secret]
    # its dead letters (made before a worker runs): replayed one by one and in bulk, never globex's
    ours = [dead_letter(db, endpoint) for _ in range(2)]
    assert [d["delivery_id"] for d in api.get("/v1/dead-letters", admin).json["items"]] == ours
    assert api.post(f"/v1/deliveries/{ours[0]}/replay", admin).status == 202
    bulk = api.post("/v1/dead-letters/replay", admin, {})
    assert bulk.status == 202, bulk.body
    eventually(lambda: api.get(bulk.headers["location"], admin).json["status"] == "done",
               message="the bulk replay done")
    assert statuses(db, [acme["their_dead"], *ours]) == {
        acme["their_dead"]: "dead_letter", ours[0]: "pending", ours[1]: "pending"}
    queue = {s["status"]: s["deliveries"] for s in api.get("/v1/stats", admin).json["queue"]}
    assert (queue["dead_letter"], queue["pending"]) == (0, 2)
    # a test event to it alone: 202 and where to follow its delivery, which a worker delivers signed
    sent = api.post(f"{path}/test", admin)
    assert sent.status == 202, sent.body
    delivery = sent.json["delivery_id"]
    assert sent.headers["location"] == f"/v1/deliveries/{delivery}"
    assert api.get(sent.headers["location"], admin).json["event_type"] == "webhook.test"
    spawn(db)
    eventually(lambda: statuses(db, [delivery]) == {delivery: "delivered"},
               message="the test event delivered")
    [request] = [r for r in receiver.to("/acme") if r.delivery_id == delivery]
    signing.verify(read["signing_secret"], request.headers, request.body)
    assert json.loads(request.body)["tenant"] == "acme"
    # an endpoint without deliveries is deleted
    spare = api.post("/v1/endpoints", admin, {"name": "acme-spare", "url": receiver.url("/spare")}).json["id"]
    assert api.request("DELETE", f"/v1/endpoints/{spare}", admin).status == 204
    # never the fleet's settings, tenants or tokens
    for method, route, body in (("GET", "/v1/config", None), ("PATCH", "/v1/config", {"max_attempts": 3}),
                                ("GET", "/v1/tenants", None), ("POST", "/v1/tenants", {"name": "mine"}),
                                ("GET", "/v1/tokens", None),
                                ("POST", "/v1/tokens", {"name": "more", "role": "tenant_admin",
                                                        "tenant": "acme"}),
                                ("PUT", "/v1/event-types/order.paid", {})):
        answer = api.request(method, route, admin, body)
        assert answer.status == 403 and "tenant_admin" in answer.json["detail"], (method, route, answer.body)


def test_a_tenant_admin_cannot_register_into_another_tenant_or_for_every_tenant(api, db, acme):
    admin = acme["token"]
    before = query(db, "SELECT count(*) FROM webhooks.endpoints")
    other = api.post("/v1/endpoints", admin, {"name": "x", "url": "https://example.com/x",
                                              "tenant": "globex"})
    assert other.status == 403 and other.json["field"] == "tenant", other.body
    everyone = api.post("/v1/endpoints", admin, {"name": "x", "url": "https://example.com/x",
                                                 "operational_all_tenants": True})
    assert everyone.status == 403 and everyone.json["field"] == "operational_all_tenants"
    # its own tenant named, as an answer read back would name it: accepted
    own = api.post("/v1/endpoints", admin, {"name": "x", "url": "https://example.com/x", "tenant": "acme"})
    assert own.status == 201 and own.json["tenant"] == "acme", own.body
    assert query(db, "SELECT count(*) FROM webhooks.endpoints") == [(before[0][0] + 1,)]


def test_an_unscoped_admin_registers_in_a_tenant_and_lists_by_tenant(api, db, role_tokens, acme):
    admin = role_tokens["admin"]
    created = api.post("/v1/endpoints", admin, {"name": "for-acme", "url": "https://example.com/a",
                                                "tenant": "acme"})
    assert created.status == 201 and created.json["tenant"] == "acme", created.body
    assert api.get(f"/v1/endpoints/{created.json['id']}", admin).json["tenant"] == "acme"
    unknown = api.post("/v1/endpoints", admin, {"name": "y", "url": "https://example.com/y",
                                                "tenant": "nobody"})
    assert unknown.status == 422 and unknown.json["field"] == "tenant", unknown.body
    default = api.post("/v1/endpoints", admin, {"name": "z", "url": "https://example.com/z"})
    assert default.json["tenant"] == "default"
    listed = api.get("/v1/endpoints?tenant=acme", admin).json["items"]
    assert [e["name"] for e in listed] == ["for-acme"]
    assert [d["delivery_id"] for d in api.get("/v1/dead-letters?tenant=globex", admin).json["items"]] == [
        acme["their_dead"]]
    assert api.get("/v1/dead-letters?tenant=acme", admin).json["items"] == []
    assert api.get("/v1/deliveries?tenant=nobody", admin).json["field"] == "tenant"


def test_tokens_over_http_are_created_once_listed_without_the_token_and_revoked(api, db, role_tokens, acme):
    admin = role_tokens["admin"]
    created = api.post("/v1/tokens", admin, {"name": "acme-portal", "role": "tenant_admin", "tenant": "acme",
                                             "expires_in_days": 30})
    assert created.status == 201, created.body
    token = created.json["token"]
    assert tokens.well_formed(token) and created.json["tenant"] == "acme"
    assert api.get("/v1/token", token).json == {"name": "acme-portal", "role": "tenant_admin"}
    assert [e["name"] for e in api.get("/v1/endpoints", token).json["items"]] == []  # acme has none
    listed = api.get("/v1/tokens", admin)
    assert listed.status == 200 and token.encode() not in listed.body
    row = next(t for t in listed.json["items"] if t["name"] == "acme-portal")
    assert (row["role"], row["tenant"], row["state"]) == ("tenant_admin", "acme", "active")
    revoked = api.post("/v1/tokens/acme-portal/revoke", admin)
    assert revoked.json == {"name": "acme-portal", "state": "revoked"}
    assert api.get("/v1/token", token).status == 401  # at once
    assert api.post("/v1/tokens/acme-portal/revoke", admin).status == 404
    # refused, naming the field, and nothing stored
    before = query(db, "SELECT count(*) FROM webhooks.api_tokens")
    for body, status, field in (
        ({"name": "a", "role": "tenant_admin"}, 422, "tenant"),
        ({"name": "a", "role": "admin", "tenant": "acme"}, 422, "tenant"),
        ({"name": "a", "role": "reader", "tenant": "nobody"}, 422, "tenant"),
        ({"name": "a", "role": "root"}, 422, "role"),
        ({"name": " ", "role": "reader"}, 422, "name"),
        ({"name": "a", "role": "reader", "expires_in_days": 0}, 422, "expires_in_days"),
        ({"name": "acme-portal", "role": "reader"}, 409, "name"),
    ):
        answer = api.post("/v1/tokens", admin, body)
        assert (answer.status, answer.json.get("field")) == (status, field), (body, answer.body)
    assert query(db, "SELECT count(*) FROM webhooks.api_tokens") == before


def test_the_event_type_catalogue_over_http(api, db, role_tokens, receiver):
    admin, reader = role_tokens["admin"], role_tokens["reader"]
    created = api.request("PUT", "/v1/event-types/invoice.paid", admin,
                          {"description": "An invoice was paid", "schema": INVOICE_SCHEMA})
    assert created.status == 201, created.body
    assert created.headers["location"] == "/v1/event-types/invoice.paid"
    assert created.json == {"name": "invoice.paid", "description": "An invoice was paid",
                            "schema": INVOICE_SCHEMA, "deprecated": False, "problem": None}
    replaced = api.request("PUT", "/v1/event-types/invoice.paid", admin, {"description": "Paid"})
    assert replaced.status == 200 and replaced.json["schema"] is None
    assert api.get("/v1/event-types/invoice.paid", reader).json["description"] == "Paid"
    deprecated = api.post("/v1/event-types/invoice.paid/deprecate", admin)
    assert deprecated.status == 200 and deprecated.json["deprecated"] is True
    assert api.post("/v1/event-types/invoice.paid/deprecate", admin, {"deprecated": False}).json[
        "deprecated"] is False
    assert api.post("/v1/event-types/nothing.here/deprecate", admin).status == 404
    assert api.get("/v1/event-types/nothing.here", reader).status == 404
    # subscriptions that match no current type are shown as such
    add_endpoint(db, receiver.url("/a"), name="typo", event_types=("invoice.payed", "invoice.*"))
    listing = api.get("/v1/event-types", reader).json
    assert "invoice.paid" in [t["name"] for t in listing["items"]]
    assert [(u["endpoint_name"], u["pattern"], u["problem"]) for u in listing["unmatched_subscriptions"]] == [
        ("typo", "invoice.payed", "unknown")]
    # refused, naming the field, and nothing written
    before = query(db, "SELECT name, description, schema FROM webhooks.event_types ORDER BY name")
    for name, body, field in (
        ("webhook.mine", {}, "name"),
        ("a*", {}, "name"),
        ("bad.schema", {"schema": {"type": 5}}, "schema"),
        ("long.text", {"description": "x" * 2001}, "description"),
        ("extra", {"colour": "red"}, "colour"),
    ):
        answer = api.request("PUT", f"/v1/event-types/{name}", admin, body)
        assert answer.status == 422 and answer.json["field"] == field, (name, answer.body)
    assert api.post("/v1/event-types/webhook.test/deprecate", admin).json["field"] == "name"
    assert query(db, "SELECT name, description, schema FROM webhooks.event_types ORDER BY name") == before


def test_an_admins_test_event_and_secret_read_are_logged_without_the_secret(api, db, role_tokens, receiver,
                                                                          capfd):
    secret = signing.generate_secret()
    add_endpoint(db, receiver.url("/a"), name="logged", secret=secret)
    read = api.get("/v1/endpoints/logged/secret", role_tokens["admin"])
    assert read.status == 200 and read.json["signing_secret"] == secret
    assert api.get("/v1/endpoints/logged/secret", role_tokens["reader"]).status == 403
    assert api.post("/v1/endpoints/logged/test", role_tokens["admin"]).status == 202
    assert api.post("/v1/endpoints/nobody/test", role_tokens["admin"]).status == 404
    logged = capfd.readouterr()
    text = logged.out + logged.err
    assert "api read a signing secret" in text and "api sent a test event" in text
    assert secret not in text and secret.removeprefix("whsec_") not in text



def test_a_rotation_over_http_is_logged_and_an_operational_event_as_a_read_is_logged(api, db, role_tokens,
                                                                                     capfd):
    """Rotating a secret is logged (who, which endpoint, never the secret), recorded in the endpoint's
    changes with who decided it, and queued as webhook.endpoint.secret_rotated for the tenant's
    endpoints that subscribe to it, never for the endpoint itself."""
    rotated_one = add_endpoint(db, "https://hooks.example.test/a", name="rotated",
                               event_types=("webhook.endpoint.secret_rotated",))
    ops = add_endpoint(db, "https://hooks.example.test/ops", name="ops",
                       event_types=("webhook.endpoint.secret_rotated",))
    answer = api.post("/v1/endpoints/rotated/rotate-secret", role_tokens["admin"],
                      {"expire_old_after_hours": 2})
    assert answer.status == 200, answer.body
    new_secret = answer.json["signing_secret"]
    text = "".join(capfd.readouterr())
    assert "api rotated a signing secret" in text and f"endpoint_id={rotated_one}" in text
    assert new_secret not in text and new_secret.removeprefix("whsec_") not in text
    [(change, reason, decided_by)] = query(
        db, "SELECT change, reason, decided_by FROM webhooks.endpoint_events WHERE webhook_id = %s",
        (rotated_one,))
    assert (change, decided_by) == ("secret_rotated", f"api:{name_of(db, role_tokens['admin'])}")
    assert reason.startswith("the earlier secrets sign until ")
    assert api.get("/v1/endpoints/rotated", role_tokens["admin"]).json["recent_changes"][0]["change"] == \
        "secret_rotated"
    queued = query(db, "SELECT webhook_id, event_type, payload ->> 'change' FROM webhooks.deliveries")
    assert queued == [(ops, "webhook.endpoint.secret_rotated", "secret_rotated")]
    assert new_secret not in json.dumps(query(db, "SELECT payload FROM webhooks.deliveries")[0][0])


def name_of(db: str, token: str) -> str:
    return str(query(db, "SELECT name FROM webhooks.api_tokens WHERE token_hash = %s",
                     (tokens.token_hash(token),))[0][0])
