"""Tenant administrators in SQL: connected as the API's login, under webhooks_tenant_admin with
webhooks.tenant set, everything an admin does to endpoints, deliveries, dead letters and bulk
replays holds for the tenant's rows and for nothing of another tenant's; never the settings,
tenants, tokens or catalogue; and nothing at all without the tenant set."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest

from tests.support import TEST_KEYRING, BlockingConnection, add_endpoint, api_dsn, enqueue, query, stored
from worker.rules import signing, tokens
from worker.rules.redaction import display_url
from worker.store import tokens as token_store
from worker.store.endpoints import EndpointSpec, register_endpoint, signing_secrets

TENANT_ADMIN = "webhooks_tenant_admin"


def dead_letter(db: str, webhook_id: int) -> int:
    [delivery] = enqueue(db, webhook_id)
    query(db, "UPDATE webhooks.alert_delivery_queue SET status = 'dead_letter',"
              " dead_letter_reason = 'http 400', failure_category = 'http_4xx', dead_lettered_at = now()"
              " WHERE delivery_id = %s", (delivery,))
    return delivery


@pytest.fixture
def tenants(db: str) -> dict[str, Any]:
    acme = query(db, "SELECT webhooks.register_tenant('acme')")[0][0]
    globex = query(db, "SELECT webhooks.register_tenant('globex')")[0][0]
    ours = add_endpoint(db, "http://127.0.0.1:9/ours", name="ours", tenant="acme")
    theirs = add_endpoint(db, "http://127.0.0.1:9/theirs", name="theirs", tenant="globex")
    return {"acme": acme, "globex": globex, "ours": ours, "theirs": theirs,
            "our_dead": dead_letter(db, ours), "their_dead": dead_letter(db, theirs)}


@contextmanager
def tenant_admin(db: str, tenant_id: int | None) -> Iterator[psycopg.Connection]:
    """One transaction of the API's login as a tenant administrator, as the API runs one; committed
    when the block ends without an error."""
    with psycopg.connect(api_dsn(db)) as conn:
        conn.execute(f"SET LOCAL ROLE {TENANT_ADMIN}")
        if tenant_id is not None:
            conn.execute("SELECT set_config('webhooks.tenant', %s, true)", (str(tenant_id),))
        yield conn
        conn.commit()


def one(db: str, tenant_id: int | None, sql: str, params: Any = None) -> Any:
    """The first column of the first row of one statement run as a tenant administrator."""
    with tenant_admin(db, tenant_id) as conn:
        row = conn.execute(sql, params).fetchone()
    return None if row is None else row[0]


def refused(db: str, tenant_id: int | None, sql: str, params: Any = None) -> str | None:
    """The SQLSTATE a statement run as a tenant administrator fails with; None if it succeeds."""
    try:
        one(db, tenant_id, sql, params)
    except psycopg.Error as error:
        return error.sqlstate
    return None


def snapshot(db: str, endpoint: int) -> list[Any]:
    """Everything of an endpoint another tenant's administrator might change."""
    return [query(db, f"SELECT to_jsonb(x) FROM webhooks.{table} x WHERE x.{column} = %s ORDER BY 1::text",
                  (endpoint,))
            for table, column in (("endpoints", "id"), ("webhook_health_metrics", "webhook_id"),
                                  ("alert_delivery_queue", "webhook_id"), ("endpoint_events", "webhook_id"),
                                  ("alert_delivery_log", "webhook_id"))]


def tenant_admin_store(db: str, tenant_id: int) -> BlockingConnection:
    """tenant_admin()'s transaction on a connection of the store (worker.store's calls are async)."""
    conn = BlockingConnection(api_dsn(db), autocommit=False)
    conn.execute(f"SET LOCAL ROLE {TENANT_ADMIN}")
    conn.execute("SELECT set_config('webhooks.tenant', %s, true)", (str(tenant_id),))
    return conn


