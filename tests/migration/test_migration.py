"""Migrating a database of the old layout gives exactly the schema a fresh build gives, rows intact.

The template for every future migration: keep a dump of the schema before the change (with rows in
every state) in fixtures/, migrate it, and compare its catalogs with a fresh build's.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest

from tests.migration.catalog import differences, partitions_missing_triggers, snapshot
from tests.migration.make_fixture import FIXTURE_KEYS
from tests.support import drain_progress, eventually, query, statuses
from worker import encryption, schema
from worker.encryption import KEYS_ENV, Keyring
from worker.localpg import _find_binary

FIXTURES = Path(__file__).resolve().parent / "fixtures"
OLD_LAYOUT = FIXTURES / "schema_v35.sql"
# Every table of the fixture whose rows must come through unchanged.
TABLES = ("alert_delivery_queue", "alert_delivery_log", "webhook_health_metrics", "endpoint_events",
          "endpoints", "delivery_config", "stats_sample", "worker_liveness")


def restore(dsn: str, dump: Path) -> None:
    subprocess.run([_find_binary("psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", dsn, "-f", str(dump)],
                   check=True, capture_output=True)


def contents(dsn: str, columns: dict[str, list[str]] | None = None) -> dict[str, tuple[int, str]]:
    """Each table's row count and a digest of its rows, over the given columns (default: all of
    them), so that columns later migrations add do not hide whether the old ones kept their values.
    The queue's rows are read through webhooks.deliveries once it exists: their payloads live in
    their messages since 014."""
    found = {}
    for table in TABLES:
        names = (columns or table_columns(dsn))[table]
        row = "(" + ", ".join(f"t.{name}" for name in names) + ")::text"
        source = (f"webhooks.{table}" if table != "alert_delivery_queue"
                  or query(dsn, "SELECT to_regclass('webhooks.deliveries')") == [(None,)]
                  else "webhooks.deliveries")
        [(count, digest)] = query(
            dsn, f"SELECT count(*), md5(coalesce(string_agg({row}, E'\\n' ORDER BY {row}), ''))"
                 f" FROM {source} t")
        found[table] = (count, digest)
    return found


def table_columns(dsn: str) -> dict[str, list[str]]:
    return {table: [name for (name,) in query(
        dsn, "SELECT quote_ident(attname) FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0"
             " AND NOT attisdropped ORDER BY attnum", (f"webhooks.{table}",))] for table in TABLES}


@pytest.fixture
def old_db(template_db: str, fresh_db: Callable[[bool], str]) -> str:
    """An empty database restored from the old layout's dump (the group roles exist: the template's
    migration made them)."""
    dsn = fresh_db(False)
    restore(dsn, OLD_LAYOUT)
    return dsn


def test_the_old_layout_migrated_has_the_catalogs_of_a_fresh_build(db, old_db):
    schema.migrate(old_db)
    assert differences(snapshot(db), snapshot(old_db)) == []
    # the partitions the old layout made (of its own day) carry the triggers a fresh build's carry
    assert query(old_db, "SELECT count(*) FROM pg_inherits"
                         " WHERE inhparent = 'webhooks.alert_delivery_log'::regclass") != [(0,)]
    assert partitions_missing_triggers(old_db) == []
    assert partitions_missing_triggers(db) == []
    # adopted as the baseline, then every later migration applied as on a fresh database
    assert query(old_db, "SELECT version, name FROM webhooks.schema_migrations ORDER BY version") == [
        (m.version, m.name) for m in schema.load_migrations()]


def test_migrating_the_old_layout_keeps_every_row_and_a_second_run_changes_nothing(old_db):
    old_columns = table_columns(old_db)
    before = contents(old_db, old_columns)
    assert all(count for count, _ in before.values()), before
    schema.migrate(old_db)
    assert contents(old_db, old_columns) == before
    assert schema.migrate(old_db) == []


def test_a_fresh_build_defines_nothing_that_migrating_again_would_drop(db):
    # a file that defined an object twice, or an object made outside sql/, would show here
    expected = snapshot(db)
    query(db, "DELETE FROM webhooks.schema_definitions")
    assert schema.migrate(db) == [f"functions/{d.name}" for d in schema.load_definitions()]
    assert differences(expected, snapshot(db)) == []


def test_the_queued_rows_payloads_move_to_messages_each_stored_once_nothing_else_changes(old_db):
    # 014: every row keeps its state, lease and attempts; its payload, metadata and source_ref are
    # its message's, one message per event
    state = ("delivery_id, status, attempts, lease_token, locked_until, next_retry_at, delivered_at,"
             " dead_lettered_at, idempotency_key")
    before_state = query(old_db, f"SELECT {state} FROM webhooks.alert_delivery_queue ORDER BY 1")
    before = query(old_db, "SELECT delivery_id, payload, metadata, source_ref, event_id"
                           " FROM webhooks.alert_delivery_queue ORDER BY 1")
    [(events,)] = query(old_db, "SELECT count(*) FROM (SELECT DISTINCT event_id, event_type, traceparent,"
                                " source_ref, metadata, payload FROM webhooks.alert_delivery_queue) e")
    schema.migrate(old_db)
    assert query(old_db, f"SELECT {state} FROM webhooks.alert_delivery_queue ORDER BY 1") == before_state
    assert query(old_db, "SELECT delivery_id, payload, metadata, source_ref, event_id"
                         " FROM webhooks.deliveries ORDER BY 1") == before
    assert query(old_db, "SELECT count(*) FROM webhooks.alert_delivery_queue"
                         " WHERE payload IS NOT NULL OR metadata IS NOT NULL OR source_ref IS NOT NULL"
                         " OR message_id IS NULL") == [(0,)]
    [(stored,)] = query(old_db, "SELECT count(*) FROM webhooks.messages")
    assert stored == events
    # 020: each message holds the range of the delivery ids that point at it
    mismatched = ("SELECT count(*) FROM webhooks.messages m, LATERAL (SELECT min(q.delivery_id) AS first,"
                  " max(q.delivery_id) AS last FROM webhooks.alert_delivery_queue q"
                  " WHERE q.message_id = m.message_id) r"
                  " WHERE (m.first_delivery_id, m.last_delivery_id) IS DISTINCT FROM (r.first, r.last)")
    assert query(old_db, mismatched) == [(0,)]


def test_a_function_left_over_by_the_old_layout_is_gone_after_migrating(old_db):
    lookup = "SELECT to_regprocedure('webhooks.is_head_of_key(bigint, text, bigint)') IS NOT NULL"
    assert query(old_db, lookup) == [(True,)]
    schema.migrate(old_db)
    assert query(old_db, lookup) == [(False,)]


def test_a_worker_finishes_the_rows_that_were_in_flight_and_waiting(old_db, receiver, spawn):
    schema.migrate(old_db)
    keyring = Keyring.parse(FIXTURE_KEYS, KEYS_ENV)
    with psycopg.connect(old_db, autocommit=True) as conn:
        for (endpoint,) in conn.execute("SELECT id FROM webhooks.endpoints").fetchall():
            conn.execute("UPDATE webhooks.endpoints SET url = %s WHERE id = %s",
                         (keyring.seal(receiver.url(f"/{endpoint}"), encryption.URL, endpoint), endpoint))
    in_flight = [r[0] for r in query(old_db, "SELECT delivery_id FROM webhooks.alert_delivery_queue"
                                             " WHERE status = 'delivering'")]
    waiting = [r[0] for r in query(
        old_db, "SELECT q.delivery_id FROM webhooks.alert_delivery_queue q"
                " JOIN webhooks.endpoints e ON e.id = q.webhook_id"
                " WHERE q.status IN ('pending', 'retrying') AND e.active AND q.next_retry_at < now()")]
    assert in_flight and len(waiting) >= 5
    spawn(old_db, keys=FIXTURE_KEYS)
    eventually(lambda: set(statuses(old_db, in_flight + waiting).values()) == {"delivered"},
               progress=lambda: drain_progress(old_db, in_flight + waiting),
               message="every row in flight or due delivered")


def test_the_migrations_alone_define_no_function_view_or_trigger_but_what_a_constraint_calls(fresh_db):
    # functions, views, triggers and grants belong in sql/functions/, each defined once
    dsn = fresh_db(False)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA webhooks")
        for migration in schema.load_migrations():
            conn.execute(migration.sql.encode())
    defined = query(dsn, """
        SELECT 'function ' || p.oid::regprocedure FROM pg_proc p
        WHERE p.pronamespace = 'webhooks'::regnamespace
          AND NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.refobjid = p.oid
                            AND d.classid = 'pg_constraint'::regclass)
        UNION ALL
        SELECT 'view ' || c.oid::regclass FROM pg_class c
        WHERE c.relnamespace = 'webhooks'::regnamespace AND c.relkind = 'v'
        UNION ALL
        SELECT 'trigger ' || t.tgname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
        WHERE c.relnamespace = 'webhooks'::regnamespace AND NOT t.tgisinternal""")
    assert defined == []


def test_an_applied_migration_whose_file_changed_is_refused_naming_the_file(db):
    query(db, "UPDATE webhooks.schema_migrations SET checksum = 'edited' WHERE version = 1")
    with pytest.raises(schema.MigrationError, match=r"sql/migrations/001_baseline\.sql changed after it was"):
        schema.migrate(db)


def test_a_database_of_the_old_layout_at_another_version_is_refused(old_db):
    query(old_db, "DELETE FROM webhooks.schema_migrations WHERE version > 32")
    before = contents(old_db)
    with pytest.raises(schema.MigrationError, match=r"at version 32 \(circuit_and_categories\)"):
        schema.migrate(old_db)
    assert contents(old_db) == before


def test_what_no_file_defines_is_dropped_but_an_application_s_trigger_is_kept(db):
    expected = snapshot(db)
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("CREATE FUNCTION webhooks.stray() RETURNS trigger LANGUAGE plpgsql"
                     " AS 'BEGIN RETURN NEW; END'")
        conn.execute("CREATE TRIGGER stray BEFORE INSERT ON webhooks.alert_delivery_queue"
                     " FOR EACH ROW EXECUTE FUNCTION webhooks.stray()")
        conn.execute("CREATE VIEW webhooks.stray_view AS SELECT 1 AS one")
        conn.execute("CREATE TABLE public.alerts (id bigint PRIMARY KEY)")
        conn.execute("CREATE TRIGGER alerts_webhooks AFTER INSERT ON public.alerts FOR EACH ROW"
                     " EXECUTE FUNCTION webhooks.observer_queue_alert('alert.created', 'id')")
        conn.execute("DELETE FROM webhooks.schema_definitions")  # as when a file changes
    schema.migrate(db)
    assert differences(expected, snapshot(db)) == []
    assert query(db, "SELECT tgname FROM pg_trigger WHERE tgrelid = 'public.alerts'::regclass") == [
        ("alerts_webhooks",)]


def test_an_older_release_migrating_after_a_newer_one_leaves_its_definitions_alone(db):
    query(db, "INSERT INTO webhooks.schema_migrations (version, name, checksum)"
              " VALUES (%s, 'from_a_newer_release', 'x')", (schema.latest_version() + 1,))
    query(db, "UPDATE webhooks.schema_definitions SET checksum = 'newer'")
    assert schema.migrate(db) == []
    assert {c for (c,) in query(db, "SELECT checksum FROM webhooks.schema_definitions")} == {"newer"}


def test_every_endpoint_and_row_of_a_database_before_tenants_belongs_to_default(old_db):
    schema.migrate(old_db)
    assert query(old_db, "SELECT id, name FROM webhooks.tenants") == [(1, "default")]
    for table in ("endpoints", "alert_delivery_queue", "alert_delivery_log"):
        rows = query(old_db, f"SELECT tenant_id, count(*) FROM webhooks.{table} GROUP BY 1")
        assert len(rows) == 1 and rows[0][0] == 1 and rows[0][1] > 0, (table, rows)
    # a tenant added later gets a new id, not the default's
    assert query(old_db, "SELECT webhooks.register_tenant('acme')") == [(2,)]


def test_no_endpoint_of_an_older_database_receives_another_tenants_operational_events(old_db):
    # 006: an endpoint there was subscribed to every endpoint's events; from now on its own tenant's
    schema.migrate(old_db)
    assert query(old_db, "SELECT operational_all_tenants, count(*) FROM webhooks.endpoints GROUP BY 1") == [
        (False, 3)]
