"""The API's own login: neither the schema owner nor able to create roles, it rests as
webhooks_authenticator and switches to the caller's group role per request. Every other API test
runs the API as this login (tests/api/server.py), so every route, the console and the bulk replay
runner are shown to work without ownership; these tests show what stays refused, what each group
role holds, and what `migrate` and the API say about a login with more rights than it needs."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from tests.acceptance.test_cli import cli
from tests.api.server import ApiProcess, make_token
from tests.support import API_LOGIN, LOGIN_PASSWORD, api_dsn, eventually, query
from worker.localpg import login_role, role_dsn
from worker.store.database import API_GROUPS, login_problems
from worker.store.settings import SETTABLE

DENIED = psycopg.errors.InsufficientPrivilege


def refused(dsn: str, statement: str, role: str | None = None) -> bool:
    """Whether `statement` is refused for lack of privilege, run by the login of `dsn` (after SET
    ROLE `role`, when given) in a transaction that is rolled back whatever happens."""
    with psycopg.connect(dsn) as conn:
        try:
            if role is not None:
                conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(role)))
            conn.execute(statement)  # type: ignore[arg-type]
        except DENIED:
            return True
        finally:
            conn.rollback()
    return False


def test_the_api_s_login_cannot_do_what_the_owner_can(db):
    login = api_dsn(db)
    [(owner,)] = query(db, "SELECT nspowner::regrole::text FROM pg_namespace WHERE nspname = 'webhooks'")
    # the escalation CREATEROLE allows on PostgreSQL 15, and what only the owner may do
    for statement in (
        "CREATE ROLE webhooks_test_escalated",
        f"GRANT pg_execute_server_program TO {API_LOGIN}",
        "COPY (SELECT 1) TO PROGRAM 'true'",
        f"SET ROLE {owner}",
        "ALTER TABLE webhooks.endpoints ADD COLUMN stolen text",
        "CREATE OR REPLACE FUNCTION webhooks.replay(bigint) RETURNS boolean LANGUAGE sql AS 'SELECT true'",
        "DROP FUNCTION webhooks.replay(bigint)",
    ):
        assert refused(login, statement), statement
    # NOINHERIT: the login itself holds nothing until it switches
    assert refused(login, "SELECT count(*) FROM webhooks.alert_delivery_queue")
    assert not refused(login, "SELECT count(*) FROM webhooks.alert_delivery_queue", "webhooks_reader")
    # no group role it switches to writes a table outside the functions, or reads a credential or
    # a token; the settings an admin changes are the settable ones only
    for role in API_GROUPS:
        for statement in (
            "UPDATE webhooks.endpoints SET active = false",
            "SELECT url, signing_secrets FROM webhooks.endpoints",
            "DELETE FROM webhooks.alert_delivery_log",
            "UPDATE webhooks.alert_delivery_queue SET attempts = 0",
            "SELECT token_hash FROM webhooks.api_tokens",
            "INSERT INTO webhooks.api_tokens (name, role, token_hash) VALUES ('x', 'admin', '\\x00')",
            "UPDATE webhooks.delivery_config SET dead_letter_alert_threshold = 1",
            "SELECT webhooks.purge_dead_letters(interval '1 day', NULL)",
        ):
            assert refused(login, statement, role), (role, statement)
        # tokens: the unscoped admins' (/v1/tokens) through the function, never the table
        if role != "webhooks_admin":
            assert refused(login, "SELECT webhooks.api_create_token('x', 'admin', sha256('x'))", role), role
    assert not refused(login, "UPDATE webhooks.delivery_config SET max_attempts = 9", "webhooks_admin")


def granted(db: str, role: str) -> set[tuple[str, str, str]]:
    """Every (kind, object, privilege) `role` was granted in the schema."""
    rows = query(db, """
        SELECT 'schema', n.nspname::text, a.privilege_type  -- text: a name would cut signatures at 63
        FROM pg_namespace n, aclexplode(n.nspacl) a
        WHERE n.nspname = 'webhooks' AND a.grantee = %(role)s::regrole
        UNION ALL
        SELECT 'relation', c.oid::regclass::text, a.privilege_type
        FROM pg_class c, aclexplode(c.relacl) a
        WHERE c.relnamespace = 'webhooks'::regnamespace AND a.grantee = %(role)s::regrole
        UNION ALL
        SELECT 'column', c.oid::regclass || '.' || t.attname, a.privilege_type
        FROM pg_class c JOIN pg_attribute t ON t.attrelid = c.oid, aclexplode(t.attacl) a
        WHERE c.relnamespace = 'webhooks'::regnamespace AND a.grantee = %(role)s::regrole
        UNION ALL
        SELECT 'function', p.oid::regprocedure::text, a.privilege_type
        FROM pg_proc p, aclexplode(p.proacl) a
        WHERE p.pronamespace = 'webhooks'::regnamespace AND a.grantee = %(role)s::regrole""",
                 {"role": role})
    return {(str(kind), str(name), str(privilege)) for kind, name, privilege in rows}


# Installing or dropping a table trigger needs the table's owner or its TRIGGER privilege, and a
# condition runs with its author's rights: these run as the caller (whose own rights PostgreSQL
# checks) and change the schema's tables only through the owner's functions they call.
AS_THE_CALLER = {"webhooks.table_trigger_add(text,text,text[],text,text[],text[],text,text,text)",
                 "webhooks.table_condition_check(oid,text)", "webhooks.table_trigger_drop(text)",
                 "webhooks.table_trigger_disable(text)", "webhooks.table_trigger_enable(text)",
                 "webhooks.table_trigger_backfill(text,text,double precision)",
                 # and what reads the summary, which keeps to the caller's tenant itself
                 "webhooks.table_trigger_list()", "webhooks.table_trigger_show(text)"}


def test_an_admin_reads_what_a_reader_reads_and_changes_things_only_through_its_functions(db):
    reader, admin = granted(db, "webhooks_reader"), granted(db, "webhooks_admin")
    assert reader and reader <= admin, reader - admin
    extra = admin - reader
    # the settings `config set` may change, and nothing else of any table
    writes = {g for g in extra if g[2] not in ("SELECT", "EXECUTE", "USAGE")}
    assert writes == {("column", f"webhooks.delivery_config.{column}", "UPDATE")
                      for column in [*SETTABLE, "updated_at"]}
    # what it reads besides: the table triggers, which name tables and conditions of the applications'
    # own schemas, an administrator's to read (a tenant administrator's those of its tenant), not a reader's
    reads = {g for g in extra if g[2] == "SELECT"}
    assert reads == {("relation", "webhooks.table_trigger_summary", "SELECT")}
    # every other right is a function that runs as the owner, with a fixed search_path
    functions = {name for kind, name, _ in extra if kind == "function"}
    assert {"webhooks.replay(bigint)", "webhooks.update_endpoint(bigint,jsonb)",
            "webhooks.api_replay_step(bigint,integer)"} <= functions
    for name, definer, settings in query(
            db, "SELECT p.oid::regprocedure::text, p.prosecdef, coalesce(p.proconfig, '{}') FROM pg_proc p"
                " WHERE p.oid::regprocedure::text = ANY(%s)", (sorted(functions),)):
        if name == "webhooks.valid_retry_schedule(jsonb)":
            continue  # a CHECK constraint on the settings calls it, as whoever writes the row
        if name in AS_THE_CALLER:
            assert not definer and any(s.startswith("search_path=pg_catalog") for s in settings), name
            continue
        assert definer and "search_path=pg_catalog, webhooks, pg_temp" in settings, name


def test_the_api_s_login_rests_as_a_role_that_only_checks_tokens_and_sessions(db):
    assert granted(db, "webhooks_authenticator") == {
        ("schema", "webhooks", "USAGE"),
        ("function", "webhooks.api_token_role(bytea)", "EXECUTE"),
        ("function", "webhooks.api_authorize(bytea,text[])", "EXECUTE"),
        ("function", "webhooks.api_publish_begin(bytea,text[],bigint)", "EXECUTE"),
        ("function", "webhooks.api_publish_check(bytea,text[])", "EXECUTE"),
        ("function", "webhooks.api_publish_as(bytea,text[],bigint,text,jsonb,text,text,text,integer,"
                     "timestamp with time zone,text)", "EXECUTE"),
        ("function", "webhooks.api_publish_batch_as(bytea,text[],bigint,jsonb,text)", "EXECUTE"),
        ("function", "webhooks.console_start_session(bytea,bytea,interval)", "EXECUTE"),
        ("function", "webhooks.console_session(bytea)", "EXECUTE"),
        ("function", "webhooks.console_end_session(bytea)", "EXECUTE"),
        ("function", "webhooks.console_open_portal_link(bytea,bytea)", "EXECUTE"),
        ("function", "webhooks.schema_version()", "EXECUTE"),
    }


@pytest.fixture
def extra_logins(db: str) -> Iterator[list[str]]:
    """Names of login roles a test creates; dropped afterwards (roles belong to the cluster)."""
    names: list[str] = []
    yield names
    with psycopg.connect(db, autocommit=True) as conn:
        for name in names:
            conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(name)))


def problems_of(dsn: str, groups: tuple[str, ...] = API_GROUPS) -> list[tuple[str, bool]] | None:
    async def ask() -> list[tuple[str, bool]] | None:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            return await login_problems(conn, groups)

    return asyncio.run(ask())


def test_the_api_names_what_is_wrong_with_its_login(db, extra_logins):
    assert problems_of(api_dsn(db)) == []
    [(superuser,)] = query(db, "SELECT current_user")
    assert problems_of(db) == [(f"the login {superuser} is a superuser", False)]
    suffix = uuid.uuid4().hex[:8]
    creator, short = f"webhooks_test_creator_{suffix}", f"webhooks_test_short_{suffix}"
    extra_logins += [creator, short]
    creator_dsn = login_role(db, creator, API_GROUPS, LOGIN_PASSWORD)
    query(db, f"ALTER ROLE {creator} CREATEROLE")
    [(problem, missing)] = problems_of(creator_dsn)
    assert "CREATEROLE" in problem and "pg_execute_server_program" in problem and not missing
    short_dsn = login_role(db, short, API_GROUPS[:-1], LOGIN_PASSWORD)
    left_out = API_GROUPS[-1]
    assert problems_of(short_dsn) == [
        (f"the login {short} is not a member of {left_out}: GRANT {left_out} TO {short}", True)]
    # before the migration has made the group roles, nothing is blamed on the login (it waits)
    assert problems_of(short_dsn, (*API_GROUPS, f"webhooks_test_not_made_{suffix}")) is None


@pytest.fixture
def ordinary_owner(pg_server: str, fresh_db, extra_logins) -> tuple[str, str]:
    """An empty database owned by a role of its own with CREATEROLE (not a superuser), as
    docs/security.md has the owner migrate the first time: its DSN and the role's name."""
    name = f"webhooks_test_owner_{uuid.uuid4().hex[:8]}"
    extra_logins.append(name)
    dsn = fresh_db(False)
    with psycopg.connect(pg_server, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN CREATEROLE PASSWORD {}").format(
            sql.Identifier(name), sql.Literal(LOGIN_PASSWORD)))
        conn.execute(sql.SQL("ALTER DATABASE {} OWNER TO {}").format(
            sql.Identifier(conninfo_to_dict(dsn)["dbname"]), sql.Identifier(name)))
    yield role_dsn(dsn, name, LOGIN_PASSWORD), name
    # what the role owns goes back to the superuser, so that the role can be dropped
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("REASSIGN OWNED BY {} TO CURRENT_USER").format(sql.Identifier(name)))
        conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(name)))