def test_a_tenant_admin_does_what_an_admin_does_to_its_own_tenants_rows(db, tenants):
    acme, ours = tenants["acme"], tenants["ours"]
    # registration, credentials sealed in the same transaction, as the API and the CLI register
    with tenant_admin_store(db, acme) as conn:
        added = conn.run(register_endpoint, EndpointSpec(
            name="added", url="http://127.0.0.1:9/added", url_display=display_url("http://127.0.0.1:9/added"),
            signing_secrets=(signing.generate_secret(),)), TEST_KEYRING)
    assert query(db, "SELECT tenant_id, url LIKE 'enc:v1:%%' FROM webhooks.endpoints WHERE id = %s",
                 (added,)) == [(acme, True)]
    assert one(db, acme, "SELECT webhooks.update_endpoint(%s, '{\"timeout_ms\": 4000}')", (ours,)) is True
    assert one(db, acme, "SELECT webhooks.disable_endpoint(%s, 'maintenance', 'tenant admin')", (ours,)) \
        == "disabled: maintenance"
    assert one(db, acme, "SELECT webhooks.enable_endpoint(%s, 'tenant admin')", (ours,)) == "enabled"
    assert one(db, acme, "SELECT webhooks.set_circuit(%s, 'open')", (ours,)) == "circuit_forced_open"
    assert one(db, acme, "SELECT webhooks.set_circuit(%s, 'reset')", (ours,)) == "circuit_reset"
    new_secret = signing.generate_secret()
    assert one(db, acme, "SELECT webhooks.rotate_secret(%s, %s, now() + interval '1 hour')",
               (ours, TEST_KEYRING.seal(new_secret, "signing_secret", ours))) == 2
    # reading the secret: what its receiver verifies with, newest first
    with tenant_admin_store(db, acme) as conn:
        secrets = conn.run(signing_secrets, TEST_KEYRING, ours)
    assert secrets is not None and [s.secret for s in secrets][:1] == [new_secret] and len(secrets) == 2
    assert query(db, "SELECT timeout_ms, active FROM webhooks.endpoints WHERE id = %s",
                 (ours,)) == [(4000, True)]
    assert query(db, "SELECT circuit_state FROM webhooks.webhook_health_metrics WHERE webhook_id = %s",
                 (ours,)) == [("closed",)]
    assert one(db, acme, "SELECT webhooks.replay(%s)", (tenants["our_dead"],)) is True
    assert query(db, "SELECT status FROM webhooks.alert_delivery_queue WHERE delivery_id = %s",
                 (tenants["our_dead"],)) == [("pending",)]
    assert one(db, acme, "SELECT webhooks.api_delete_endpoint(%s)", (added,)) == 0  # none dropped
    # reads: its own rows, through the tables and the views
    with tenant_admin(db, acme) as conn:
        assert conn.execute("SELECT array_agg(id) FROM webhooks.endpoints").fetchone()[0] == [ours]
        assert conn.execute("SELECT array_agg(name) FROM webhooks.endpoint_summary").fetchone()[0] == ["ours"]
        assert conn.execute("SELECT array_agg(name) FROM webhooks.tenant_summary").fetchone()[0] == ["acme"]
        assert conn.execute("SELECT sum(deliveries) FROM webhooks.queue_statistics").fetchone()[0] == 1
        assert conn.execute("SELECT count(*) FROM webhooks.delivery(%s)",
                            (tenants["our_dead"],)).fetchone()[0] == 1
        assert conn.execute("SELECT count(*) FROM webhooks.delivery_history(%s)",
                            (tenants["our_dead"],)).fetchone()[0] == 1  # the replay
    # publishing to every subscriber reaches its own tenant's only
    with tenant_admin(db, acme) as conn:
        rows = conn.execute("SELECT webhook_id FROM webhooks.api_publish('order.created', '{}')").fetchall()
    assert rows == [(ours,)]


