"""Portal links: a one-time URL, made by the CLI or an admin over the API, opens a console
session as one tenant's administrator; the link works once and expires, and the session ends with it."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest

from tests.acceptance.test_cli import cli
from tests.api import test_tenant_isolation as isolation
from tests.api.console_client import Browserless, ConsoleServer, hidden
from tests.api.server import Answer, ApiServer, api_config, make_token
from tests.support import query
from worker.rules import portal


@pytest.fixture
def two_tenants(db, receiver):
    return isolation.make_two_tenants(db, receiver)


@pytest.fixture
def console(db: str) -> Iterator[ConsoleServer]:
    server = ConsoleServer(api_config(db)).start()
    yield server
    server.stop()


def portal_link(db: str, tenant: str, *args: str) -> str:
    """A link from `webhook-worker tokens portal-link`, as an application's operator makes one."""
    made = cli("tokens", "portal-link", "--tenant", tenant, "--base-url", "http://console.test", *args,
               env={"DATABASE_URL": db})
    assert made.returncode == 0, made.stderr
    return made.stdout.strip()


def open_link(person: Browserless, url: str) -> Answer:
    """What a person's browser does with a link: show its page, then press its button."""
    page = person.get(urlsplit(url).path)
    assert page.status == 200, page.body
    return person.post("/console/portal", {"csrf": hidden(page, "csrf"), "link": hidden(page, "link")})


def test_a_portal_link_opens_a_session_as_its_tenants_administrator_once(console, db, two_tenants):
    url = portal_link(db, "globex")
    assert url.startswith("http://console.test/console/portal/")
    secret = url.rsplit("/", 1)[1]
    assert portal.well_formed(secret)
    stored = str(query(db, "SELECT * FROM webhooks.portal_links"))
    stored += str(query(db, "SELECT * FROM webhooks.api_tokens"))
    assert secret not in stored  # only its hash
    person = Browserless(console)
    # showing the link's page uses nothing up (a chat's link preview fetches it too)
    assert person.get(urlsplit(url).path).status == 200
    answer = open_link(person, url)
    assert answer.status == 303 and answer.headers["location"] == "/console/", answer.body
    home = person.get("/console/endpoints").body.decode()
    assert re.search(r'id="tenant">Tenant <strong>globex</strong>', home), home
    assert "tenant_admin" in home and "other-hook" in home and "acme-orders" not in home
    # the second opening, by anyone, is refused and opens nothing
    again = open_link(Browserless(console), url)
    assert again.status == 401 and "used already, expired, or was revoked" in again.body.decode()
    assert query(db, "SELECT count(*) FROM webhooks.console_sessions") == [(1,)]
    assert query(db, "SELECT t.role, n.name FROM webhooks.api_tokens t JOIN webhooks.tenants n"
                     " ON n.id = t.tenant_id") == [("tenant_admin", "globex")]


def test_the_session_ends_when_the_link_expires_or_its_token_is_revoked(console, db, two_tenants):
    person = Browserless(console)
    assert open_link(person, portal_link(db, "globex", "--expires-in", "30m")).status == 303
    [(lasts,)] = query(db, "SELECT s.expires_at - s.created_at FROM webhooks.console_sessions s")
    assert lasts.total_seconds() == pytest.approx(1800, abs=5)  # the link's lifetime, not 12 h
    assert person.get("/console/").status == 200
    query(db, "UPDATE webhooks.api_tokens SET expires_at = now() - interval '1 second'")
    ended = person.get("/console/")
    assert ended.status == 303
    assert ended.headers["location"] == "/console/portal-ended?notice=portal_session_ended"
    assert "Your session ended" in person.get(ended.headers["location"]).body.decode()

    other = Browserless(console)
    made = json.loads(cli("tokens", "portal-link", "--tenant", "globex", "--json",
                          env={"DATABASE_URL": db}).stdout)
    assert open_link(other, made["url"]).status == 303
    assert other.get("/console/").status == 200
    assert cli("tokens", "revoke", made["token_name"], env={"DATABASE_URL": db}).returncode == 0
    assert other.get("/console/").status == 303


