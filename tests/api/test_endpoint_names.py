"""An endpoint's name never captures the id it spells: all digits always means an id, in SQL, the
migration, the API and the CLI alike."""

from __future__ import annotations

import json

import psycopg
import pytest

from tests.acceptance.test_cli import cli
from tests.api.server import make_token
from tests.support import add_endpoint, query
from worker import schema

URL = "https://hooks.example.test/"


def endpoints_up_to(dsn: str, count: int) -> list[int]:
    return [add_endpoint(dsn, f"{URL}{n}", name=f"ep-{n}") for n in range(count)]


def test_sql_refuses_an_all_digit_name_however_the_row_is_written(db):
    [first] = endpoints_up_to(db, 1)
    with pytest.raises(psycopg.errors.CheckViolation, match="endpoints_name_not_numeric"):
        query(db, "UPDATE webhooks.endpoints SET name = '2' WHERE id = %s", (first,))
    # a name with a digit in it is a name
    query(db, "UPDATE webhooks.endpoints SET name = '2b' WHERE id = %s", (first,))


def test_endpoint_ref_reads_digits_as_an_id_and_anything_else_as_a_name(db):
    ids = endpoints_up_to(db, 3)
    ref = "SELECT webhooks.endpoint_ref(%s)"
    assert query(db, ref, (str(ids[1]),)) == [(ids[1],)]
    assert query(db, ref, (f"00{ids[1]}",)) == [(ids[1],)]
    assert query(db, ref, ("ep-2",)) == [(ids[2],)]
    assert query(db, ref, ("ep-9",)) == [(None,)]
    assert query(db, ref, ("9" * 30,)) == [(None,)]  # beyond bigint: no such id, not an error
    assert query(db, ref, (str(max(ids) + 100),)) == [(None,)]


def test_migrating_renames_an_all_digit_name_and_says_so(db):
    ids = endpoints_up_to(db, 5)
    with psycopg.connect(db, autocommit=True) as conn:
        # as a database before 008 could hold them: '3' names endpoint ids[4], and the first
        # choice of new name is taken
        conn.execute("ALTER TABLE webhooks.endpoints DROP CONSTRAINT endpoints_name_not_numeric")
        conn.execute("UPDATE webhooks.endpoints SET name = '3' WHERE id = %s", (ids[4],))
        conn.execute("UPDATE webhooks.endpoints SET name = 'endpoint-3' WHERE id = %s", (ids[0],))
        conn.execute("DROP TABLE webhooks.endpoint_renamed_names")
        conn.execute("DELETE FROM webhooks.schema_migrations WHERE version = 8")
    notes: list[str] = []
    assert schema.migrate(db, on_notice=notes.append) == ["migrations/008_endpoint_names.sql"]
    assert query(db, "SELECT name FROM webhooks.endpoints WHERE id = %s", (ids[4],)) == [("endpoint-3-2",)]
    assert notes == [f"endpoint {ids[4]} was named '3', which reads as an id: renamed 'endpoint-3-2';"
                     " until its row in webhooks.endpoint_renamed_names is deleted, '3' names no endpoint"
                     " (not id 3)"]
    with pytest.raises(psycopg.errors.CheckViolation):
        query(db, "UPDATE webhooks.endpoints SET name = '3' WHERE id = %s", (ids[4],))
    # a caller still using the old name is refused, not sent to the endpoint whose id it spells
    assert 3 in ids and query(db, "SELECT webhooks.endpoint_ref('3')") == [(None,)]
    query(db, "DELETE FROM webhooks.endpoint_renamed_names WHERE name = '3'")
    assert query(db, "SELECT webhooks.endpoint_ref('3')") == [(3,)]