def test_a_tenant_admin_finds_nothing_of_another_tenant_and_changes_nothing(db, tenants):
    acme, theirs = tenants["acme"], tenants["theirs"]
    before = snapshot(db, theirs)
    sealed = TEST_KEYRING.seal(signing.generate_secret(), "signing_secret", theirs)
    # the functions answer another tenant's endpoint as a missing one, or refuse
    assert one(db, acme, "SELECT webhooks.update_endpoint(%s, '{\"timeout_ms\": 4000}')", (theirs,)) is False
    assert one(db, acme, "SELECT webhooks.disable_endpoint(%s, 'x')", (theirs,)) is None
    query(db, "SELECT webhooks.disable_endpoint(%s, 'by the operator')", (theirs,))
    before = snapshot(db, theirs)
    assert one(db, acme, "SELECT webhooks.enable_endpoint(%s)", (theirs,)) is None
    assert refused(db, acme, "SELECT webhooks.set_circuit(%s, 'open')", (theirs,)) == "P0002"
    assert one(db, acme, "SELECT webhooks.rotate_secret(%s, %s)", (theirs, sealed)) is None
    assert one(db, acme, "SELECT count(*) FROM webhooks.endpoint_credentials(%s, 10)", (theirs - 1,)) == 0
    one(db, acme, "SELECT webhooks.store_endpoint_credentials(%s, 'http://evil', '[]', '{}', '{}')",
        (theirs,))
    assert one(db, acme, "SELECT webhooks.api_delete_endpoint(%s, true)", (theirs,)) is None
    assert one(db, acme, "SELECT webhooks.replay(%s)", (tenants["their_dead"],)) is False
    assert refused(db, acme, "SELECT webhooks.send_test_event(%s)", ("theirs",)) == "P0002"
    assert refused(db, acme, "SELECT webhooks.send_test_event(%s)", (str(theirs),)) == "P0002"
    assert refused(db, acme, "SELECT webhooks.api_publish('order.created', '{}', 'theirs')") == "P0002"
    # registering into another tenant is refused without saying whether it exists
    assert refused(db, acme, "SELECT webhooks.register_endpoint('x', 'u', 'd', '[]', p_tenant => 'globex')") \
        == "42501"
    # reads: not a row of theirs, by the tables or the views
    with tenant_admin(db, acme) as conn:
        for table, column in (("endpoints", "id"), ("webhook_health_metrics", "webhook_id"),
                              ("alert_delivery_queue", "webhook_id"), ("alert_delivery_log", "webhook_id"),
                              ("endpoint_events", "webhook_id"), ("endpoint_summary", "id"),
                              ("delivery_overview", "webhook_id"), ("held_back", "webhook_id"),
                              ("message_deliveries", "endpoint_id")):
            found = conn.execute(f"SELECT count(*) FROM webhooks.{table} WHERE {column} = %s", (theirs,))
            assert found.fetchone()[0] == 0, table
        assert conn.execute("SELECT count(*) FROM webhooks.tenants WHERE name = 'globex'").fetchone()[0] == 0
        assert conn.execute("SELECT count(*) FROM webhooks.delivery(%s)",
                            (tenants["their_dead"],)).fetchone()[0] == 0
        assert conn.execute("SELECT webhooks.endpoint_ref('theirs')").fetchone()[0] is None
    assert snapshot(db, theirs) == before


def test_a_tenant_admin_cannot_touch_settings_tenants_tokens_or_the_catalogue(db, tenants):
    acme = tenants["acme"]
    for statement in (
        "UPDATE webhooks.delivery_config SET max_attempts = 3",
        "SELECT webhooks.register_tenant('mine')",
        "SELECT webhooks.update_tenant('acme', '{\"max_endpoints\": 1000}')",
        "SELECT webhooks.api_create_token('t', 'admin', sha256('t'))",
        "SELECT * FROM webhooks.api_token_list()",
        "SELECT webhooks.api_revoke_token('t')",
        "SELECT token_hash FROM webhooks.api_tokens",
        "SELECT webhooks.upsert_event_type('order.created')",
        "SELECT webhooks.deprecate_event_type('order.created')",
        "UPDATE webhooks.endpoints SET active = false",
        "SELECT url, signing_secrets FROM webhooks.endpoints",
        "UPDATE webhooks.alert_delivery_queue SET attempts = 0",
        "SELECT * FROM webhooks.worker_liveness",
        "SELECT * FROM webhooks.api_running_operations()",
        "SELECT webhooks.replay_dead_letters()",
        "SELECT webhooks.purge_dead_letters(interval '1 day', NULL)",
        "INSERT INTO webhooks.alert_delivery_queue (webhook_id, event_type, payload) VALUES (1, 'a', '{}')",
    ):
        assert refused(db, acme, statement) == "42501", statement
    # and marking an endpoint for every tenant's operational events stays the operator's
    assert refused(db, acme, "SELECT webhooks.update_endpoint(%s, '{\"operational_all_tenants\": true}')",
                   (tenants["ours"],)) == "42501"