def test_a_customer_whose_session_ended_is_shown_a_page_for_customers_not_the_operators_login(
        console, db, two_tenants):
    def ended_page(person: Browserless, answer: Answer, notice: str) -> str:
        assert answer.status == 303, answer.body
        assert answer.headers["location"] == f"/console/portal-ended?notice={notice}"
        page = person.get(answer.headers["location"])
        assert page.status == 200
        text = page.body.decode()
        assert "ask the service that sent you the link for a new one" in text
        assert "Paste an API token" not in text and 'name="token"' not in text
        return text

    # logging out
    person = Browserless(console)
    assert open_link(person, portal_link(db, "globex")).status == 303
    home = person.get("/console/")
    logged_out = person.post("/console/logout", {"csrf": hidden(home, "csrf")})
    assert "You are logged out." in ended_page(person, logged_out, "portal_logged_out")
    # and later visits land there too, not on the login page
    assert person.get("/console/").headers["location"] == "/console/portal-ended"

    # the link expiring, or its token revoked
    for end in ("UPDATE webhooks.api_tokens SET expires_at = now() - interval '1 second'"
                " WHERE name LIKE 'portal:%%' AND revoked_at IS NULL",
                "UPDATE webhooks.api_tokens SET revoked_at = now() WHERE name LIKE 'portal:%%'"):
        person = Browserless(console)
        assert open_link(person, portal_link(db, "globex")).status == 303
        assert person.get("/console/").status == 200
        query(db, end)
        text = ended_page(person, person.get("/console/endpoints"), "portal_session_ended")
        assert "the link that opened it expired or was revoked" in text

    # an operator who logs in with a token in that browser is an operator again
    login = person.get("/console/login")
    admin = make_token(db, "admin")
    assert person.post("/console/login", {"csrf": hidden(login, "csrf"), "token": admin}).status == 303
    assert person.post("/console/logout", {"csrf": hidden(person.get("/console/"), "csrf")}
                       ).headers["location"] == "/console/login?notice=logged_out"


def test_an_expired_link_opens_nothing(console, db, two_tenants):
    url = portal_link(db, "globex")
    query(db, "UPDATE webhooks.portal_links SET expires_at = now() - interval '1 second'")
    answer = open_link(Browserless(console), url)
    assert answer.status == 401
    assert query(db, "SELECT count(*) FROM webhooks.console_sessions") == [(0,)]


def test_a_link_needs_the_forms_cookie_and_wrong_links_count_as_failed_logins(db, two_tenants):
    server = ConsoleServer(api_config(db, failed_auth_per_minute=2)).start()
    try:
        url = portal_link(db, "globex")
        person = Browserless(server)
        page = person.get(urlsplit(url).path)
        link = hidden(page, "link")
        forged = Browserless(server).post("/console/portal", {"csrf": "guessed", "link": link})
        assert forged.status == 403
        for wrong in ("x", portal.new_secret()):
            assert Browserless(server).post("/console/portal", {"csrf": "", "link": wrong}).status == 403
            answer = person.post("/console/portal", {"csrf": hidden(page, "csrf"), "link": wrong})
            assert answer.status == 401, answer.body
        locked = person.post("/console/portal", {"csrf": hidden(page, "csrf"), "link": portal.new_secret()})
        assert locked.status == 429 and int(locked.headers["retry-after"]) >= 1
        # the lockout limits failures, never a good link
        assert open_link(person, url).status == 303
    finally:
        server.stop()


def test_portal_link_bad_input_is_refused_naming_the_option(db, two_tenants):
    env = {"DATABASE_URL": db}
    missing = cli("tokens", "portal-link", "--tenant", "nobody", env=env)
    assert missing.returncode == 1 and "--tenant: no tenant named 'nobody'" in missing.stderr
    for args, said in ((["--tenant", "globex", "--expires-in", "2d"], "--expires-in: must be more than 0"),
                       (["--tenant", "globex", "--expires-in", "soon"], "--expires-in: expected a duration"),
                       (["--tenant", "globex", "--base-url", "console.test"], "--base-url: expected http")):
        refused = cli("tokens", "portal-link", *args, env=env)
        assert refused.returncode == 2 and said in refused.stderr, (args, refused.stderr)
    assert query(db, "SELECT count(*) FROM webhooks.portal_links") == [(0,)]


