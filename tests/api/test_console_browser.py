"""The console in a real browser (Debian's chromium driven by Playwright) against a real worker and
receiver: a delivery dead-letters, the receiver recovers, a person logs in, finds it, replays it and
watches it become delivered."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from axe_playwright_python.base import AXE_SCRIPT
from playwright.sync_api import Page, sync_playwright

from tests.acceptance.test_cli import cli
from tests.api.console_client import ConsoleServer
from tests.api.server import api_config, make_token
from tests.receiver import Reply
from tests.support import HANG_SECONDS, add_endpoint, enqueue, eventually, query, statuses
from worker.rules import signing

# Playwright's own browser download is not used: the system's chromium (scripts/bootstrap.sh installs it).
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
# Set to a directory (docs/) to keep the screenshots README shows.
SCREENSHOTS_ENV = "WEBHOOK_CONSOLE_SCREENSHOTS"
# a hang guard for each page wait: a browser on a loaded machine is slow, not broken
WAIT_MS = int(HANG_SECONDS * 1000)


@pytest.fixture
def console(db: str) -> Iterator[ConsoleServer]:
    server = ConsoleServer(api_config(db)).start()
    yield server
    server.stop()


@contextlib.contextmanager
def browser_page() -> Iterator[tuple[Page, list[str]]]:
    """A page in chromium, 1280 px wide, and the script errors and CSP refusals it reports."""
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            page.set_default_timeout(WAIT_MS)
            problems: list[str] = []
            page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: problems.append(str(e)))
            yield page, problems
        finally:
            browser.close()


def watch_until_settled(page: Page) -> None:
    """Turn on a delivery page's auto-refresh (off by default), unless the row has settled already
    (then the page has no such control)."""
    box = page.get_by_label("Refresh every 2 s until it is delivered or a dead letter")
    if box.count():
        box.check()


def screenshot(page: Page, tmp_path: Path, name: str) -> None:
    page.screenshot(path=str(tmp_path / name), full_page=True)
    keep = os.environ.get(SCREENSHOTS_ENV)
    if keep:
        shutil.copy(tmp_path / name, Path(keep) / name)


def test_a_person_logs_in_finds_a_dead_letter_replays_it_and_sees_it_delivered(
        db, receiver, spawn, console, tmp_path):
    assert Path(CHROMIUM).exists(), "chromium is needed for this test: scripts/bootstrap.sh installs it"
    receiver.script("/hook", Reply(503, body=b"upstream database is down"))
    endpoint = add_endpoint(db, receiver.url("/hook"), name="pagerduty", max_attempts=1)
    other = add_endpoint(db, receiver.url("/other"), name="slack")
    worker = spawn(db)
    [delivery_id] = enqueue(db, endpoint, {"alert": "disk full", "host": "db-1"}, event_type="alert.created")
    enqueue(db, other, {"alert": "cpu high"}, count=3)
    eventually(lambda: statuses(db, [delivery_id]) == {delivery_id: "dead_letter"}, message="dead letter")
    receiver.script("/hook", Reply(200, body=b"accepted"))  # the receiver is fixed
    token = make_token(db, "admin", name="on-call")
    base = f"http://127.0.0.1:{console.port}/console"

    with browser_page() as (page, problems):

        page.goto(base + "/")
        assert page.url == base + "/login"  # no session yet
        # by keyboard: the token field has the focus, Enter submits
        page.keyboard.type(token)
        page.keyboard.press("Enter")
        page.wait_for_url(base + "/")
        assert page.get_by_role("heading", name="Overview").is_visible()
        assert page.locator(f"#endpoint-{endpoint}").get_by_text("http_5xx").is_visible()
        screenshot(page, tmp_path, "console-overview.png")

        page.get_by_role("link", name="Dead letters").click()
        page.get_by_label("Endpoint").select_option(label="pagerduty")
        page.get_by_role("button", name="Filter").click()
        row = page.locator(f"#dead-letter-{delivery_id}")
        row.wait_for()
        assert "http_5xx" in row.inner_text() and "503" in row.inner_text()
        screenshot(page, tmp_path, "console-dead-letters.png")

        row.get_by_role("link", name=f"#{delivery_id}").click()
        page.wait_for_url(f"{base}/deliveries/{delivery_id}")
        history = page.locator("table.history").inner_text()
        assert "http_5xx" in history and "503" in history and "upstream database is down" in history
        assert '"host": "db-1"' in page.locator("pre.payload").inner_text()
        assert page.locator("#status").get_attribute("data-status") == "dead_letter"

        page.get_by_role("button", name="Replay this delivery").focus()
        page.keyboard.press("Enter")  # forms work from the keyboard
        page.wait_for_url("**notice=replayed**")
        # the person turns on the page's auto-refresh (off by default) and watches the row settle
        watch_until_settled(page)
        page.wait_for_selector('#status[data-status="delivered"]', timeout=WAIT_MS)
        assert page.get_by_role("status").inner_text() == "1 dead letter(s) put back in the queue."
        history = page.locator("table.history").inner_text()
        assert "replayed" in history and "delivered" in history
        screenshot(page, tmp_path, "console-delivery.png")

        # a reason as long as the API takes, without a space: it wraps, the page stays as wide
        query(db, "SELECT webhooks.set_circuit(%s, 'reset', NULL, 'on-call', repeat('x', 600))", (other,))
        page.get_by_role("link", name="Endpoints").click()
        assert page.get_by_text("x" * 600).is_visible()
        assert page.evaluate("document.documentElement.scrollWidth") <= 1280
        screenshot(page, tmp_path, "console-endpoints.png")
        assert problems == [], problems  # nothing the CSP blocked, no script error

    assert statuses(db, [delivery_id]) == {delivery_id: "delivered"}
    sent = receiver.to("/hook")
    assert len(sent) == 2 and sent[0].headers["webhook-id"] == sent[1].headers["webhook-id"]
    worker.stop()


def test_a_customer_opens_a_portal_link_manages_its_webhooks_and_sees_nothing_of_another_tenant(
        db, receiver, spawn, console, tmp_path):
    """End to end: the portal link opened in chromium lets a tenant's customer add an
    endpoint, send a test event, see it delivered, reveal the secret and verify the test event's
    signature with it, replay a dead letter; another tenant's endpoint is neither shown nor reachable."""
    assert Path(CHROMIUM).exists(), "chromium is needed for this test: scripts/bootstrap.sh installs it"
    # both granted loopback, where the test's receivers stand in for their public receivers
    grant = '{"allow_networks": ["127.0.0.1/32"]}'
    acme = query(db, "SELECT webhooks.register_tenant('acme', %s)", (grant,))[0][0]
    globex = query(db, "SELECT webhooks.register_tenant('globex', %s)", (grant,))[0][0]
    theirs = add_endpoint(db, receiver.url("/acme"), name="acme-orders", max_attempts=1)
    mine = add_endpoint(db, receiver.url("/old"), name="globex-old", max_attempts=1)
    query(db, "UPDATE webhooks.endpoints SET tenant_id = CASE id WHEN %s THEN %s ELSE %s END"
              " WHERE id IN (%s, %s)", (theirs, acme, globex, theirs, mine))
    receiver.script("/old", Reply(503, body=b"down for maintenance"))
    receiver.script("/acme", Reply(400, body=b"acme refuses"))
    worker = spawn(db)
    [dead] = enqueue(db, mine, {"order": 7}, event_type="order.created")
    [acme_dead] = enqueue(db, theirs, {"order": 8}, event_type="order.created")
    eventually(lambda: statuses(db, [dead, acme_dead]) == {dead: "dead_letter", acme_dead: "dead_letter"},
               message="dead letters")
    receiver.script("/old", Reply(200, body=b"ok"))  # the customer's old receiver is back
    made = cli("tokens", "portal-link", "--tenant", "globex", "--base-url", f"http://127.0.0.1:{console.port}",
               env={"DATABASE_URL": db})
    assert made.returncode == 0, made.stderr
    link = made.stdout.strip()
    base = f"http://127.0.0.1:{console.port}/console"

    with browser_page() as (page, problems):

        page.goto(link)
        page.get_by_role("button", name="Open the console").click()
        page.wait_for_url(base + "/")
        assert page.locator("#tenant").inner_text() == "Tenant globex"
        assert "acme" not in page.content()

        page.get_by_role("link", name="Endpoints", exact=True).click()
        page.get_by_label("Name").fill("customer-hook")
        page.get_by_label("URL").fill(receiver.url("/customer"))
        page.get_by_label("Event types").fill("*")
        page.get_by_label("Format").select_option("raw")
        page.get_by_role("button", name="Add").click()
        page.wait_for_url(f"{base}/endpoints/*")
        assert page.get_by_role("heading", name="Endpoint customer-hook").is_visible()
        [(endpoint, tenant)] = query(db, "SELECT id, tenant_id FROM webhooks.endpoints"
                                         " WHERE name = 'customer-hook'")
        assert tenant == globex

        page.get_by_role("button", name="Send a test event").click()
        page.wait_for_url(f"{base}/deliveries/*")
        watch_until_settled(page)
        page.wait_for_selector('#status[data-status="delivered"]', timeout=WAIT_MS)
        assert "webhook.test" in page.locator("dl.facts").inner_text()

        page.get_by_role("link", name="customer-hook").click()
        screenshot(page, tmp_path, "console-endpoint.png")
        page.get_by_role("button", name="Reveal the signing secret").click()
        secret = page.locator("code.secret").first.inner_text()
        [sent] = receiver.to("/customer")
        signing.verify(secret, sent.headers, sent.body)  # raises unless the signature is this secret's

        page.get_by_role("link", name="Dead letters").click()
        assert page.locator(f"#dead-letter-{acme_dead}").count() == 0
        page.locator(f"#dead-letter-{dead}").get_by_role("link", name=f"#{dead}").click()
        page.get_by_role("button", name="Replay this delivery").click()
        page.wait_for_url("**notice=replayed**")
        watch_until_settled(page)
        page.wait_for_selector('#status[data-status="delivered"]', timeout=WAIT_MS)

        # another tenant's endpoint and dead letter: not listed, and not reachable by URL
        page.get_by_role("link", name="Endpoints", exact=True).click()
        assert "acme-orders" not in page.content()
        assert problems == [], problems  # nothing the CSP blocked, no script error
        for path in (f"/endpoints/{theirs}", f"/deliveries/{acme_dead}"):
            answer = page.goto(base + path)
            assert answer is not None and answer.status == 404, path
            assert "acme" not in page.content()

    assert statuses(db, [dead, acme_dead]) == {dead: "delivered", acme_dead: "dead_letter"}
    assert query(db, "SELECT count(*) FROM webhooks.alert_delivery_queue WHERE webhook_id = %s",
                 (endpoint,)) == [(1,)]
    worker.stop()


