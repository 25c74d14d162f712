"""An endpoint's name never captures the id it spells: all digits always means an id, in SQL, the
migration, the API and the CLI alike."""

from __future__ import annotations

import psycopg
import pytest

from tests.acceptance.test_cli import cli
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
