"""GET /v1/triggers, kept to the caller's tenant, and a table trigger's backfill as an operation the
API's runner steps, follows and cancels."""

from __future__ import annotations

from tests.api.server import make_token
from tests.support import add_endpoint, eventually, query

ORDERS = "CREATE TABLE public.orders (id bigint PRIMARY KEY, tenant text, status text)"


def add_trigger(db: str, name: str, on: str, tenant: str | None = None) -> None:
    query(db, "SELECT webhooks.table_trigger_add(%s, 'public.orders', ARRAY[%s], 'order.changed',"
              " p_tenant => %s)", (name, on, tenant))


def test_admins_see_every_trigger_a_tenants_administrator_its_tenants_and_others_are_refused(api, role_tokens,
                                                                                             db):
    query(db, "SELECT webhooks.register_tenant('acme')")
    query(db, "SELECT webhooks.register_tenant('globex')")
    query(db, ORDERS)
    add_trigger(db, "orders", "insert")
    add_trigger(db, "acme-orders", "delete", tenant="acme")
    everything = api.get("/v1/triggers", role_tokens["admin"])
    assert everything.status == 200, everything.body
    assert [(t["name"], t["tenant"], t["ops"], t["state"]) for t in everything.json["items"]] == [
        ("acme-orders", "acme", ["delete"], "enabled"), ("orders", "default", ["insert"], "enabled")]
    acme = api.get("/v1/triggers", make_token(db, "tenant_admin", tenant="acme"))
    assert [t["name"] for t in acme.json["items"]] == ["acme-orders"]
    # another tenant's administrator sees nothing of it
    globex = api.get("/v1/triggers", make_token(db, "tenant_admin", tenant="globex"))
    assert globex.status == 200 and globex.json == {"items": []}
    default = api.get("/v1/triggers", role_tokens["tenant_admin"])
    assert [t["name"] for t in default.json["items"]] == ["orders"]
    for role in ("reader", "producer"):
        refused = api.get("/v1/triggers", role_tokens[role])
        assert refused.status == 403, (role, refused.body)
    assert api.get("/v1/triggers").status == 401


def test_a_backfill_is_stepped_by_the_runner_followed_and_cancelled_over_the_api(api, role_tokens, db):
    add_endpoint(db, "http://127.0.0.1:9/o", event_types=("order.*",))
    query(db, ORDERS)
    query(db, "INSERT INTO public.orders (id, status) SELECT n, 'new' FROM generate_series(1, 30) n")
    add_trigger(db, "orders", "insert")
    [(quick,)] = query(db, "SELECT webhooks.table_trigger_backfill('orders')")
    done = eventually(lambda: (a := api.get(f"/v1/operations/{quick}", role_tokens["admin"])).json["status"]
                      == "done" and a, message="the runner steps the backfill to its end")
    assert (done.json["kind"], done.json["processed"]) == ("trigger_backfill", 30)
    [listed] = api.get("/v1/triggers", role_tokens["admin"]).json["items"]
    assert [listed[k] for k in ("backfill_id", "backfill_status", "backfill_processed")] == [
        quick, "done", 30]
    [(slow,)] = query(db, "SELECT webhooks.table_trigger_backfill('orders', p_rate => 0.5)")
    eventually(lambda: query(db, "SELECT processed FROM webhooks.api_operations WHERE id = %s",
                             (slow,))[0][0], message="a first step of the slow backfill")
    cancelled = api.post(f"/v1/operations/{slow}/cancel", role_tokens["admin"])
    assert cancelled.status == 200, cancelled.body
    assert (cancelled.json["kind"], cancelled.json["status"]) == ("trigger_backfill", "cancelled")
    assert query(db, "SELECT count(*) FROM webhooks.alert_delivery_queue") == [(31,)]