def test_an_admin_makes_a_portal_link_over_the_api(console, db, two_tenants):
    admin = make_token(db, "admin")
    made = console.post("/v1/tenants/globex/portal-link", admin, {"expires_in_seconds": 600})
    assert made.status == 201, made.body
    assert made.json["url"].startswith(f"http://127.0.0.1:{console.port}/console/portal/")
    assert made.json["tenant"] == "globex" and made.json["token_name"].startswith("portal:globex:")
    by_id = console.post(f"/v1/tenants/{two_tenants['other']}/portal-link", admin)
    assert by_id.status == 201 and by_id.json["tenant"] == "globex"
    assert console.post("/v1/tenants/nobody/portal-link", admin).status == 404
    too_long = console.post("/v1/tenants/globex/portal-link", admin, {"expires_in_seconds": 86401})
    assert too_long.status == 422 and too_long.json["field"] == "expires_in_seconds"
    assert console.post("/v1/tenants/globex/portal-link", make_token(db, "reader")).status == 403
    person = Browserless(console)
    assert open_link(person, made.json["url"]).status == 303
    assert "globex" in person.get("/console/").body.decode()
    assert console.contract_problems() == []


FORGED = {"Host": "evil.example.com", "X-Forwarded-Proto": "https", "X-Forwarded-Host": "evil.example.com"}


def test_a_link_never_takes_its_host_from_a_request_anyone_can_send(db, two_tenants):
    """Without api.public_url and without a trusted proxy in front, a link points at the address the
    request arrived at, and says so; with it, at the public URL; behind a trusted proxy, where the
    proxy says the client came, when that is a host."""
    admin = make_token(db, "admin")
    for config, expected, warned in (
            ({}, "http://127.0.0.1:{port}", True),
            ({"public_url": "https://webhooks.example.com/"}, "https://webhooks.example.com", False),
            ({"trusted_proxies": ["127.0.0.1/32"]}, "https://evil.example.com", False)):
        server = ApiServer(api_config(db, **config)).start()
        try:
            made = server.post("/v1/tenants/globex/portal-link", admin, headers=FORGED)
            assert made.status == 201, made.body
            origin = expected.format(port=server.port)
            assert made.json["url"].startswith(f"{origin}/console/portal/"), (config, made.json["url"])
            assert (made.json["warning"] is not None) == warned, made.json
            if warned:
                assert "api.public_url" in made.json["warning"]
            if config.get("trusted_proxies"):
                # what a trusted proxy says is used only when it is a host
                odd = server.post("/v1/tenants/globex/portal-link", admin,
                                  headers={**FORGED, "X-Forwarded-Host": "evil.example.com/x?"})
                assert odd.json["url"].startswith(f"http://127.0.0.1:{server.port}/console/portal/")
            assert server.contract_problems() == []
        finally:
            server.stop()


def test_the_cli_says_where_a_link_points_without_a_public_url(db, two_tenants):
    env = {"DATABASE_URL": db}
    made = cli("tokens", "portal-link", "--tenant", "globex", env=env)
    assert made.returncode == 0, made.stderr
    assert made.stdout.startswith("http://127.0.0.1:8000/console/portal/")
    assert ("warning: the link points at http://127.0.0.1:8000 (api.host and api.port): set api.public_url"
            in made.stderr)
    made = cli("tokens", "portal-link", "--tenant", "globex",
               env={**env, "WEBHOOK_WORKER_API__PUBLIC_URL": "https://webhooks.example.com"})
    assert made.returncode == 0, made.stderr
    assert made.stdout.startswith("https://webhooks.example.com/console/portal/")
    assert "warning" not in made.stderr
    bad = cli("tokens", "portal-link", "--tenant", "globex",
              env={**env, "WEBHOOK_WORKER_API__PUBLIC_URL": "https://webhooks.example.com/console?x=1"})
    assert bad.returncode == 2 and "api.public_url: only the scheme, host and port" in bad.stderr


def tenant_admin(console: ConsoleServer, db: str, tenant: str) -> Browserless:
    person = Browserless(console)
    assert open_link(person, portal_link(db, tenant)).status == 303
    return person