def test_a_tenant_admin_without_its_tenant_set_sees_nothing_and_changes_nothing(db, tenants):
    ours = tenants["ours"]
    before = snapshot(db, ours)
    with tenant_admin(db, None) as conn:
        for table in ("endpoints", "alert_delivery_queue", "alert_delivery_log", "tenants",
                      "webhook_health_metrics", "endpoint_events", "api_operations"):
            assert conn.execute(f"SELECT count(*) FROM webhooks.{table}").fetchone()[0] == 0, table
    for statement in (
        f"SELECT webhooks.disable_endpoint({ours}, 'x')",
        f"SELECT webhooks.update_endpoint({ours}, '{{}}')",
        f"SELECT webhooks.replay({tenants['our_dead']})",
        "SELECT webhooks.send_test_event('ours')",
        "SELECT webhooks.api_publish('order.created', '{}')",
        "SELECT webhooks.api_start_replay('{}', NULL, NULL, 'me')",
        "SELECT count(*) FROM webhooks.endpoint_summary",
        "SELECT count(*) FROM webhooks.delivery_overview",
        "SELECT count(*) FROM webhooks.message_overview",
        "SELECT count(*) FROM webhooks.message_deliveries",
    ):
        assert refused(db, None, statement) == "42501", statement
    assert snapshot(db, ours) == before


def test_a_tenant_admin_reads_its_own_tenants_renamed_names_only(db, tenants):
    """endpoint_renamed_names (the all-digit names migration 008 renamed) is under row-level
    security: a tenant's administrator reads its own tenant's old names, never another's, and none
    without its tenant set; messages carries the restrictive policy the other tenant tables carry."""
    query(db, "INSERT INTO webhooks.endpoint_renamed_names (name, webhook_id, new_name)"
              " VALUES ('7', %s, 'ours'), ('8', %s, 'theirs')", (tenants["ours"], tenants["theirs"]))
    with tenant_admin(db, tenants["acme"]) as conn:
        assert conn.execute("SELECT name, new_name FROM webhooks.endpoint_renamed_names").fetchall() == [
            ("7", "ours")]
        assert conn.execute("SELECT webhooks.endpoint_ref('7')").fetchone() == (None,)  # still refused
    with tenant_admin(db, None) as conn:
        assert conn.execute("SELECT count(*) FROM webhooks.endpoint_renamed_names").fetchone() == (0,)
    assert query(db, "SELECT tablename, permissive, roles::text[] FROM pg_policies"
                     " WHERE schemaname = 'webhooks' AND policyname = 'tenant_admin_needs_tenant'"
                     " AND tablename IN ('messages', 'endpoint_renamed_names') ORDER BY 1") == [
        ("endpoint_renamed_names", "RESTRICTIVE", ["webhooks_tenant_admin"]),
        ("messages", "RESTRICTIVE", ["webhooks_tenant_admin"])]


def test_a_tenant_admins_bulk_replay_replays_its_tenants_dead_letters_only(db, tenants):
    acme = tenants["acme"]
    operation = one(db, acme, "SELECT webhooks.api_start_replay('{}', NULL, NULL, 'acme-admin')")
    assert query(db, "SELECT tenant_id FROM webhooks.api_operations WHERE id = %s", (operation,)) == [(acme,)]
    # the API's runner steps every operation unscoped, as webhooks_admin
    with psycopg.connect(api_dsn(db)) as conn:
        conn.execute("SET LOCAL ROLE webhooks_admin")
        assert conn.execute("SELECT status, processed FROM webhooks.api_replay_step(%s, 100)",
                            (operation,)).fetchone() == ("done", 1)
        conn.commit()
    assert dict(query(db, "SELECT delivery_id, status FROM webhooks.alert_delivery_queue")) == {
        tenants["our_dead"]: "pending", tenants["their_dead"]: "dead_letter"}
    # it sees and cancels its own operations, not another's
    theirs = query(db, "SELECT webhooks.api_start_replay('{}', NULL, NULL, 'operator')")[0][0]
    mine = one(db, acme, "SELECT webhooks.api_start_replay('{}', NULL, NULL, 'acme-admin')")
    with tenant_admin(db, acme) as conn:
        seen = conn.execute("SELECT array_agg(id ORDER BY id) FROM webhooks.api_operations").fetchone()[0]
    assert seen == [operation, mine]
    assert one(db, acme, "SELECT webhooks.api_cancel_operation(%s, 'acme-admin')", (theirs,)) is None
    assert one(db, acme, "SELECT webhooks.api_cancel_operation(%s, 'acme-admin')", (mine,)) == "cancelled"
    assert query(db, "SELECT status FROM webhooks.api_operations WHERE id = %s", (theirs,)) == [("running",)]