def test_migrate_says_how_to_drop_createrole_and_the_api_warns_when_it_logs_in_as_the_owner(
        ordinary_owner, tmp_path):
    owner, name = ordinary_owner
    first = cli("migrate", env={"DATABASE_URL": owner})
    assert first.returncode == 0, first.stderr
    [advice] = [line for line in first.stderr.splitlines() if line.startswith("advice:")]
    assert f"ALTER ROLE {name} NOCREATEROLE" in advice
    # an API logging in as this owner still serves, and says so in its log
    process = ApiProcess(owner, tmp_path, as_owner=True)
    try:
        eventually(lambda: process.client.get("/ready").status == 200, message="api ready")
        admin = make_token(owner, "admin")
        assert process.client.post("/v1/tenants", admin, {"name": "acme"}).status == 201

        def warnings() -> list[str]:
            lines = [json.loads(line) for line in process.log_path.read_text().splitlines()
                     if line.startswith("{")]
            return [line["problem"] for line in lines
                    if line.get("event") == "api login has more rights than it needs"]

        found = eventually(lambda: len(warnings()) == 2 and warnings(), message="the login warnings")
        assert any(f"the login {name} is the schema owner" in w for w in found), found
        assert any("CREATEROLE" in w for w in found), found
    finally:
        process.kill()
    # as advised (on PostgreSQL 15 the role may drop it itself): nothing more to advise
    query(owner, sql.SQL("ALTER ROLE {} NOCREATEROLE").format(sql.Identifier(name)))
    again = cli("migrate", env={"DATABASE_URL": owner})
    assert again.returncode == 0, again.stderr
    assert "advice:" not in again.stderr


def test_migrate_as_a_superuser_advises_an_ordinary_owner(fresh_db):
    result = cli("migrate", env={"DATABASE_URL": fresh_db(False)})
    assert result.returncode == 0, result.stderr
    [advice] = [line for line in result.stderr.splitlines() if line.startswith("advice:")]
    assert "a superuser" in advice and "docs/security.md" in advice
