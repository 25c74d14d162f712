"""Tokens and authentication: only a hash stored, 401 and 403 as problem documents, revocation and
expiry at once, failed attempts counted and limited per address, roles enforced by the database."""

from __future__ import annotations

import asyncio
import hashlib
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from tests.api.server import ApiServer, api_config, make_token
from tests.support import API_LOGIN, query
from worker.api import tokens
from worker.api.limits import FailedAuthLimiter


def test_a_token_has_the_prefix_and_only_its_hash_is_stored(db):
    token = make_token(db, "reader", name="hashed")
    assert token.startswith("whk_") and tokens.well_formed(token)
    [(stored,)] = query(db, "SELECT token_hash FROM webhooks.api_tokens WHERE name = 'hashed'")
    assert bytes(stored) == hashlib.sha256(token.encode()).digest()
    dumped = str(query(db, "SELECT * FROM webhooks.api_tokens"))
    assert token not in dumped and token[4:] not in dumped


def test_the_probes_need_no_token(api):
    assert api.get("/health").status == 200
    ready = api.get("/ready")
    assert ready.status == 200 and ready.json["ready"] is True
    assert api.get("/metrics").status == 200


@pytest.mark.parametrize(
    "header",
    [None, "Bearer", "Basic abc", "Bearer whk_" + "x" * 43, "Bearer nonsense"],
    ids=["none", "empty", "other scheme", "unknown", "malformed"],
)
def test_without_a_valid_token_a_request_gets_401_as_a_problem_document(api, header):
    answer = api.get("/v1/token", headers={"Authorization": header} if header else None)
    assert answer.status == 401
    assert answer.headers["content-type"].startswith("application/problem+json")
    assert answer.headers["www-authenticate"].startswith("Bearer")
    problem = answer.json
    assert problem["status"] == 401 and problem["type"].endswith("/unauthorized") and problem["detail"]


def test_the_api_is_not_ready_on_a_schema_older_than_the_roles_it_switches_to(api, db):
    # as on a database not yet migrated to 007 (webhooks_admin, webhooks_authenticator): the worker
    # would still run there, the API not
    query(db, "DELETE FROM webhooks.schema_migrations WHERE version >= 5 RETURNING 1")
    ready = api.get("/ready")
    assert ready.status == 503
    assert ready.json["schema_version"] == 4 and ready.json["supported"][0] == 7


def test_a_valid_token_names_its_caller(api, role_tokens):
    for role, token in role_tokens.items():
        answer = api.get("/v1/token", token)
        assert answer.status == 200, answer.body
        assert answer.json["role"] == role


def test_a_revoked_token_stops_at_once(api, db):
    token = make_token(db, "admin", name="soon-revoked")
    assert api.get("/v1/token", token).status == 200
    with psycopg.connect(db, autocommit=True) as conn:
        assert tokens.revoke(conn, "soon-revoked")
    assert api.get("/v1/token", token).status == 401


def test_an_expired_token_is_refused(api, db):
    token = make_token(db, "admin", name="expiring", expires_at=datetime.now(UTC) + timedelta(days=1))
    assert api.get("/v1/token", token).status == 200
    query(
        db, "UPDATE webhooks.api_tokens SET expires_at = now() - interval '1 second' WHERE name = 'expiring'"
    )
    assert api.get("/v1/token", token).status == 401


def test_failed_authentications_are_limited_per_address_and_counted(db):
    server = ApiServer(api_config(db, failed_auth_per_minute=3)).start()
    try:
        good = make_token(db, "reader")
        for _ in range(3):
            assert server.get("/v1/token", "whk_" + "x" * 43).status == 401
        limited = server.get("/v1/token", "whk_" + "y" * 43)
        assert limited.status == 429 and int(limited.headers["retry-after"]) >= 1
        assert limited.json["type"].endswith("/too-many-failed-authentications")
        # a good token from the same address waits too: the lockout is the address's, not the token's
        assert server.get("/v1/token", good).status == 429
        metrics = server.get("/metrics").body.decode()
        assert 'webhook_api_failed_authentications_total{reason="invalid"} 3.0' in metrics
        assert 'webhook_api_failed_authentications_total{reason="rate_limited"} 2.0' in metrics
        assert good not in metrics and "whk_" not in metrics
    finally:
        server.stop()


def test_the_limiter_forgets_failures_older_than_its_window():
    now = [0.0]
    limiter = FailedAuthLimiter(2, window=60, clock=lambda: now[0])
    limiter.failed("a")
    limiter.failed("a")
    assert limiter.retry_after("a") == 61 and limiter.retry_after("b") is None
    now[0] = 30.0
    assert limiter.retry_after("a") == 31
    now[0] = 60.5
    assert limiter.retry_after("a") is None


def test_the_limiter_remembers_a_bounded_number_of_addresses():
    limiter = FailedAuthLimiter(1, max_addresses=2)
    for address in ("a", "b", "c"):
        limiter.failed(address)
    assert limiter.retry_after("a") is None and limiter.retry_after("c") is not None


