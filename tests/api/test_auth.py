"""Tokens and authentication: only a hash stored, 401 and 403 as problem documents, revocation and
expiry at once, failed attempts counted and limited per address, roles enforced by the database."""

from __future__ import annotations

import asyncio
import hashlib
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from tests.api.server import ApiProcess, ApiServer, api_config, make_token
from tests.support import API_LOGIN, query, stored
from worker.api.app import API_SCHEMA_VERSION
from worker.rules import tokens
from worker.store import tokens as token_store
from worker.web.limits import FailedAuthLimiter


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
    assert "webhook_api_requests_total" in api.metrics()  # on api.metrics_port, no token either


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


def test_the_api_is_not_ready_on_a_schema_older_than_what_it_reads_and_switches_to(api, db):
    # as on a database not yet migrated to the newest the API needs (the roles of 007, the columns
    # of 011): the worker would still run there, the API not
    query(db, "DELETE FROM webhooks.schema_migrations WHERE version >= %s RETURNING 1", (API_SCHEMA_VERSION,))
    ready = api.get("/ready")
    assert ready.status == 503
    assert ready.json["schema_version"] < API_SCHEMA_VERSION
    assert ready.json["supported"][0] == API_SCHEMA_VERSION


def test_a_valid_token_names_its_caller(api, role_tokens):
    for role, token in role_tokens.items():
        answer = api.get("/v1/token", token)
        assert answer.status == 200, answer.body
        assert answer.json["role"] == role


def test_a_revoked_token_stops_at_once(api, db):
    token = make_token(db, "admin", name="soon-revoked")
    assert api.get("/v1/token", token).status == 200
    assert stored(db, token_store.revoke, "soon-revoked")
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
        # no token at all guesses nothing: 401 even from a locked-out address, and not counted
        assert server.get("/v1/token").status == 401
        metrics = server.metrics()
        assert 'webhook_api_failed_authentications_total{reason="missing"} 1.0' in metrics
        assert 'webhook_api_failed_authentications_total{reason="invalid"} 3.0' in metrics
        assert 'webhook_api_failed_authentications_total{reason="rate_limited"} 1.0' in metrics
        assert good not in metrics and "whk_" not in metrics
    finally:
        server.stop()


def test_a_valid_admin_token_is_served_after_25_failures_from_its_address(api, db):
    # the default limit (20): anyone sharing the address (a NAT, a proxy) failing does not shut
    # out a client whose token is good
    admin = make_token(db, "admin")
    failures = [api.get("/v1/tenants", "whk_" + "x" * 43) for _ in range(10)]
    failures += [api.get("/v1/tenants", "nonsense") for _ in range(10)]
    failures += [api.get("/v1/tenants", "whk_" + "w" * 43) for _ in range(5)]
    assert [a.status for a in failures] == [401] * 20 + [429] * 5
    for _ in range(2):
        served = api.get("/v1/tenants", admin)
        assert served.status == 200, served.body
        # ... and the failures go on being limited
        assert api.get("/v1/tenants", "whk_" + "z" * 43).status == 429
    metrics = api.metrics()
    assert 'webhook_api_failed_authentications_total{reason="rate_limited"} 7.0' in metrics


def test_a_forged_forwarded_header_from_an_untrusted_peer_moves_no_failure(db):
    # 127.0.0.1 (the test's own address) is not a trusted proxy here: whatever it claims to forward
    # for, its failures are its own
    server = ApiServer(api_config(db, failed_auth_per_minute=2, trusted_proxies=["10.0.0.0/8"])).start()
    try:
        bad = "whk_" + "x" * 43
        assert server.get("/v1/token", bad, headers={"X-Forwarded-For": "203.0.113.1"}).status == 401
        assert server.get("/v1/token", bad, headers={"Forwarded": "for=203.0.113.2"}).status == 401
        for claimed in ({"X-Forwarded-For": "203.0.113.3"}, {"Forwarded": "for=203.0.113.4"}, {}):
            assert server.get("/v1/token", bad, headers=claimed).status == 429
    finally:
        server.stop()


