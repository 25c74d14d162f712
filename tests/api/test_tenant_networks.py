"""Networks over HTTP: a tenant's administrator registers endpoints on public destinations and the
networks the operator granted its tenant, never on the operator's security.allow_networks; the
grant is the operator's, shown with the tenant."""

from __future__ import annotations

from tests.acceptance.test_cli import cli
from tests.api.server import make_token
from tests.support import add_endpoint, eventually, query, statuses

NOT_ALLOWED = "not allowed for this tenant"


def test_a_tenant_admin_registers_only_where_its_tenant_may_deliver(api, db, receiver, spawn):
    # the API's and the workers' allow list is loopback: the operator's own receivers are there
    query(db, "SELECT webhooks.register_tenant('acme')")
    admin = make_token(db, "tenant_admin", name="acme-admin", tenant="acme")
    operator = make_token(db, "admin")
    hook = {"name": "acme-hook", "url": receiver.url("/acme")}

    refused = api.post("/v1/endpoints", admin, hook)
    assert refused.status == 422 and refused.json["field"] == "url", refused.body
    assert NOT_ALLOWED in refused.json["detail"]
    assert "allow_networks" not in refused.json["detail"] and "config" not in refused.json["detail"]
    # a name resolving there is refused as its address is
    by_name = api.post("/v1/endpoints", admin, {"name": "acme-local",
                                                "url": f"http://localhost:{receiver.port}/acme"})
    assert by_name.status == 422 and NOT_ALLOWED in by_name.json["detail"], by_name.body
    # a change of URL, by the endpoint's tenant
    public = add_endpoint(db, "https://hooks.example.test/acme", name="acme-public", tenant="acme")
    moved = api.request("PATCH", f"/v1/endpoints/{public}", admin, {"url": receiver.url("/acme")})
    assert moved.status == 422 and NOT_ALLOWED in moved.json["detail"], moved.body
    moved = api.request("PATCH", f"/v1/endpoints/{public}", operator, {"url": receiver.url("/acme")})
    assert moved.status == 422 and NOT_ALLOWED in moved.json["detail"], moved.body
    # the operator registering in acme is told how to let acme deliver there
    told = api.post("/v1/endpoints", operator, {**hook, "tenant": "acme"})
    assert told.status == 422, told.body
    assert "webhook-worker tenants update acme --allow-networks 127.0.0.1/32" in told.json["detail"]
    assert query(db, "SELECT count(*) FROM webhooks.endpoints") == [(1,)]
    # the operator's own endpoints (the default tenant's) reach its networks, as before
    assert api.post("/v1/endpoints", operator, {"name": "ours", "url": receiver.url("/ours")}).status == 201

    granted = cli("tenants", "update", "acme", "--allow-networks", "127.0.0.1", env={"DATABASE_URL": db})
    assert granted.returncode == 0, granted.stderr
    assert api.get("/v1/tenants/acme", operator).json["allow_networks"] == ["127.0.0.1/32"]
    created = api.post("/v1/endpoints", admin, hook)
    assert created.status == 201, created.body
    sent = api.post(f"/v1/endpoints/{created.json['id']}/test", admin)
    assert sent.status == 202, sent.body
    spawn(db)
    delivery = sent.json["delivery_id"]
    eventually(lambda: statuses(db, [delivery]) == {delivery: "delivered"},
               message="the test event delivered")
    assert [r.path for r in receiver.requests] == ["/acme"]


def test_an_admin_grants_a_tenant_networks_over_http(api, db, role_tokens):
    query(db, "SELECT webhooks.register_tenant('acme')")
    admin = role_tokens["admin"]
    assert api.get("/v1/tenants/acme", admin).json["allow_networks"] == []
    changed = api.request("PATCH", "/v1/tenants/acme", admin,
                          {"allow_networks": ["10.1.2.3/16", "fd00::1", "10.1.0.0/16"]})
    assert changed.status == 200, changed.body
    assert changed.json["allow_networks"] == ["10.1.0.0/16", "fd00::1/128"]
    assert [t["allow_networks"] for t in api.get("/v1/tenants", admin).json["items"]] == [
        [], ["10.1.0.0/16", "fd00::1/128"]]
    bad = api.request("PATCH", "/v1/tenants/acme", admin, {"allow_networks": ["10.1.0.0/16", "intranet"]})
    assert bad.status == 422 and bad.json["field"] == "allow_networks", bad.body
    assert "'intranet' is not an address or a CIDR" in bad.json["detail"]
    cleared = api.request("PATCH", "/v1/tenants/acme", admin, {"allow_networks": None})
    assert cleared.status == 200 and cleared.json["allow_networks"] == []
    # never a tenant's own administrator's to change
    own = make_token(db, "tenant_admin", name="acme-admin", tenant="acme")
    assert api.request("PATCH", "/v1/tenants/acme", own, {"allow_networks": ["10.0.0.0/8"]}).status == 403
