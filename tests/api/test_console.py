"""The console without a browser: login into a server-side session, cookie attributes, CSP, CSRF,
what a reader may not do, sessions ending with their token, replays and endpoint changes."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from tests.acceptance.test_cli import cli
from tests.api.console_client import Browserless, ConsoleServer
from tests.api.server import api_config, make_token
from tests.api.test_endpoints_api import delivered_in_a_digest
from tests.support import ROOT, add_endpoint, enqueue, eventually, query, stored
from worker.config import Config
from worker.console import sessions
from worker.console.pages import CONTENT_SECURITY_POLICY
from worker.rules.classification import CATEGORIES
from worker.store import tokens as token_store


@pytest.fixture
def console(db: str) -> Iterator[ConsoleServer]:
    server = ConsoleServer(api_config(db)).start()
    yield server
    server.stop()


def dead_letter(db: str, endpoint: int | None = None) -> int:
    """A dead-lettered delivery (set up in SQL: these tests are about the console, not the worker)."""
    endpoint = endpoint or add_endpoint(db, "http://127.0.0.1:9/hook")
    [delivery_id] = enqueue(db, endpoint, {"alert": "disk full"})
    query(db, "UPDATE webhooks.alert_delivery_queue SET status = 'dead_letter', attempts = 1,"
              " failure_category = 'http_5xx', last_http_status = 500, dead_letter_reason = 'http 500',"
              " dead_lettered_at = now() WHERE delivery_id = %s", (delivery_id,))
    return delivery_id


def logged_in(console: ConsoleServer, db: str, role: str, name: str | None = None) -> Browserless:
    person = Browserless(console)
    answer = person.login(make_token(db, role, name=name))
    assert answer.status == 303 and answer.headers["location"] == "/console/", answer.body
    return person


def test_pages_need_a_session(console):
    for path in ("/console/", "/console/dead-letters", "/console/endpoints", "/console/operations",
                 "/console/deliveries/1", "/console/event-types", "/console/event-types/webhook.test"):
        answer = Browserless(console).get(path)
        assert answer.status == 303 and answer.headers["location"] == "/console/login", path
    assert Browserless(console).post("/console/dead-letters/replay", {"delivery_id": "1"}).status == 303


def test_login_opens_a_session_in_an_httponly_strict_cookie_that_is_not_the_token(console, db, capfd):
    person = Browserless(console)
    token = make_token(db, "admin", name="alice")
    answer = person.login(token)
    assert answer.status == 303
    [session_cookie] = [h for h in person.set_cookie_headers if h.startswith("webhook_console=")]
    attributes = {a.strip().split("=")[0].lower(): a for a in session_cookie.split(";")[1:]}
    assert "httponly" in attributes and attributes["samesite"].strip() == "SameSite=Strict"
    assert attributes["path"].strip() == "Path=/console"
    assert "secure" not in attributes  # plain http here; see the TLS test below
    session_id = person.cookies["webhook_console"]
    assert token not in session_cookie and session_id != token
    stored = str(query(db, "SELECT * FROM webhooks.console_sessions"))
    assert session_id not in stored and token not in stored
    page = person.get("/console/")
    assert page.status == 200 and "alice" in page.body.decode()
    logged = capfd.readouterr()
    assert "console login" in logged.out and token not in logged.out + logged.err
    assert session_id not in logged.out + logged.err


def test_behind_tls_the_session_cookie_is_secure(console, db):
    person = Browserless(console)
    answer = person.login(make_token(db, "reader"), headers={"X-Forwarded-Proto": "https"})
    assert answer.status == 303
    [session_cookie] = [h for h in person.set_cookie_headers if h.startswith("webhook_console=")]
    assert "secure" in [a.strip().lower() for a in session_cookie.split(";")]


def test_a_wrong_or_producer_token_opens_no_session(console, db):
    person = Browserless(console)
    answer = person.login("whk_" + "x" * 43)
    assert answer.status == 401 and "not valid" in answer.body.decode()
    answer = person.login(make_token(db, "producer"))
    assert answer.status == 403 and "producer token cannot open the console" in answer.body.decode()
    assert "webhook_console" not in person.cookies
    assert query(db, "SELECT count(*) FROM webhooks.console_sessions") == [(0,)]


def test_failed_logins_lock_the_address_out_as_the_api_does_but_a_good_token_still_logs_in(db):
    server = ConsoleServer(api_config(db, failed_auth_per_minute=2)).start()
    try:
        person = Browserless(server)
        assert [person.login("whk_" + "x" * 43).status for _ in range(2)] == [401, 401]
        locked = person.login("whk_" + "y" * 43)
        assert locked.status == 429 and int(locked.headers["retry-after"]) >= 1
        assert "failed to authenticate too often" in locked.body.decode()
        assert "webhook_console" not in person.cookies
        # the lockout limits failures, never a person with a good token behind the same address
        answer = person.login(make_token(db, "admin", name="alice"))
        assert answer.status == 303 and answer.headers["location"] == "/console/", answer.body
        page = person.get("/console/")
        assert page.status == 200 and "alice" in page.body.decode()
    finally:
        server.stop()


def test_session_cookie_misses_count_as_failed_logins(db):
    server = ConsoleServer(api_config(db, failed_auth_per_minute=2)).start()
    try:
        person = Browserless(server)
        # one malformed cookie and one of a session's shape that no session has
        for cookie in ("forged", sessions.new_secret()):
            person.cookies[sessions.COOKIE] = cookie
            answer = person.get("/console/")
            assert answer.status == 303
            assert answer.headers["location"] == "/console/login?notice=session_ended"
            assert sessions.COOKIE not in person.cookies  # the redirect drops it
        locked = person.login("whk_" + "x" * 43)
        assert locked.status == 429, locked.body
        metrics = server.metrics()
        assert 'webhook_api_failed_authentications_total{reason="invalid"} 2.0' in metrics
        assert 'webhook_api_failed_authentications_total{reason="rate_limited"} 1.0' in metrics
        assert person.login(make_token(db, "reader")).status == 303
    finally:
        server.stop()


def test_a_malformed_session_cookie_is_refused_without_asking_the_database(db):
    # the API's database does not exist: anything that asks it answers 503
    unreachable = make_conninfo(db, dbname="no_such_database")
    server = ConsoleServer(Config.model_validate({
        "database": {"url": unreachable, "pool_max_size": 1, "connect_timeout_seconds": 1},
        "api": {"host": "127.0.0.1", "port": 0, "metrics_port": 0},
    })).start()
    try:
        person = Browserless(server)
        for malformed in ("x", "a" * 42, "a" * 44, "a" * 42 + "!", "a" * 4000):
            person.cookies[sessions.COOKIE] = malformed
            answer = person.get("/console/")
            assert answer.status == 303, malformed
            assert answer.headers["location"] == "/console/login?notice=session_ended", malformed
        # the check that does ask it: a cookie of a session's shape
        person.cookies[sessions.COOKIE] = sessions.new_secret()
        assert person.get("/console/").status == 503
    finally:
        server.stop()


def test_every_form_field_has_a_label(console, db):
    dead_letter(db)
    person = logged_in(console, db, "admin")
    for path in ("/console/login", "/console/", "/console/dead-letters", "/console/endpoints",
                 "/console/deliveries/1", "/console/deliveries", "/console/endpoints/1",
                 "/console/event-types", "/console/event-types/webhook.test",
                 "/console/portal/" + "x" * 43):
        html = person.get(path).body.decode()
        labelled = set(re.findall(r'<label for="([^"]+)"', html))
        for field in re.findall(r"<(?:input|select|textarea)\b[^>]*>", html):
            if 'type="hidden"' in field or "aria-label=" in field:
                continue
            found = re.search(r'\bid="([^"]+)"', field)
            assert found and found.group(1) in labelled, f"{path}: {field} has no label"


def test_login_without_the_forms_csrf_cookie_is_refused(console, db):
    token = make_token(db, "admin")
    person = Browserless(console)
    answer = person.post("/console/login", {"csrf": "guessed", "token": token})
    assert answer.status == 403 and "webhook_console" not in person.cookies
    assert query(db, "SELECT count(*) FROM webhooks.console_sessions") == [(0,)]


def test_every_page_carries_a_strict_csp_and_no_inline_script_or_style(console, db):
    delivery_id = dead_letter(db)
    person = logged_in(console, db, "admin")
    pages = ["/console/login", "/console/", "/console/dead-letters", "/console/endpoints",
             "/console/operations", f"/console/deliveries/{delivery_id}", "/console/deliveries/999999",
             "/console/nowhere", "/console/deliveries?status=dead_letter", "/console/endpoints/1",
             "/console/event-types", "/console/event-types/webhook.test", "/console/portal/" + "x" * 43]
    for path in pages:
        answer = person.get(path)
        assert answer.headers["content-security-policy"] == CONTENT_SECURITY_POLICY, path
        assert answer.headers["x-frame-options"] == "DENY"
        assert answer.headers["x-content-type-options"] == "nosniff"
        html = answer.body.decode()
        assert not re.search(r"<script(?![^>]*\bsrc=)", html), path  # every script is a file of the app
        assert " style=" not in html and "<style" not in html and " on" + "click=" not in html, path
    assert "script-src 'self'" in CONTENT_SECURITY_POLICY and "unsafe-inline" not in CONTENT_SECURITY_POLICY
    assert "default-src 'none'" in CONTENT_SECURITY_POLICY
    assert person.get("/console/static/console.js").status == 200


def test_a_post_without_the_csrf_token_is_refused_and_changes_nothing(console, db):
    delivery_id = dead_letter(db)
    person = logged_in(console, db, "admin")
    for form in ({"delivery_id": str(delivery_id)}, {"delivery_id": str(delivery_id), "csrf": "wrong"}):
        answer = person.post("/console/dead-letters/replay", form)
        assert answer.status == 403 and "csrf" in answer.body.decode()
        answer = person.post(f"/console/deliveries/{delivery_id}/replay", form)
        assert answer.status == 403
    assert query(db, "SELECT status, replays FROM webhooks.alert_delivery_queue") == [("dead_letter", 0)]
    # another session's token is no good either: the token is bound to the session
    other = logged_in(console, db, "admin")
    answer = person.post(f"/console/deliveries/{delivery_id}/replay", {"csrf": other.csrf()})
    assert answer.status == 403
    assert query(db, "SELECT status FROM webhooks.alert_delivery_queue") == [("dead_letter",)]


def test_a_reader_sees_no_forms_or_buttons_and_its_posts_are_refused(console, db):
    endpoint = add_endpoint(db, "http://127.0.0.1:9/hook", name="billing")
    delivery_id = dead_letter(db, endpoint)
    reader = logged_in(console, db, "reader")
    pages = ("/console/", "/console/dead-letters", "/console/endpoints", f"/console/deliveries/{delivery_id}")
    for path in pages:
        html = reader.get(path).body.decode()
        assert f"#{delivery_id}" in html or "billing" in html, path
        # the only form that posts is the logout button; the filter form only reads
        assert re.findall(r'<form[^>]*method="post"[^>]*action="([^"]+)"', html) == ["/console/logout"], path
        assert set(re.findall(r"<button[^>]*>([^<]*)</button>", html)) <= {"Log out", "Filter"}, path
        # no checkbox but the auto-refresh, which changes nothing but the page's own reloading
        checkboxes = re.findall(r'<input[^>]*type="checkbox"[^>]*>', html)
        assert all('id="auto-refresh"' in box for box in checkboxes), path
        assert 'name="reason"' not in html, path
    csrf = reader.csrf()
    answers = [reader.post(f"/console/deliveries/{delivery_id}/replay", {"csrf": csrf}),
               reader.post("/console/dead-letters/replay", {"csrf": csrf, "delivery_id": str(delivery_id)}),
               reader.post(f"/console/endpoints/{endpoint}",
                           {"csrf": csrf, "action": "disable", "reason": "x"})]
    assert [a.status for a in answers] == [403, 403, 403]
    assert "needs admin" in answers[0].body.decode()
    assert query(db, "SELECT status FROM webhooks.alert_delivery_queue") == [("dead_letter",)]
    assert query(db, "SELECT active FROM webhooks.endpoints") == [(True,)]


def test_a_session_ends_at_once_when_its_token_is_revoked_or_expires(console, db):
    person = logged_in(console, db, "admin", name="on-call")
    assert person.get("/console/").status == 200
    assert stored(db, token_store.revoke, "on-call")
    answer = person.get("/console/")
    assert answer.status == 303 and answer.headers["location"] == "/console/login?notice=session_ended"
    assert "webhook_console" not in person.cookies  # and the dead cookie is cleared
    # the login page says why the person is there
    said = person.get(answer.headers["location"]).body.decode()
    assert ('<p class="notice" role="status">Your session ended: it expired, or its token or link was'
            ' revoked.') in said

    other = logged_in(console, db, "reader", name="expiring")
    assert other.get("/console/endpoints").status == 200
    query(db, "UPDATE webhooks.api_tokens SET expires_at = now() - interval '1 second'"
              " WHERE name = 'expiring'")
    assert other.get("/console/endpoints").status == 303


def test_logout_ends_the_session(console, db):
    person = logged_in(console, db, "reader")
    stolen = dict(person.cookies)
    answer = person.post("/console/logout", {"csrf": person.csrf()})
    assert answer.status == 303 and "webhook_console" not in person.cookies
    replayed_cookie = Browserless(console)
    replayed_cookie.cookies = stolen
    assert replayed_cookie.get("/console/").status == 303
    assert query(db, "SELECT count(*) FROM webhooks.console_sessions") == [(0,)]


def test_replay_selected_dead_letters(console, db):
    first, second, untouched = dead_letter(db), dead_letter(db), dead_letter(db)
    person = logged_in(console, db, "admin")
    page = person.get("/console/dead-letters").body.decode()
    assert all(f'value="{d}"' in page for d in (first, second, untouched))
    answer = person.post("/console/dead-letters/replay",
                         [("csrf", person.csrf()), ("delivery_id", first), ("delivery_id", second)])
    assert answer.status == 303 and "notice=replayed" in answer.headers["location"]
    assert "2 dead letter(s) put back" in person.get(answer.headers["location"]).body.decode()
    rows = dict(query(db, "SELECT delivery_id, status FROM webhooks.alert_delivery_queue"))
    assert rows == {first: "pending", second: "pending", untouched: "dead_letter"}
    answer = person.post("/console/dead-letters/replay", {"csrf": person.csrf()})
    assert answer.status == 422 and "delivery_id: select at least one" in answer.body.decode()


def test_two_admins_replaying_the_same_row_at_once_replay_it_once(console, db):
    delivery_id = dead_letter(db)
    people = [logged_in(console, db, "admin") for _ in range(2)]
    forms = [{"csrf": p.csrf()} for p in people]
    start = threading.Barrier(2)
    answers = {}

    def replay(index: int) -> None:
        start.wait(10)
        answers[index] = people[index].post(f"/console/deliveries/{delivery_id}/replay", forms[index])

    threads = [threading.Thread(target=replay, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    notices = sorted(a.headers["location"].split("notice=")[1].split("&")[0] for a in answers.values())
    assert notices == ["not_replayed", "replayed"]
    assert query(db, "SELECT status, replays FROM webhooks.alert_delivery_queue") == [("pending", 1)]
    assert query(db, "SELECT count(*) FROM webhooks.alert_delivery_log WHERE outcome = 'replayed'") == [(1,)]


def test_endpoint_changes_call_the_sql_functions_and_record_the_reason(console, db):
    endpoint = add_endpoint(db, "http://127.0.0.1:9/hook", name="pager")
    person = logged_in(console, db, "admin", name="bob")

    def act(action: str, reason: str) -> int:
        answer = person.post(f"/console/endpoints/{endpoint}",
                             {"csrf": person.csrf(), "action": action, "reason": reason})
        return answer.status

    assert act("disable", "receiver migrating") == 303
    assert query(db, "SELECT active, disabled_reason FROM webhooks.endpoints") == [
        (False, "receiver migrating")]
    assert act("enable", "migration done") == 303
    assert act("open", "receiver asked us to hold") == 303
    assert query(db, "SELECT circuit_state FROM webhooks.webhook_health_metrics") == [("forced_open",)]
    assert act("reset", "receiver is back") == 303
    assert query(db, "SELECT circuit_state FROM webhooks.webhook_health_metrics") == [("closed",)]
    events = query(db, "SELECT change, reason, decided_by FROM webhooks.endpoint_events ORDER BY id")
    assert events == [
        ("disabled", "receiver migrating", "bob (console)"),
        ("enabled", "migration done", "bob (console)"),
        ("circuit_forced_open", "receiver asked us to hold", "bob (console)"),
        ("circuit_reset", "receiver is back", "bob (console)"),
    ]
    query(db, "SELECT webhooks.update_endpoint(%s, %s)",
          (endpoint, json.dumps({"description": "<b>on-call</b> pager"})))
    page = person.get("/console/endpoints").body.decode()
    assert "receiver asked us to hold" in page
    assert "&lt;b&gt;on-call&lt;/b&gt; pager" in page  # the description, as text
    answer = person.post(f"/console/endpoints/{endpoint}", {"csrf": person.csrf(), "action": "disable"})
    assert answer.status == 422 and "reason: say why" in answer.body.decode()
    answer = person.post(f"/console/endpoints/{endpoint}",
                         {"csrf": person.csrf(), "action": "explode", "reason": "x"})
    assert answer.status == 422 and "action: must be one of" in answer.body.decode()
    assert person.post("/console/endpoints/424242", {"csrf": person.csrf(), "action": "reset",
                                                      "reason": "x"}).status == 404


def test_the_overview_shows_queue_held_back_rows_endpoint_health_and_a_chart(console, db):
    endpoint = add_endpoint(db, "http://127.0.0.1:9/hook", name="slack")
    dead_letter(db, endpoint)
    enqueue(db, endpoint, count=2)
    query(db, "SELECT webhooks.disable_endpoint(%s, 'maintenance')", (endpoint,))
    query(db, "INSERT INTO webhooks.alert_delivery_log (delivery_id, webhook_id, attempt, outcome,"
              " failure_category, http_status) VALUES (1, %s, 1, 'dead_letter', 'http_5xx', 500)",
          (endpoint,))
    html = logged_in(console, db, "reader").get("/console/").body.decode()
    assert re.search(r"status-pending\">pending</span></td><td class=\"num\">2<", html)
    assert "endpoint disabled" in html  # held back, and why
    assert "slack" in html and "maintenance" in html
    assert "<svg" in html and 'class="failed"' in html and "1 failed" in html


def test_bad_input_gets_a_page_naming_the_field(console, db):
    person = logged_in(console, db, "reader")
    answer = person.get("/console/dead-letters?endpoint=abc")
    assert answer.status == 422 and "endpoint: no endpoint named &#34;abc&#34;" in answer.body.decode()
    answer = person.get("/console/deliveries/0")
    assert answer.status == 422 and "delivery_id" in answer.body.decode()
    # a name two tenants hold asks for its tenant; tenant/name finds it
    for tenant in ("acme", "globex"):
        query(db, "SELECT webhooks.register_tenant(%s)", (tenant,))
        add_endpoint(db, f"https://hooks.example.test/{tenant}", name="hook", tenant=tenant)
    answer = person.get("/console/dead-letters?endpoint=hook")
    assert answer.status == 422, answer.body
    assert "names an endpoint in more than one tenant (acme, globex): give its id or tenant/name" in \
        answer.body.decode().replace("&#39;", "'")
    assert person.get("/console/dead-letters?endpoint=acme/hook").status == 200


def test_the_session_functions_are_the_api_logins_alone(db):
    # the API's login calls them between requests, resting as webhooks_authenticator
    rows = query(db, "SELECT proname, prosecdef, proconfig FROM pg_proc"
                     " WHERE pronamespace = 'webhooks'::regnamespace AND proname LIKE 'console_%'")
    assert {r[0] for r in rows} == {"console_start_session", "console_session", "console_end_session",
                                    "console_open_portal_link"}
    for name, definer, settings in rows:
        assert definer and "search_path=pg_catalog, webhooks, pg_temp" in settings, name
    for group in ("webhooks_reader", "webhooks_producer", "webhooks_worker", "webhooks_admin",
                  "webhooks_authenticator"):
        allowed = query(db, "SELECT has_function_privilege(%s, 'webhooks.console_session(bytea)', 'EXECUTE'),"
                            " has_table_privilege(%s, 'webhooks.console_sessions', 'SELECT')", (group, group))
        assert allowed == [(group == "webhooks_authenticator", False)], group


def test_a_session_past_its_lifetime_ends(console, db):
    person = logged_in(console, db, "reader")
    query(db, "UPDATE webhooks.console_sessions SET expires_at = now() - interval '1 second'")
    assert person.get("/console/").status == 303
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="p_lifetime"):
        query(db, "SELECT * FROM webhooks.console_start_session(%s, %s, interval '8 days')",
              (b"x" * 32, b"y" * 32))


def test_the_delivery_page_names_the_digest_that_carried_each_attempt(console, db):
    ids, digest = delivered_in_a_digest(db, rows=4)
    html = logged_in(console, db, "reader").get(f"/console/deliveries/{ids[0]}").body.decode()
    assert re.search(rf'<td class="digest">d-{digest} <span class="muted">\(4 rows\)</span></td>', html), html


def test_dead_letters_are_listed_in_one_order_by_the_api_the_cli_and_the_console(console, db):
    endpoint = add_endpoint(db, "http://127.0.0.1:9/hook")
    ids = [dead_letter(db, endpoint) for _ in range(3)]
    # dead-lettered in the order 2, 0, 1: the order of ids is not the order of the list
    for minutes, delivery_id in zip((20, 10, 30), ids, strict=True):
        query(db, "UPDATE webhooks.alert_delivery_queue"
                  " SET dead_lettered_at = now() - make_interval(mins => %s) WHERE delivery_id = %s",
              (minutes, delivery_id))
    oldest_first = [ids[2], ids[0], ids[1]]
    token = make_token(db, "reader")
    api = console.get("/v1/dead-letters", token).json["items"]
    assert [row["delivery_id"] for row in api] == oldest_first
    listed = cli("dlq", "list", "--json", env={"DATABASE_URL": db})
    assert [row["delivery_id"] for row in json.loads(listed.stdout)] == oldest_first
    page = logged_in(console, db, "reader").get("/console/dead-letters").body.decode()
    shown = [int(n) for n in re.findall(r'href="/console/deliveries/(\d+)"', page)]
    assert list(dict.fromkeys(shown)) == oldest_first


def test_a_running_bulk_replay_is_cancelled_from_the_console_by_an_admin_only(console, db):
    # The API's own runner steps every running operation (and ends one with nothing to replay at
    # once), so this one starts with its first step an hour away, in the same transaction.
    with psycopg.connect(db) as conn:
        [(running,)] = conn.execute(
            "SELECT webhooks.api_start_replay('{}', 0.01, NULL, 'api:ops')").fetchall()
        conn.execute("UPDATE webhooks.api_operations SET next_step_at = now() + interval '1 hour'"
                     " WHERE id = %s", (running,))
    [(done,)] = query(db, "SELECT webhooks.api_start_replay('{}', NULL, NULL, 'api:ops')")
    query(db, "SELECT webhooks.api_replay_step(%s, 10)", (done,))  # nothing to replay: done
    reader = logged_in(console, db, "reader")
    page = reader.get("/console/operations").body.decode()
    assert f"<td>{running}</td>" in page and "Cancel</button>" not in page
    assert reader.post(f"/console/operations/{running}/cancel", {"csrf": reader.csrf()}).status == 403
    admin = logged_in(console, db, "admin", name="alice")
    page = admin.get("/console/operations").body.decode()
    assert page.count("Cancel</button>") == 1  # the running one only
    answer = admin.post(f"/console/operations/{running}/cancel", {"csrf": admin.csrf()})
    assert answer.status == 303 and "notice=operation_cancelled" in answer.headers["location"]
    cancelled = query(db, "SELECT status, cancelled_by FROM webhooks.api_operations WHERE id = %s",
                      (running,))
    assert cancelled == [("cancelled", "alice (console)")]
    again = admin.post(f"/console/operations/{done}/cancel", {"csrf": admin.csrf()})
    assert again.status == 303 and "notice=operation_finished" in again.headers["location"]
    assert admin.post("/console/operations/999999/cancel", {"csrf": admin.csrf()}).status == 404


def test_the_dead_letter_filter_takes_an_endpoint_name_and_bulk_replay_keeps_the_filter(console, db):
    failing = add_endpoint(db, "http://127.0.0.1:9/hook", name="failing")
    other = add_endpoint(db, "http://127.0.0.1:9/other", name="other")
    mine, theirs = dead_letter(db, failing), dead_letter(db, other)
    person = logged_in(console, db, "admin")
    for ref in (str(failing), "failing"):
        page = person.get(f"/console/dead-letters?endpoint={ref}&category=http_5xx")
        assert page.status == 200, page.body
        shown = set(re.findall(r'href="/console/deliveries/(\d+)"', page.body.decode()))
        assert shown == {str(mine)}, ref
    html = page.body.decode()
    assert '<option value="failing" selected>failing</option>' in html
    answer = person.post("/console/dead-letters/replay", [
        ("csrf", person.csrf()), ("delivery_id", mine), *re.findall(r'<input type="hidden" name="(endpoint|'
                                                                    r'category)" value="([^"]*)">', html)])
    assert answer.status == 303
    assert answer.headers["location"].startswith("/console/dead-letters?endpoint=failing&category=http_5xx&")
    assert dict(query(db, "SELECT delivery_id, status FROM webhooks.alert_delivery_queue")) == {
        mine: "pending", theirs: "dead_letter"}


def test_failure_categories_are_choices_from_the_one_list(console, db):
    html = logged_in(console, db, "reader").get("/console/dead-letters?category=timeout").body.decode()
    select = re.search(r'<select id="f-category" name="category">(.*?)</select>', html, re.S)
    assert select, html
    assert re.findall(r'<option value="([^"]*)"', select.group(1)) == ["", *CATEGORIES]
    assert '<option value="timeout" selected>' in select.group(1)
    assert '<input id="f-category"' not in html


def test_circuit_and_enable_reasons_show_under_reason_and_long_ones_wrap(console, db):
    endpoint = add_endpoint(db, "http://127.0.0.1:9/hook", name="pager")
    person = logged_in(console, db, "admin", name="bob")
    long_reason = "the receiving team asked us to hold " + "x" * 570  # 606 characters: the API takes it
    for action, reason in (("open", long_reason), ("reset", "receiver is back")):
        answer = person.post(f"/console/endpoints/{endpoint}",
                             {"csrf": person.csrf(), "action": action, "reason": reason})
        assert answer.status == 303, answer.body
    html = person.get("/console/endpoints").body.decode()
    assert f'<td class="reason">{long_reason}</td><td>bob (console)</td>' in html
    assert '<td class="reason">receiver is back</td><td>bob (console)</td>' in html
    css = console_css()
    assert re.search(r"^\.reason, \.description, dd \{ overflow-wrap: anywhere; \}$", css, re.M)


def console_css() -> str:
    return (ROOT / "worker/console/static/console.css").read_text()


def test_endpoint_names_link_to_the_endpoint_page_everywhere(console, db):
    endpoint = add_endpoint(db, "http://127.0.0.1:9/hook", name="billing")
    delivery_id = dead_letter(db, endpoint)
    query(db, "SELECT webhooks.disable_endpoint(%s, 'maintenance')", (endpoint,))
    person = logged_in(console, db, "reader")
    link = f'<a href="/console/endpoints/{endpoint}">billing</a>'
    for path in ("/console/", "/console/endpoints", "/console/dead-letters",
                 f"/console/deliveries/{delivery_id}", "/console/deliveries?endpoint=billing"):
        assert link in person.get(path).body.decode(), path
    page = person.get(f"/console/endpoints/{endpoint}").body.decode()
    assert "<h1>Endpoint billing" in page and "127.0.0.1:9" in page
    assert f'href="/console/deliveries/{delivery_id}"' in page  # its latest deliveries
    assert "maintenance" in page  # its changes, and why
    assert re.search(r'circuit-closed">closed', page)
    assert person.get("/console/endpoints/999999").status == 404


def test_delivery_search_finds_any_status_by_id_key_type_status_endpoint_and_time(console, db):
    hook = add_endpoint(db, "http://127.0.0.1:9/hook", name="hook")
    other = add_endpoint(db, "http://127.0.0.1:9/other", name="other")
    [pending] = enqueue(db, hook, {"n": 1}, event_type="order.created")
    [retrying] = enqueue(db, hook, {"n": 2}, event_type="order.paid")
    query(db, "UPDATE webhooks.alert_delivery_queue SET status = 'retrying', attempts = 1,"
              " next_retry_at = now() + interval '1 hour' WHERE delivery_id = %s", (retrying,))
    [elsewhere] = enqueue(db, other, {"n": 3}, event_type="order.created")
    [(key,)] = query(db, "SELECT idempotency_key FROM webhooks.alert_delivery_queue WHERE delivery_id = %s",
                     (retrying,))
    person = logged_in(console, db, "reader")

    def found(search: str) -> list[int]:
        answer = person.get("/console/deliveries?" + search)
        assert answer.status == 200, (search, answer.body)
        return [int(n) for n in re.findall(r'<tr id="delivery-(\d+)">', answer.body.decode())]

    assert found("") == []  # nothing asked, nothing listed
    assert found(f"id={pending}") == [pending]
    assert found(f"key={key}") == [retrying]
    assert found("event_type=order.created") == [elsewhere, pending]
    assert found("status=retrying") == [retrying]
    assert found("endpoint=hook") == [retrying, pending]
    assert found("endpoint=hook&status=pending") == [pending]
    assert found("since=2000-01-01T00:00&until=2100-01-01T00:00") == [elsewhere, retrying, pending]
    assert found("until=2000-01-01T00:00") == []
    for bad, said in (("status=lost", "status: must be one of"),
                      ("since=yesterday", "since: expected a time such as 2026-11-27T04:00, not "
                                          "&#34;yesterday&#34;"),
                      ("id=x", "id: must be a positive whole number, not &#34;x&#34;"),
                      ("endpoint=nosuch", "endpoint: no endpoint")):
        answer = person.get("/console/deliveries?" + bad)
        assert answer.status == 422 and said in answer.body.decode(), bad


def test_replaying_every_match_starts_a_bulk_operation_with_the_pages_filter(console, db):
    failing = add_endpoint(db, "http://127.0.0.1:9/hook", name="failing")
    other = add_endpoint(db, "http://127.0.0.1:9/other", name="other")
    mine = [dead_letter(db, failing) for _ in range(3)]
    theirs = dead_letter(db, other)
    person = logged_in(console, db, "admin", name="alice")
    html = person.get("/console/dead-letters?endpoint=failing&category=http_5xx").body.decode()
    form = html[html.index('action="/console/dead-letters/replay-matching"'):]
    form = form[:form.index("</form>")]
    kept = re.findall(r'<input type="hidden" name="(endpoint|category)" value="([^"]*)">', form)
    assert kept == [("endpoint", "failing"), ("category", "http_5xx")]
    answer = person.post("/console/dead-letters/replay-matching", [("csrf", person.csrf()), *kept])
    assert answer.status == 303 and "notice=operation_started" in answer.headers["location"], answer.body
    [(operation, stored, by)] = query(db, "SELECT id, filter, requested_by FROM webhooks.api_operations")
    assert stored == {"webhook_id": failing, "category": "http_5xx"} and by == "alice (console)"
    eventually(lambda: query(db, "SELECT status FROM webhooks.api_operations") == [("done",)],
               message="the operation ran")
    rows = dict(query(db, "SELECT delivery_id, status FROM webhooks.alert_delivery_queue"))
    assert rows == {**{d: "pending" for d in mine}, theirs: "dead_letter"}
    page = person.get("/console/operations").body.decode()
    assert f"<td>{operation}</td>" in page and "category=http_5xx" in page
    # the filter names the endpoint, linked to its page, not its id; one the page cannot name, by its id
    assert f'endpoint=<a href="/console/endpoints/{failing}">failing</a>' in page
    assert "webhook_id=" not in page
    query(db, "SELECT webhooks.api_start_replay('{\"webhook_id\": 999999}', NULL, NULL, 'api:ops')")
    assert "endpoint=#999999" in person.get("/console/operations").body.decode()