def test_behind_a_trusted_proxy_each_forwarded_client_is_limited_apart(db, tmp_path):
    # the real process, configured from its file as an operator would
    process = ApiProcess(db, tmp_path, failed_auth_per_minute=2, trusted_proxies=["127.0.0.1"])
    try:
        client, bad = process.client, "whk_" + "x" * 43

        def failing(**headers: str) -> int:
            return client.get("/v1/token", bad, headers=headers).status

        assert [failing(**{"X-Forwarded-For": "203.0.113.7"}) for _ in range(3)] == [401, 401, 429]
        # another client behind the same proxy has failures of its own to spend
        assert failing(**{"X-Forwarded-For": "198.51.100.9"}) == 401
        assert failing(Forwarded='for="[2001:db8::1]:4711"') == 401
        # the client cannot step out of its lockout by prepending an address: the proxy appends its own
        assert failing(**{"X-Forwarded-For": "198.51.100.77, 203.0.113.7"}) == 429
        assert failing(**{"X-Forwarded-For": "198.51.100.9"}) == 401
        assert failing(**{"X-Forwarded-For": "198.51.100.9"}) == 429
        # nor was the proxy's own address locked out by its clients' failures
        assert failing() == 401
        reader = make_token(db, "reader")
        assert client.get("/v1/token", reader, headers={"X-Forwarded-For": "203.0.113.7"}).status == 200
    finally:
        assert process.stop() == 0


def test_every_answer_is_kept_out_of_caches_and_is_not_sniffed(db):
    server = ApiServer(api_config(db, failed_auth_per_minute=1)).start()
    try:
        reader, producer = make_token(db, "reader"), make_token(db, "producer")
        answers = {
            "200": server.get("/v1/token", reader),
            "200 document": server.get("/v1/openapi.json"),
            "403": server.get("/v1/stats", producer),
            "404": server.get("/v1/no-such-route", reader),
            "405": server.request("DELETE", "/v1/token", reader),
            "422": server.post("/v1/messages", producer, {"payload": {}}),
            "health": server.get("/health"),
            "ready": server.get("/ready"),
            "401": server.get("/v1/token", "whk_" + "x" * 43),
            "429": server.get("/v1/token", "whk_" + "x" * 43),
        }
        assert [a.status for a in answers.values()] == [200, 200, 403, 404, 405, 422, 200, 200, 401, 429]
        for what, answer in answers.items():
            assert answer.headers["content-type"].startswith(("application/json", "application/problem+json"))
            assert answer.headers.get("cache-control") == "no-store", what
            assert answer.headers.get("x-content-type-options") == "nosniff", what
        assert server.contract_problems() == []
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


class Lookups:
    """Stand-ins for the database's answer to a credential, counting how many run and how many at
    once; those made with `held` wait until it is set."""

    def __init__(self, held: asyncio.Event | None = None) -> None:
        self.held = held
        self.calls = self.running = self.most = 0

    def answering(self, answer):
        async def lookup():
            self.calls += 1
            self.running += 1
            self.most = max(self.most, self.running)
            if self.held is not None:
                await self.held.wait()
            self.running -= 1
            return answer

        return lookup


def test_a_locked_out_address_is_refused_only_for_failures():
    async def scenario():
        limiter, lookups = FailedAuthLimiter(2), Lookups()
        for _ in range(2):
            assert (await limiter.check("a", b"bad", lookups.answering(None))).retry_after is None
        assert limiter.retry_after("a") is not None
        good = await limiter.check("a", b"good", lookups.answering("caller"))
        assert good.found == "caller" and good.retry_after is None
        bad = await limiter.check("a", b"bad", lookups.answering(None))
        assert bad.found is None and bad.retry_after is not None and bad.retry_after >= 1
        # a credential refused by its shape is not looked up, locked out or not
        calls = lookups.calls
        shapeless = await limiter.check("a", None, lookups.answering("caller"))
        assert shapeless.found is None and shapeless.retry_after is not None
        assert (await limiter.check("b", None, lookups.answering("caller"))).retry_after is None
        assert lookups.calls == calls

    asyncio.run(scenario())


def test_a_locked_out_address_guesses_one_lookup_at_a_time():
    async def scenario():
        limiter = FailedAuthLimiter(1)
        await limiter.check("a", b"bad", Lookups().answering(None))
        await limiter.check("b", b"known", Lookups().answering("caller"))
        release = asyncio.Event()
        guesses, elsewhere = Lookups(release), Lookups(release)
        queued = [asyncio.create_task(limiter.check("a", b"guess%d" % i, guesses.answering(None)))
                  for i in range(5)]
        await asyncio.sleep(0)
        assert guesses.running == 1
        # a credential that passed lately does not queue behind the guesser (which waits for ever)
        known = limiter.check("a", b"known", Lookups().answering("caller"))
        assert (await asyncio.wait_for(known, timeout=10)).found == "caller"
        # and an address that is not locked out is not held up at all
        free = [asyncio.create_task(limiter.check("c", b"x%d" % i, elsewhere.answering(None)))
                for i in range(3)]
        await asyncio.sleep(0)
        assert guesses.running == 1 and elsewhere.running == 3
        release.set()
        verdicts = await asyncio.gather(*queued, *free)
        assert (guesses.calls, guesses.most) == (5, 1)
        assert all(v.found is None and v.retry_after is not None for v in verdicts[:5])
        assert limiter._turns == {}  # nothing is kept for an address once its queue is empty

    asyncio.run(scenario())


