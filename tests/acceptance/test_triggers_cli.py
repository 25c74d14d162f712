"""`webhook-worker triggers add|list|show|disable|enable|drop|backfill|invoke` as an operator runs them,
through a real table, a worker and a receiver."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from typing import Any

import psycopg

from tests.acceptance.test_cli import cli
from tests.support import (
    ROOT,
    TEST_KEYS,
    add_endpoint,
    eventually,
    login_as,
    query,
    wait_final,
)
from worker.encryption import KEYS_ENV

ORDERS = ("CREATE TABLE public.orders (id bigint PRIMARY KEY, tenant text, status text, amount numeric,"
          " card_token text)")


def bodies(receiver: Any, path: str) -> list[dict[str, Any]]:
    return [json.loads(r.body) for r in sorted(receiver.to(path), key=lambda r: r.delivery_id)]


def queued_ids(db: str) -> list[int]:
    return [r[0] for r in query(db, "SELECT delivery_id FROM webhooks.alert_delivery_queue"
                                    " ORDER BY delivery_id")]


def test_each_command_through_a_real_table_a_worker_and_a_receiver(db, receiver, spawn):
    env = {"DATABASE_URL": db}
    add_endpoint(db, receiver.url("/orders"), event_types=("order.*",))
    query(db, ORDERS)
    added = cli("triggers", "add", "orders", "--table", "public.orders", "--on", "insert,update,delete",
                "--event-type", "order.changed", "--columns", "status", "--exclude-columns", "card_token",
                "--when", "status <> 'draft'", env=env)
    assert added.returncode == 0, added.stderr
    assert added.stdout.strip() == ("table trigger orders added: insert, update, delete on public.orders"
                                    " queue order.changed events")
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("INSERT INTO public.orders VALUES (1, 'default', 'new', 10, 'tok_secret'),"
                     " (2, 'default', 'draft', 5, 'tok_secret')")
        conn.execute("UPDATE public.orders SET amount = 11 WHERE id = 1")    # not a watched column
        conn.execute("UPDATE public.orders SET status = 'paid' WHERE id = 1")
    shown = json.loads(cli("triggers", "show", "orders", "--json", env=env).stdout)
    assert [shown[k] for k in ("table_name", "ops", "columns", "exclude_columns", "state")] == [
        "public.orders", ["insert", "update", "delete"], ["status"], ["card_token"], "enabled"]
    assert shown["when_condition"] == "(status <> 'draft'::text)"
    assert cli("triggers", "disable", "orders", env=env).stdout.strip() == "table trigger orders disabled"
    query(db, "DELETE FROM public.orders WHERE id = 2")  # disabled: queues nothing
    assert cli("triggers", "disable", "orders", env=env).stdout.strip() == \
        "table trigger orders was disabled already"
    listed = cli("triggers", "list", env=env)
    assert listed.returncode == 0 and "orders" in listed.stdout and "disabled" in listed.stdout, listed.stdout
    assert cli("triggers", "enable", "orders", env=env).returncode == 0
    invoked = cli("triggers", "invoke", "orders", "--key", "1", env=env)
    assert invoked.returncode == 0, invoked.stderr
    assert invoked.stdout.strip() == "row 1 of table trigger orders queued as op manual: 1 delivery(ies)"
    query(db, "DELETE FROM public.orders WHERE id = 1")
    ids = queued_ids(db)
    assert len(ids) == 4
    spawn(db)
    wait_final(db, ids)
    received = bodies(receiver, "/orders")
    assert [(b["op"], b["key"], b["changed"]) for b in received] == [
        ("insert", {"id": 1}, []), ("update", {"id": 1}, ["status"]), ("manual", {"id": 1}, []),
        ("delete", {"id": 1}, [])]
    assert all("card_token" not in json.dumps(b) for b in received)
    assert received[1]["new"] == {"id": 1, "tenant": "default", "status": "paid", "amount": 11}
    # the list says how many it queued in the last hour
    [row] = json.loads(cli("triggers", "list", "--json", env=env).stdout)
    assert (row["name"], row["deliveries_last_hour"], row["state"]) == ("orders", 4, "enabled")
    dropped = cli("triggers", "drop", "orders", env=env)
    assert dropped.returncode == 0, dropped.stderr
    assert dropped.stdout.strip() == "table trigger orders dropped"
    assert query(db, "SELECT count(*) FROM pg_trigger WHERE tgrelid = 'public.orders'::regclass") == [(0,)]
    missing = cli("triggers", "show", "orders", env=env)
    assert missing.returncode == 1
    assert missing.stderr.strip() == "webhook-worker: table trigger orders: no such table trigger"


def test_a_login_without_the_tables_rights_is_told_plainly_what_it_needs(db):
    query(db, ORDERS)
    admin = login_as(db, "webhooks_test_cli_trigger_admin", "webhooks_admin")
    arguments = ("triggers", "add", "orders", "--table", "public.orders", "--on", "insert",
                 "--event-type", "order.created")
    refused = cli(*arguments, env={"DATABASE_URL": admin})
    assert refused.returncode == 1
    assert refused.stderr.strip() == (
        "webhook-worker: permission denied to add a table trigger to public.orders: the role"
        " webhooks_test_cli_trigger_admin must own it or hold its TRIGGER privilege. The table's owner can"
        " grant it: GRANT TRIGGER ON public.orders TO webhooks_test_cli_trigger_admin")
    assert query(db, "SELECT count(*) FROM webhooks.table_triggers") == [(0,)]
    # a login that is no administrator of ours at all
    reader = login_as(db, "webhooks_test_cli_trigger_reader", "webhooks_reader")
    refused = cli(*arguments, env={"DATABASE_URL": reader})
    assert refused.returncode == 1
    assert "needs the webhooks_admin role" in refused.stderr, refused.stderr
    query(db, "GRANT TRIGGER ON public.orders TO webhooks_test_cli_trigger_admin")
    added = cli(*arguments, env={"DATABASE_URL": admin})
    assert added.returncode == 0, added.stderr
    # what the user gave wrong is a usage error that names it
    both = cli("triggers", "add", "x", "--table", "public.orders", "--on", "insert", "--event-type", "a.b",
               "--tenant", "acme", "--tenant-column", "tenant", env={"DATABASE_URL": db})
    assert both.returncode == 2 and "not allowed with argument" in both.stderr
    bad_op = cli("triggers", "add", "x", "--table", "public.orders", "--on", "insert,upsert", "--event-type",
                 "a.b", env={"DATABASE_URL": db})
    assert bad_op.returncode == 2 and "one or more of insert, update, delete" in bad_op.stderr, bad_op.stderr


def test_a_tenant_scoped_trigger_queues_for_its_tenant_only(db):
    env = {"DATABASE_URL": db}
    acme = query(db, "SELECT webhooks.register_tenant('acme')")[0][0]
    hooks = {}
    for tenant, tenant_id in (("default", 1), ("acme", acme)):
        hooks[tenant] = add_endpoint(db, f"http://127.0.0.1:9/{tenant}", name=f"hook-{tenant}",
                                     event_types=("order.*",))
        query(db, "UPDATE webhooks.endpoints SET tenant_id = %s WHERE id = %s", (tenant_id, hooks[tenant]))
    query(db, ORDERS)
    added = cli("triggers", "add", "acme-orders", "--table", "public.orders", "--on", "insert",
                "--event-type", "order.created", "--tenant", "acme", env=env)
    assert added.returncode == 0, added.stderr
    by_column = cli("triggers", "add", "by-row", "--table", "public.orders", "--on", "delete",
                    "--event-type", "order.deleted", "--tenant-column", "tenant", env=env)
    assert by_column.returncode == 0, by_column.stderr
    query(db, "INSERT INTO public.orders (id, tenant) VALUES (1, 'default')")
    query(db, "DELETE FROM public.orders")
    assert query(db, "SELECT event_type, webhook_id FROM webhooks.deliveries ORDER BY delivery_id") == [
        ("order.created", hooks["acme"]), ("order.deleted", hooks["default"])]
    listed = {r["name"]: r for r in json.loads(cli("triggers", "list", "--json", env=env).stdout)}
    assert (listed["acme-orders"]["tenant"], listed["by-row"]["tenant_column"]) == ("acme", "tenant")


def test_list_flags_a_trigger_whose_table_was_dropped(db):
    env = {"DATABASE_URL": db}
    query(db, ORDERS)
    assert cli("triggers", "add", "orders", "--table", "public.orders", "--on", "insert", "--event-type",
               "order.created", env=env).returncode == 0
    query(db, "DROP TABLE public.orders")
    listed = cli("triggers", "list", env=env)
    assert listed.returncode == 0
    [row] = [line for line in listed.stdout.splitlines() if line.startswith("orders")]
    assert "public.orders" in row and "table dropped" in row
    assert "the table of orders is gone" in listed.stderr
    assert cli("triggers", "drop", "orders", env=env).returncode == 0
    assert cli("triggers", "list", "--json", env=env).stdout.strip() == "[]"


def backfill(db: str, *args: str) -> subprocess.Popen[str]:
    """`triggers backfill` running in the background, as an operator leaves it running."""
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith("WEBHOOK_WORKER_") and k != "DATABASE_URL"}
    return subprocess.Popen([sys.executable, "-m", "worker", "triggers", "backfill", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                            env={**clean, KEYS_ENV: TEST_KEYS, "DATABASE_URL": db})


def operation(db: str, operation_id: int) -> tuple[str, int]:
    return query(db, "SELECT status, processed FROM webhooks.api_operations WHERE id = %s",
                 (operation_id,))[0]


def orders_to_backfill(db: str, rows: int) -> dict[str, str]:
    """`rows` orders waiting in a table with a trigger `orders` on inserts and an endpoint subscribed:
    the environment the CLI runs with."""
    env = {"DATABASE_URL": db}
    add_endpoint(db, "http://127.0.0.1:9/o", event_types=("order.*",))
    query(db, ORDERS)
    query(db, "INSERT INTO public.orders (id, status) SELECT n, 'new' FROM generate_series(1, %s) n", (rows,))
    assert cli("triggers", "add", "orders", "--table", "public.orders", "--on", "insert", "--event-type",
               "order.created", env=env).returncode == 0
    return env


def test_a_backfill_from_the_cli_is_an_operation_that_operations_cancel_stops(db):
    env = orders_to_backfill(db, 200)
    running = backfill(db, "orders", "--rate", "4")
    try:
        listed = eventually(
            lambda: [o for o in json.loads(cli("operations", "list", "--json", env=env).stdout)
                     if o["kind"] == "trigger_backfill" and o["processed"] > 0],
            message="the backfill listed with progress")
        [shown] = listed
        assert (shown["status"], shown["rate"], shown["requested_by"]) == ("running", 4.0, "postgres")
        cancelled = cli("operations", "cancel", str(shown["id"]), env=env)
        assert cancelled.returncode == 0, cancelled.stderr
        _out, err = running.communicate(timeout=60)
    finally:
        running.kill()
    assert running.returncode == 1
    assert f"backfill {shown['id']} cancelled by cli after" in err, err
    status, processed = operation(db, shown["id"])
    assert status == "cancelled" and 0 < processed < 200
    assert query(db, "SELECT count(*) FROM webhooks.alert_delivery_queue") == [(processed,)]


def test_a_backfill_rate_outside_its_bounds_is_refused_before_anything_starts(db):
    env = {"DATABASE_URL": db}
    query(db, ORDERS)
    assert cli("triggers", "add", "orders", "--table", "public.orders", "--on", "insert", "--event-type",
               "order.created", env=env).returncode == 0
    for rate in ("inf", "nan", "0.0001", "1e9"):
        refused = cli("triggers", "backfill", "orders", "--rate", rate, env=env)
        assert refused.returncode == 2, (rate, refused.stderr)
        assert "rows a second, from 0.001 to 100000" in refused.stderr, refused.stderr
    assert query(db, "SELECT count(*) FROM webhooks.api_operations") == [(0,)]


def test_a_backfill_waiting_for_its_next_step_notices_a_cancel_at_once(db):
    env = orders_to_backfill(db, 5)
    running = backfill(db, "orders", "--rate", "0.01")  # a row, then 100 s until the next
    try:
        [(operation_id,)] = eventually(lambda: query(
            db, "SELECT id FROM webhooks.api_operations WHERE kind = 'trigger_backfill' AND processed > 0"),
            message="the backfill's first step")
        assert cli("operations", "cancel", str(operation_id), env=env).returncode == 0
        # well within the 100 s pause: the command looks at its operation while it waits
        _out, err = running.communicate(timeout=30)
    finally:
        running.kill()
    assert running.returncode == 1 and f"backfill {operation_id} cancelled by cli after 1 row(s)" in err, err


def test_a_backfill_continued_keeps_to_the_rate_it_was_started_with(db):
    env = orders_to_backfill(db, 20)
    running = backfill(db, "orders", "--rate", "5")
    try:
        eventually(lambda: query(db, "SELECT 1 FROM webhooks.api_operations WHERE processed > 0"),
                   message="the backfill's first step")
        running.send_signal(signal.SIGKILL)
        running.wait(timeout=30)
    finally:
        running.kill()
    again = cli("triggers", "backfill", "orders", env=env)  # no --rate: the stored one holds
    assert again.returncode == 0, again.stderr
    queued = [int(n) for n in re.findall(r": (\d+) row\(s\) queued", again.stderr)]
    steps = [b - a for a, b in zip([0, *queued], queued, strict=False)][1:]
    assert queued and queued[-1] == 20 and max(steps, default=0) <= 5, again.stderr


def test_a_backfill_killed_half_way_continues_when_run_again_and_queues_each_row_once(db):
    env = {"DATABASE_URL": db}
    add_endpoint(db, "http://127.0.0.1:9/o", event_types=("order.*",))
    query(db, ORDERS)
    query(db, "INSERT INTO public.orders (id, status)"
              " SELECT n, CASE WHEN n % 2 = 0 THEN 'paid' ELSE 'new' END FROM generate_series(1, 60) n")
    assert cli("triggers", "add", "orders", "--table", "public.orders", "--on", "insert", "--event-type",
               "order.created", env=env).returncode == 0
    running = backfill(db, "orders", "--where", "status = 'paid'", "--rate", "10")
    try:
        [(operation_id,)] = eventually(lambda: query(
            db, "SELECT id FROM webhooks.api_operations WHERE kind = 'trigger_backfill' AND processed > 0"),
            message="the backfill under way")
        running.send_signal(signal.SIGKILL)
        running.wait(timeout=30)
    finally:
        running.kill()
    status, before = operation(db, operation_id)
    assert status == "running" and before < 30
    again = cli("triggers", "backfill", "orders", env=env)
    assert again.returncode == 0, again.stderr
    assert f"backfill {operation_id} of orders is running already: continuing it as it was started" \
        in again.stderr
    assert again.stdout.strip() == f"backfill {operation_id} of orders done: 30 row(s) queued of 60 read"
    keys = [r[0] for r in query(db, "SELECT (payload -> 'key' ->> 'id')::int FROM webhooks.deliveries")]
    assert sorted(keys) == list(range(2, 61, 2))
    assert query(db, "SELECT DISTINCT payload ->> 'op' FROM webhooks.deliveries") == [("backfill",)]
    # a backfill at once, to its end, as JSON
    done = json.loads(cli("triggers", "backfill", "orders", "--json", env=env).stdout)
    assert (done["status"], done["processed"], done["scanned"]) == ("done", 60, 60)