def test_an_admin_adds_a_catalogued_event_type_and_deprecates_it_in_the_browser(db, console, tmp_path):
    assert Path(CHROMIUM).exists(), "chromium is needed for this test: scripts/bootstrap.sh installs it"
    billing = add_endpoint(db, "http://127.0.0.1:9/billing", name="billing", event_types=("invoce.paid",))
    token = make_token(db, "admin", name="catalogue-keeper")
    base = f"http://127.0.0.1:{console.port}/console"

    with browser_page() as (page, problems):
        page.goto(base + "/login")
        page.get_by_label("API token").fill(token)
        page.keyboard.press("Enter")
        page.wait_for_url(base + "/")
        page.get_by_role("link", name="Event types").click()
        page.wait_for_url(base + "/event-types")
        unmatched = page.locator("#unmatched").inner_text()
        assert "billing" in unmatched and "invoce.paid" in unmatched and "unknown" in unmatched

        form = page.get_by_role("form", name="Add an event type")
        form.get_by_label("Name").fill("invoice.paid")
        form.get_by_label("Description").fill("An invoice was paid")
        form.get_by_label("JSON Schema").fill('{"type": 5}')  # not a JSON Schema: refused, kept
        form.get_by_role("button", name="Add").click()
        assert "schema:" in page.get_by_role("alert").inner_text()
        assert page.get_by_label("JSON Schema").input_value() == '{"type": 5}'
        page.get_by_label("JSON Schema").fill('{"type": "object", "required": ["invoice_id"]}')
        page.get_by_role("button", name="Add").click()
        page.wait_for_url(base + "/event-types/invoice.paid?notice=event_type_added")
        assert page.get_by_role("heading", name="Event type invoice.paid").is_visible()
        assert '"invoice_id"' in page.locator("pre#schema").inner_text()
        screenshot(page, tmp_path, "console-event-type.png")

        page.get_by_role("button", name="Deprecate").click()
        page.wait_for_url("**notice=event_type_deprecated")
        assert "deprecated" in page.locator("#state").inner_text()
        page.goto(f"{base}/endpoints/{billing}")
        assert "invoce.paid" in page.locator("#unmatched-subscriptions").inner_text()
        page.goto(base + "/event-types")
        screenshot(page, tmp_path, "console-event-types.png")
        # nothing the CSP blocked, no script error: chromium reports only the refused form's 422
        assert problems == ["Failed to load resource: the server responded with a status of 422"
                            " (Unprocessable Entity)"], problems

    assert query(db, "SELECT description, deprecated FROM webhooks.event_types WHERE name = 'invoice.paid'"
                 ) == [("An invoice was paid", True)]