def test_the_api_refuses_an_all_digit_name_and_an_integer_always_addresses_the_id(api, role_tokens, db):
    admin, producer = role_tokens["admin"], role_tokens["producer"]
    ids = endpoints_up_to(db, 3)
    refused = api.post("/v1/endpoints", admin, {"name": str(ids[1]), "url": URL})
    assert refused.status == 422, refused.body
    assert refused.json["field"] == "name" and "all digits" in refused.json["detail"], refused.json
    assert query(db, "SELECT count(*) FROM webhooks.endpoints") == [(3,)]
    # even a name that spells another endpoint's id (as SQL written before the constraint could
    # leave one) does not capture it
    query(db, "ALTER TABLE webhooks.endpoints DROP CONSTRAINT endpoints_name_not_numeric")
    query(db, "UPDATE webhooks.endpoints SET name = %s WHERE id = %s", (str(ids[2]), ids[0]))
    shown = api.get(f"/v1/endpoints/{ids[2]}", admin)
    assert shown.status == 200 and shown.json["name"] == "ep-2", shown.json
    for endpoint in (ids[2], str(ids[2])):  # a JSON integer and a string of digits alike
        message = {"event_type": "order.paid", "payload": {}, "endpoint": endpoint,
                   "idempotency_key": repr(endpoint)}
        published = api.post("/v1/messages", producer, message)
        assert published.status == 202, published.body
        assert [d["endpoint_id"] for d in published.json["deliveries"]] == [ids[2]]


def test_the_cli_refuses_an_all_digit_name_and_reads_digits_as_an_id(db):
    ids = endpoints_up_to(db, 3)
    refused = cli("endpoints", "add", "--name", "2", "--url", URL, env={"DATABASE_URL": db})
    assert refused.returncode == 2, refused.stderr
    assert "--name: must not be all digits" in refused.stderr
    shown = cli("endpoints", "show", str(ids[1]), "--json", env={"DATABASE_URL": db})
    assert shown.returncode == 0, shown.stderr
    assert '"name": "ep-1"' in shown.stdout


def test_a_tenant_named_with_digits_is_refused_and_migrated_and_digits_address_the_id(api, role_tokens, db):
    admin = role_tokens["admin"]
    refused = api.post("/v1/tenants", admin, {"name": "2"})
    assert refused.status == 422 and refused.json["field"] == "name"
    assert "all digits" in refused.json["detail"]
    cli_refused = cli("tenants", "add", "2", env={"DATABASE_URL": db})
    assert cli_refused.returncode == 2 and "all digits" in cli_refused.stderr
    [(acme,)] = query(db, "SELECT webhooks.register_tenant('acme')")
    [(globex,)] = query(db, "SELECT webhooks.register_tenant('globex')")
    # as a database before 011 could hold it: globex named with acme's id
    query(db, "ALTER TABLE webhooks.tenants DROP CONSTRAINT tenants_name_not_numeric")
    query(db, "UPDATE webhooks.tenants SET name = %s WHERE id = %s", (str(acme), globex))
    assert api.get(f"/v1/tenants/{acme}", admin).json["name"] == "acme"  # the id, not the name
    query(db, "DELETE FROM webhooks.schema_migrations WHERE version = 11")
    notes: list[str] = []
    assert schema.migrate(db, on_notice=notes.append) == ["migrations/011_tenant_names.sql"]
    assert notes == [f"tenant {globex} was named '{acme}', which reads as an id: renamed 'tenant-{acme}'"]
    assert query(db, "SELECT name FROM webhooks.tenants WHERE id = %s", (globex,)) == [(f"tenant-{acme}",)]
    with pytest.raises(psycopg.errors.CheckViolation):
        query(db, "UPDATE webhooks.tenants SET name = '7' WHERE id = %s", (globex,))