def test_a_tenant_admin_token_has_a_tenant_and_is_checked_as_its_role(db, tenants):
    digest = tokens.token_hash("whk_" + "a" * 43)
    with pytest.raises(psycopg.errors.CheckViolation):
        query(db, "SELECT webhooks.api_create_token('unscoped', 'tenant_admin', %s)", (digest,))
    with pytest.raises(psycopg.errors.CheckViolation):
        query(db, "SELECT webhooks.api_create_token('scoped-admin', 'admin', %s, NULL, 'acme')", (digest,))
    with pytest.raises(ValueError, match=r"^tenant: a tenant_admin token administers one tenant"):
        stored(db, token_store.create, "unscoped", "tenant_admin", None)
    token = stored(db, token_store.create, "acme-admin", "tenant_admin", None, "acme")
    assert query(db, "SELECT name, role, tenant_id FROM webhooks.api_token_role(%s)",
                 (tokens.token_hash(token),)) == [("acme-admin", "tenant_admin", tenants["acme"])]
    assert query(db, "SELECT role, tenant FROM webhooks.api_token_list()") == [("tenant_admin", "acme")]


def test_the_tenant_admin_role_holds_what_it_needs_and_nothing_of_the_fleet(db):
    functions = {name for (name,) in query(
        db, "SELECT p.oid::regprocedure::text FROM pg_proc p"
            " WHERE p.pronamespace = 'webhooks'::regnamespace"
            "   AND has_function_privilege('webhooks_tenant_admin', p.oid, 'EXECUTE')")}
    assert functions == {f"webhooks.{f}" for f in (
        "caller_tenant()", "endpoint_ref(text)",
        "register_endpoint(text,text,text,jsonb,text[],jsonb,integer,integer,jsonb,numeric,integer,integer,"
        "jsonb,text,jsonb,boolean,text,boolean)",
        "store_endpoint_credentials(bigint,text,jsonb,jsonb,jsonb)", "endpoint_credentials(bigint,integer)",
        "update_endpoint(bigint,jsonb)", "disable_endpoint(bigint,text,text,bigint,integer)",
        "enable_endpoint(bigint,text,text)", "set_circuit(bigint,text,timestamp with time zone,text,text)",
        "rotate_secret(bigint,text,timestamp with time zone,text)",
        "api_delete_endpoint(bigint,boolean,text)", "tenant_destinations(text,bigint)",
        "replay(bigint)", "replay_refusal(bigint)", "api_start_replay(jsonb,double precision,integer,text)",
        "api_cancel_operation(bigint,text)",
        "api_publish(text,jsonb,text,text,text,integer,timestamp with time zone,text)",
        "api_publish_batch(jsonb,text)",
        "delivery(bigint)", "delivery_by_key(text,bigint)", "delivery_history(bigint)",
        "send_test_event(text)", "event_type_list(boolean)", "event_type(text)",
        "unmatched_subscriptions()", "event_type_subscriptions(text)",
        # the table triggers whose fixed tenant is its own (table_trigger_summary keeps to it)
        "table_trigger_list()", "table_trigger_show(text)")}
    # each function that changes something runs as the owner with a fixed search_path, and keeps to
    # the caller's tenant itself (row-level security does not bind the owner)
    for name, source in query(db, "SELECT p.oid::regprocedure::text, p.prosrc FROM pg_proc p"
                                  " WHERE p.oid::regprocedure::text = ANY(%s) AND p.prosecdef",
                              (sorted(functions),)):
        if name.split("(")[0] in ("webhooks.event_type_list", "webhooks.event_type"):
            continue  # the catalogue is one for every tenant
        # (the gate, queue_deliveries(), keeps to it for what it queues)
        assert "caller_tenant()" in source or "caller_sees_endpoint(" in source \
            or "registration_tenant(" in source or "queue_deliveries(" in source, name


@pytest.mark.parametrize("name", ["", "a*", "bad\tname", "x" * 257])
def test_sql_refuses_the_catalogue_names_the_python_rule_refuses(db, name):
    from worker.rules.event_types import name_problem

    assert name_problem(name) is not None
    with pytest.raises(psycopg.errors.CheckViolation):
        query(db, "INSERT INTO webhooks.event_types (name) VALUES (%s)", (name,))
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        query(db, "SELECT webhooks.upsert_event_type('webhook.mine')")