def test_the_limiter_remembers_a_bounded_number_of_addresses():
    limiter = FailedAuthLimiter(1, max_addresses=2)
    for address in ("a", "b", "c"):
        limiter.failed(address)
    assert limiter.retry_after("a") is None and limiter.retry_after("c") is not None


def test_a_role_runs_under_its_database_role(api, db):
    from worker.rules.tokens import Caller

    async def current_user(role):
        # a tenant administrator's transaction always sets its tenant (the default tenant's id: 1)
        async with api.state.db.transaction(Caller("t", role, 1 if role == "tenant_admin" else None)) as conn:
            cur = await conn.execute("SELECT current_user, session_user")
            return await cur.fetchone()

    async def resting():
        async with api.state.db.connection() as conn:
            cur = await conn.execute("SELECT current_user, session_user")
            return await cur.fetchone()

    expected_users = {"producer": "webhooks_producer", "reader": "webhooks_reader", "admin": "webhooks_admin",
                      "tenant_admin": "webhooks_tenant_admin"}
    for role, expected in expected_users.items():
        user, session = asyncio.run_coroutine_threadsafe(current_user(role), api._loop).result(10)
        assert (user, session) == (expected, API_LOGIN)
    # between requests (token and session checks) the login rests as webhooks_authenticator
    assert asyncio.run_coroutine_threadsafe(resting(), api._loop).result(10) == (
        "webhooks_authenticator", API_LOGIN)


def test_the_api_functions_are_closed_to_every_group_role_but_what_each_needs(db):
    # api_publish and api_publish_batch are the producers' and admins'; checking a token (and taking
    # its role, to publish as it) the authenticator's (the API's login between requests); operations
    # and deleting endpoints the admins' (a tenant's admin starts and cancels its own and deletes its
    # own endpoints; the runner's steps are the admins'); creating, revoking and listing tokens the
    # owner's and the unscoped admins' (/v1/tokens), never a tenant administrator's
    # (sql/functions/api.sql)
    rows = query(
        db,
        "SELECT p.proname, r.rolname, has_function_privilege(r.rolname, p.oid, 'EXECUTE')"
        " FROM pg_proc p CROSS JOIN pg_roles r"
        " WHERE p.pronamespace = 'webhooks'::regnamespace AND p.proname LIKE 'api\\_%'"
        " AND r.rolname IN ('webhooks_worker', 'webhooks_producer', 'webhooks_reader', 'webhooks_admin',"
        "                   'webhooks_tenant_admin', 'webhooks_authenticator')",
    )
    granted = {(name, role) for name, role, allowed in rows if allowed}
    assert granted == {
        *((name, role) for name in ("api_publish", "api_publish_batch")
          for role in ("webhooks_producer", "webhooks_admin", "webhooks_tenant_admin")),
        *((name, "webhooks_authenticator") for name in ("api_token_role", "api_authorize",
                                                        "api_publish_begin", "api_publish_check",
                                                        "api_publish_as", "api_publish_batch_as")),
        *((name, "webhooks_admin") for name in ("api_delete_endpoint", "api_start_replay", "api_replay_step",
                                                "api_cancel_operation",
                                                "api_fail_operation", "api_running_operations",
                                                "api_create_token", "api_revoke_token", "api_token_list")),
        *((name, "webhooks_tenant_admin")
          for name in ("api_delete_endpoint", "api_start_replay", "api_cancel_operation")),
    }
    assert query(db, "SELECT has_table_privilege('webhooks_reader', 'webhooks.api_tokens', 'SELECT')") == [
        (False,)
    ]


def test_the_database_refuses_what_a_role_may_not_do_even_past_the_api_s_check(api, db):
    # were a route's role check wrong, the grants would still refuse: reader writes nothing,
    # producer reads nothing
    from tests.support import add_endpoint, enqueue
    from worker.rules.tokens import Caller

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
    from worker.web.context import STATE, client_address
    from worker.web.problems import Problem

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