def test_a_role_runs_under_its_database_role(api, db):
    from worker.api.tokens import Caller

    async def current_user(role):
        async with api.state.db.transaction(Caller("t", role)) as conn:
            cur = await conn.execute("SELECT current_user, session_user")
            return await cur.fetchone()

    async def resting():
        async with api.state.db.connection() as conn:
            cur = await conn.execute("SELECT current_user, session_user")
            return await cur.fetchone()

    expected_users = {"producer": "webhooks_producer", "reader": "webhooks_reader", "admin": "webhooks_admin"}
    for role, expected in expected_users.items():
        user, session = asyncio.run_coroutine_threadsafe(current_user(role), api._loop).result(10)
        assert (user, session) == (expected, API_LOGIN)
    # between requests (token and session checks) the login rests as webhooks_authenticator
    assert asyncio.run_coroutine_threadsafe(resting(), api._loop).result(10) == (
        "webhooks_authenticator", API_LOGIN)


def test_the_api_functions_are_closed_to_every_group_role_but_what_each_needs(db):
    # api_publish is the producers' and admins'; checking a token the authenticator's (the API's
    # login between requests); operations and deleting endpoints the admins'; creating, revoking
    # and listing tokens the owner's alone (sql/functions/api.sql)
    rows = query(
        db,
        "SELECT p.proname, r.rolname, has_function_privilege(r.rolname, p.oid, 'EXECUTE')"
        " FROM pg_proc p CROSS JOIN pg_roles r"
        " WHERE p.pronamespace = 'webhooks'::regnamespace AND p.proname LIKE 'api\\_%'"
        " AND r.rolname IN ('webhooks_worker', 'webhooks_producer', 'webhooks_reader', 'webhooks_admin',"
        "                   'webhooks_authenticator')",
    )
    granted = {(name, role) for name, role, allowed in rows if allowed}
    assert granted == {
        ("api_publish", "webhooks_producer"), ("api_publish", "webhooks_admin"),
        ("api_token_role", "webhooks_authenticator"),
        *((name, "webhooks_admin") for name in ("api_delete_endpoint", "api_start_replay", "api_replay_step",
                                                "api_fail_operation", "api_running_operations")),
    }
    assert query(db, "SELECT has_table_privilege('webhooks_reader', 'webhooks.api_tokens', 'SELECT')") == [
        (False,)
    ]


def test_the_database_refuses_what_a_role_may_not_do_even_past_the_api_s_check(api, db):
    # were a route's role check wrong, the grants would still refuse: reader writes nothing,
    # producer reads nothing
    from tests.support import add_endpoint, enqueue
    from worker.api.tokens import Caller

    [delivery] = enqueue(db, add_endpoint(db, "https://example.com/x"))

    async def attempt(role, sql):
        try:
            async with api.state.db.transaction(Caller("t", role)) as conn:
                await conn.execute(sql, (delivery,))
        except psycopg.errors.InsufficientPrivilege:
            return "refused"
        return "done"

    def run(role, sql):
        return asyncio.run_coroutine_threadsafe(attempt(role, sql), api._loop).result(10)

    assert run("reader", "SELECT webhooks.replay(%s)") == "refused"
    assert run("reader", "SELECT webhooks.enable_endpoint(%s)") == "refused"
    assert run("producer", "SELECT * FROM webhooks.delivery(%s)") == "refused"
    assert run("producer", "SELECT url FROM webhooks.endpoints WHERE id = %s") == "refused"
    assert run("reader", "SELECT url FROM webhooks.endpoints WHERE id = %s") == "refused"
    assert run("admin", "SELECT * FROM webhooks.delivery(%s)") == "done"
    # an admin changes things through the administration functions only
    assert run("admin", "SELECT url FROM webhooks.endpoints WHERE id = %s") == "refused"
    assert run("admin", "UPDATE webhooks.alert_delivery_queue SET attempts = 0 WHERE delivery_id = %s") \
        == "refused"
    assert run("admin", "UPDATE webhooks.endpoints SET active = false WHERE id = (SELECT webhook_id"
                        " FROM webhooks.alert_delivery_queue WHERE delivery_id = %s)") == "refused"


def test_a_console_mounted_under_console_does_its_own_login_with_verify_token(db):
    # the hook the console uses (worker/api/__init__.py): a sub-application built from the state
    from aiohttp import web

    from tests.api.server import ApiServer, api_config
    from worker.api.app import STATE, client_address
    from worker.api.problems import Problem

    def console(state):
        async def whoami(request):
            try:
                caller = await state.verify_token(request.query.get("token", ""), client_address(request))
            except Problem as problem:
                return web.Response(status=problem.status, text="refused")
            return web.Response(text=f"{caller.name}:{caller.role}:{request.app[STATE] is state}")

        sub = web.Application()
        sub[STATE] = state
        sub.router.add_get("/", whoami)
        return sub

    token = make_token(db, "reader", name="oncall")
    server = ApiServer(api_config(db), console=console).start()
    try:
        assert server.get("/console/").status == 401  # no Bearer middleware: its own answer
        assert server.get(f"/console/?token={token}").body == b"oncall:reader:True"
    finally:
        server.stop()