# axe-core's rules for WCAG 2.0, 2.1 and 2.2, levels A and AA
AXE_TAGS = ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa", "wcag22a", "wcag22aa"]


def accessibility_violations(page: Page) -> list[str]:
    """axe-core's WCAG 2 A and AA violations on the page as it is shown, one line per element. The
    script is handed to the browser through its debugging protocol, which the page's CSP does not
    govern: the console serves nothing of it and its CSP stays as served."""
    page.evaluate(AXE_SCRIPT)
    results = page.evaluate("options => axe.run(document, options)",
                            {"runOnly": {"type": "tag", "values": AXE_TAGS}, "resultTypes": ["violations"]})
    return [f"{violation['id']} ({violation['impact']}) {' '.join(map(str, node['target']))}: "
            f"{node['failureSummary']}" for violation in results["violations"] for node in violation["nodes"]]


def test_every_console_page_passes_axe_core_for_an_admin_and_for_a_portal_customer(
        db, receiver, spawn, console, tmp_path):
    """Every kind of console page, with rows in every state a badge shows, checked by axe-core (WCAG
    2.0 to 2.2, A and AA): as an admin, and as a tenant's customer come through a portal link."""
    assert Path(CHROMIUM).exists(), "chromium is needed for this test: scripts/bootstrap.sh installs it"
    acme = query(db, "SELECT webhooks.register_tenant('acme')")[0][0]
    receiver.script("/down", Reply(503, body=b"upstream database is down"))
    receiver.script("/refuses", Reply(400, body=b"acme refuses"))
    failing = add_endpoint(db, receiver.url("/down"), name="pagerduty", max_attempts=1)
    billing = add_endpoint(db, receiver.url("/down"), name="billing", max_attempts=1)
    healthy = add_endpoint(db, receiver.url("/ok"), name="slack")
    customers = add_endpoint(db, receiver.url("/refuses"), name="acme-orders", max_attempts=1)
    query(db, "UPDATE webhooks.endpoints SET tenant_id = %s WHERE id = %s", (acme, customers))
    query(db, "SELECT webhooks.set_circuit(%s, 'open', NULL, 'on-call', 'receiver down')", (failing,))
    query(db, "SELECT webhooks.set_circuit(%s, 'close', NULL, 'on-call', 'receiver back')", (failing,))
    worker = spawn(db)
    [dead] = enqueue(db, failing, {"alert": "disk full"}, event_type="alert.created")
    delivered = enqueue(db, healthy, {"alert": "cpu high"}, count=3)
    [customer_dead] = enqueue(db, customers, {"order": 7}, event_type="order.created")
    replayed = enqueue(db, billing, {"invoice": 9}, event_type="invoice.paid", count=2)
    eventually(lambda: statuses(db, [dead, customer_dead, *delivered, *replayed]) ==
               {dead: "dead_letter", customer_dead: "dead_letter", **dict.fromkeys(replayed, "dead_letter"),
                **dict.fromkeys(delivered, "delivered")},
               message="dead letters and deliveries")
    worker.stop()
    query(db, "SELECT webhooks.upsert_event_type('invoice.paid', 'An invoice was paid',"
              " '{\"type\": \"object\", \"required\": [\"invoice_id\"]}', false)")
    # a bulk replay of billing's dead letters that stays running (a row every thousand seconds), with
    # its Cancel button; the row it puts back waits (no worker runs now), its page not settled
    query(db, "SELECT webhooks.api_start_replay(jsonb_build_object('webhook_id', %s::bigint), 0.001, NULL,"
              " 'on-call')", (billing,))
    eventually(lambda: "pending" in statuses(db, replayed).values(), message="a row replayed")
    [waiting] = [delivery for delivery, status in statuses(db, replayed).items() if status == "pending"]
    # table triggers: one of acme's, one with a backfill that stays running, one whose table is gone
    query(db, "CREATE TABLE public.orders (id bigint PRIMARY KEY, status text)")
    query(db, "GRANT SELECT ON public.orders TO webhooks_admin")  # the console invokes as webhooks_admin
    query(db, "INSERT INTO public.orders VALUES (1, 'new'), (2, 'new')")
    query(db, "SELECT webhooks.table_trigger_add('orders', 'public.orders', ARRAY['insert', 'update'],"
              " 'order.changed', p_when => 'status <> ''draft''')")
    query(db, "SELECT webhooks.table_trigger_add('acme-orders', 'public.orders', ARRAY['delete'],"
              " 'order.gone', p_tenant => 'acme')")
    query(db, "SELECT webhooks.table_trigger_backfill('orders', p_rate => 0.001)")
    query(db, "CREATE TABLE public.gone (id bigint PRIMARY KEY)")
    query(db, "SELECT webhooks.table_trigger_add('gone', 'public.gone', ARRAY['insert'], 'gone.created')")
    query(db, "DROP TABLE public.gone")
    admin = make_token(db, "admin", name="on-call")
    base = f"http://127.0.0.1:{console.port}/console"
    pages = ["/", "/deliveries", "/deliveries?endpoint=pagerduty", "/dead-letters", f"/deliveries/{dead}",
             f"/deliveries/{delivered[0]}", f"/deliveries/{waiting}", "/endpoints", f"/endpoints/{failing}",
             f"/endpoints/{healthy}", "/operations", "/event-types", "/event-types/invoice.paid",
             "/triggers", "/endpoints/999999"]
    found: dict[str, list[str]] = {}

    with browser_page() as (page, problems):

        def check(name: str) -> None:
            found[name] = accessibility_violations(page)

        page.goto(base + "/login")
        check("login")
        page.get_by_label("API token").fill(admin)
        page.keyboard.press("Enter")
        page.wait_for_url(base + "/")
        for path in pages:
            page.goto(base + path)
            check(f"admin {path}")
        page.goto(f"{base}/deliveries/{waiting}")
        assert page.get_by_label("Refresh every 2 s until it is delivered or a dead letter").is_visible()
        page.goto(base + "/operations")
        assert page.get_by_role("button", name="Cancel").first.is_visible()
        page.goto(base + "/triggers")
        page.get_by_label("Primary key").first.fill("1")
        page.get_by_role("button", name="Invoke").first.click()
        page.wait_for_url("**/triggers?notice=trigger_invoked&n=*")
        check("admin /triggers after invoke")
        page.goto(base + "/dead-letters")
        assert page.locator(f"#dead-letter-{dead}").is_visible()
        page.get_by_role("button", name="Log out").click()
        page.wait_for_url("**/login?notice=logged_out")
        check("logged out")

        made = cli("tokens", "portal-link", "--tenant", "acme", "--base-url",
                   f"http://127.0.0.1:{console.port}", env={"DATABASE_URL": db})
        assert made.returncode == 0, made.stderr
        page.goto(made.stdout.strip())
        check("portal link")
        page.get_by_role("button", name="Open the console").click()
        page.wait_for_url(base + "/")
        for path in ["/", "/deliveries", "/dead-letters", f"/deliveries/{customer_dead}", "/endpoints",
                     f"/endpoints/{customers}", "/operations", "/event-types", "/event-types/invoice.paid",
                     "/triggers"]:
            page.goto(base + path)
            check(f"customer {path}")
        page.get_by_role("button", name="Log out").click()
        page.wait_for_url(base + "/portal-ended?notice=portal_logged_out")
        assert page.get_by_role("heading", name="Your session has ended").is_visible()
        check("customer logged out")
        screenshot(page, tmp_path, "console-portal-ended.png")
        # nothing the CSP blocked, no script error: chromium reports only the missing endpoint's 404
        assert problems == ["Failed to load resource: the server responded with a status of 404 (Not Found)"
                            ], problems

    failures = {name: lines for name, lines in found.items() if lines}
    assert not failures, "\n".join(f"{name}:\n  " + "\n  ".join(lines) for name, lines in failures.items())