def test_a_tenant_administrator_manages_its_own_endpoints_from_the_console(
        console, db, two_tenants, receiver):
    person = tenant_admin(console, db, "globex")
    added = person.post("/console/endpoints/new", {
        "csrf": person.csrf(), "name": "globex-orders", "url": receiver.url("/globex"),
        "event_types": "order.created, order.paid", "body_format": "raw"})
    assert added.status == 303, added.body
    [(endpoint, tenant, types)] = query(
        db, "SELECT e.id, t.name, e.event_types FROM webhooks.endpoints e"
            " JOIN webhooks.tenants t ON t.id = e.tenant_id WHERE e.name = 'globex-orders'")
    assert (tenant, types) == ("globex", ["order.created", "order.paid"])
    assert added.headers["location"].startswith(f"/console/endpoints/{endpoint}?notice=endpoint_added")
    page = person.get(f"/console/endpoints/{endpoint}").body.decode()
    assert "order.created, order.paid" in page and "Send a test event" in page

    edited = person.post(f"/console/endpoints/{endpoint}/edit", {"csrf": person.csrf(), "event_types": "*",
                                                                  "description": "our orders"})
    assert edited.status == 303, edited.body
    changed = query(db, "SELECT event_types, description FROM webhooks.endpoints WHERE id = %s", (endpoint,))
    assert changed == [(["*"], "our orders")]
    bad = person.post(f"/console/endpoints/{endpoint}/edit", {"csrf": person.csrf(), "body_format": "morse"})
    assert bad.status == 422 and "body_format" in bad.body.decode()

    revealed = person.post(f"/console/endpoints/{endpoint}/secret", {"csrf": person.csrf()}).body.decode()
    assert len(re.findall(r'<code class="secret">whsec_[^<]+</code>', revealed)) == 1
    assert person.post(f"/console/endpoints/{endpoint}/rotate-secret", {"csrf": person.csrf()}).status == 303
    revealed = person.post(f"/console/endpoints/{endpoint}/secret", {"csrf": person.csrf()}).body.decode()
    # the old one still signs
    assert len(re.findall(r'<code class="secret">whsec_[^<]+</code>', revealed)) == 2

    sent = person.post(f"/console/endpoints/{endpoint}/test", {"csrf": person.csrf()})
    assert sent.status == 303 and "notice=test_sent" in sent.headers["location"]
    [(delivery_id, event_type)] = query(
        db, "SELECT delivery_id, event_type FROM webhooks.alert_delivery_queue WHERE webhook_id = %s",
        (endpoint,))
    assert event_type == "webhook.test"
    assert sent.headers["location"].startswith(f"/console/deliveries/{delivery_id}?")
    assert person.get(f"/console/deliveries/{delivery_id}").status == 200


def test_a_tenant_administrator_sees_and_changes_nothing_of_another_tenant(console, db, two_tenants):
    w = two_tenants
    theirs_dead = isolation.dead_letter(db, w["theirs"], reason="http 400 globex-reason")
    person = tenant_admin(console, db, "globex")
    before = isolation.snapshot(db)
    acme = w["endpoint"]
    for path in ("/console/", "/console/endpoints", "/console/dead-letters", "/console/operations",
                 f"/console/endpoints/{w['theirs']}"):
        answer = person.get(path)
        assert answer.status == 200 and b"acme" not in answer.body, path
    assert person.get(f"/console/endpoints/{acme}").status == 404
    assert person.get(f"/console/deliveries/{w['dead']}").status == 404
    csrf = person.csrf()
    for path, form in ((f"/console/endpoints/{acme}/edit", {"event_types": "*"}),
                       (f"/console/endpoints/{acme}/rotate-secret", {}),
                       (f"/console/endpoints/{acme}/secret", {}),
                       (f"/console/endpoints/{acme}/test", {}),
                       (f"/console/endpoints/{acme}", {"action": "enable", "reason": "mine now"})):
        answer = person.post(path, {"csrf": csrf, **form})
        assert answer.status == 404 and b"whsec_" not in answer.body, path
    replayed = person.post("/console/dead-letters/replay", {"csrf": csrf, "delivery_id": str(w["dead"])})
    assert "notice=not_replayed" in replayed.headers["location"]
    again = person.post(f"/console/deliveries/{w['dead']}/replay", {"csrf": csrf})
    assert again.headers["location"].endswith("notice=not_replayed&n=0")
    assert isolation.snapshot(db) == before  # nothing of acme's changed
    # its own dead letter it replays
    mine = person.post(f"/console/deliveries/{theirs_dead}/replay", {"csrf": csrf})
    assert "notice=replayed" in mine.headers["location"]
    assert query(db, "SELECT status FROM webhooks.alert_delivery_queue WHERE delivery_id = %s",
                 (theirs_dead,)) == [("pending",)]