def test_names_are_unique_within_a_tenant_and_a_name_two_tenants_hold_asks_for_its_tenant(
        api, db, role_tokens):
    """acme's administrator takes a name globex holds without learning that globex holds it; a caller
    that is no tenant's, naming it, is asked for the id or tenant/name, wherever a name is taken."""
    for name in ("acme", "globex"):
        query(db, "SELECT webhooks.register_tenant(%s)", (name,))
    theirs = add_endpoint(db, f"{URL}globex", name="hook", tenant="globex")
    acme_admin = make_token(db, "tenant_admin", name="acme-admin", tenant="acme")
    created = api.post("/v1/endpoints", acme_admin, {"name": "hook", "url": f"{URL}acme"})
    assert created.status == 201, created.body
    ours = created.json["id"]
    again = api.post("/v1/endpoints", acme_admin, {"name": "hook", "url": f"{URL}acme2"})
    assert again.status == 409, again.body
    assert again.json["detail"] == "name: an endpoint named 'hook' exists in this tenant"
    with pytest.raises(psycopg.errors.UniqueViolation):
        add_endpoint(db, f"{URL}globex2", name="hook", tenant="globex")
    # each tenant's own caller finds its own
    assert api.get("/v1/endpoints/hook", acme_admin).json["id"] == ours
    globex_reader = make_token(db, "reader", tenant="globex")
    assert api.get("/v1/endpoints/hook", globex_reader).json["id"] == theirs

    admin, producer = role_tokens["admin"], role_tokens["producer"]
    said = "'hook' names an endpoint in more than one tenant (acme, globex): give its id or tenant/name"
    for method, path, body, field in (
            ("GET", "/v1/endpoints/hook", None, None),
            ("POST", "/v1/endpoints/hook/disable", {}, None),
            ("GET", "/v1/endpoints/hook/secret", None, None),
            ("GET", "/v1/deliveries?endpoint=hook", None, "endpoint"),
            ("GET", "/v1/dead-letters?endpoint=hook", None, "endpoint"),
            ("POST", "/v1/dead-letters/replay", {"filter": {"endpoint": "hook"}}, "filter.endpoint")):
        answer = api.request(method, path, admin, body)
        assert answer.status == 409 and answer.json["detail"] == said, (method, path, answer.body)
        assert answer.json.get("field") == field
    published = api.post("/v1/messages", producer, {"event_type": "order.paid", "payload": {},
                                                    "endpoint": "hook"})
    assert published.status == 409 and published.json["field"] == "endpoint", published.body
    batch = api.post("/v1/messages/batch", producer, {"messages": [
        {"event_type": "order.paid", "payload": {}, "endpoint": "hook"},
        {"event_type": "order.paid", "payload": {}, "endpoint": "globex/hook"}]})
    assert batch.status == 202, batch.body
    first, second = batch.json["results"]
    assert first["status"] == 409 and first["detail"] == said, first
    assert [d["endpoint_id"] for d in second["deliveries"]] == [theirs]
    assert query(db, "SELECT active FROM webhooks.endpoints ORDER BY id") == [(True,), (True,)]
    # tenant/name, wherever a name is taken
    assert api.get("/v1/endpoints/acme%2Fhook", admin).json["id"] == ours
    assert api.get("/v1/deliveries?endpoint=globex/hook", admin).status == 200
    assert api.post("/v1/messages", producer, {"event_type": "order.paid", "payload": {},
                                               "endpoint": "acme/hook"}).status == 202
    env = {"DATABASE_URL": db}
    shown = cli("endpoints", "show", "hook", "--json", env=env)
    assert shown.returncode == 1 and f"ENDPOINT {said}" in shown.stderr, shown.stderr
    shown = cli("endpoints", "show", "globex/hook", "--json", env=env)
    assert shown.returncode == 0 and json.loads(shown.stdout)["id"] == theirs, shown.stderr
    listed = cli("dlq", "list", "--endpoint", "hook", env=env)
    assert listed.returncode == 1 and said in listed.stderr, listed.stderr


def test_endpoint_ref_reads_tenant_slash_name_and_keeps_a_scoped_session_to_its_tenant(db):
    for name in ("acme", "a/b"):
        query(db, "SELECT webhooks.register_tenant(%s)", (name,))
    ours = add_endpoint(db, f"{URL}1", name="hook", tenant="acme")
    slashed = add_endpoint(db, f"{URL}2", name="c", tenant="a/b")  # a tenant's name may hold a slash
    plain = add_endpoint(db, f"{URL}3", name="acme/hook")  # and an endpoint's
    ref = "SELECT webhooks.endpoint_ref(%s)"
    assert query(db, ref, ("a/b/c",)) == [(slashed,)]
    assert query(db, ref, ("hook",)) == [(ours,)]
    assert query(db, ref, ("nobody/hook",)) == [(None,)]
    with pytest.raises(psycopg.errors.TooManyRows, match="'acme/hook' names an endpoint in more than one"):
        query(db, ref, ("acme/hook",))  # the default tenant's name, and acme's hook
    assert query(db, ref, (str(plain),)) == [(plain,)]
    with psycopg.connect(db, autocommit=True) as conn:
        acme = conn.execute("SELECT webhooks.tenant_id('acme')").fetchone()
        conn.execute("SELECT set_config('webhooks.tenant', %s, false)", (str(acme[0]),))
        assert conn.execute(ref, ("acme/hook",)).fetchone() == (ours,)  # its own only
        assert conn.execute(ref, (str(plain),)).fetchone() == (None,)
