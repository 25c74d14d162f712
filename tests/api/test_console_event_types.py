"""The console's event-type catalogue: the list with the subscriptions matching each type and those
matching none, a page per type, and an unscoped admin adding, editing and deprecating types through
worker/rules/event_types.py, refused with the API's and the CLI's words; readers and tenant
administrators read it and change nothing; the endpoint page names its unmatched subscriptions."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import pytest
from markupsafe import escape

from tests.acceptance.test_cli import cli
from tests.api.console_client import Browserless, ConsoleServer
from tests.api.server import api_config, make_token
from tests.api.test_console import logged_in
from tests.support import add_endpoint, query
from worker.rules import event_types

INVOICE_SCHEMA = {"type": "object", "required": ["invoice_id"]}


@pytest.fixture
def console(db: str) -> Iterator[ConsoleServer]:
    server = ConsoleServer(api_config(db)).start()
    yield server
    server.stop()


def esc(text: object) -> str:
    """Text as the console's templates write it (Jinja's autoescape)."""
    return str(escape(text))


def stored(db: str, name: str) -> list[tuple[object, ...]]:
    return query(db, "SELECT description, schema, deprecated FROM webhooks.event_types WHERE name = %s",
                 (name,))


def form_of(page: str, action: str) -> str:
    """The HTML of the page's form that posts to `action`."""
    start = page.index(f'action="{action}"')
    return page[start:page.index("</form>", start)]


def test_an_admin_adds_edits_and_deprecates_an_event_type(console, db, capfd):
    admin = logged_in(console, db, "admin", name="alice")
    page = admin.get("/console/event-types").body.decode()
    assert '<a href="/console/event-types" aria-current="page">Event types</a>' in page
    assert 'action="/console/event-types"' in page  # the add form
    answer = admin.post("/console/event-types", {
        "csrf": admin.csrf(), "name": " invoice.paid ", "description": "An invoice was paid",
        "schema": json.dumps(INVOICE_SCHEMA)})
    assert answer.status == 303, answer.body
    assert answer.headers["location"] == "/console/event-types/invoice.paid?notice=event_type_added"
    assert stored(db, "invoice.paid") == [("An invoice was paid", INVOICE_SCHEMA, False)]
    page = admin.get(answer.headers["location"]).body.decode()
    assert "<h1>Event type invoice.paid</h1>" in page and "Event type added to the catalogue." in page
    assert '<pre class="payload schema" id="schema">{\n  &#34;type&#34;: &#34;object&#34;,' in page, page
    assert esc('"required": [') in page
    # the API reads what the console wrote
    reader = make_token(db, "reader")
    assert console.get("/v1/event-types/invoice.paid", reader).json == {
        "name": "invoice.paid", "description": "An invoice was paid", "schema": INVOICE_SCHEMA,
        "deprecated": False, "problem": None}

    # edit: the form shows what is stored; an empty schema field is no schema; CRLF is a line break
    edit = form_of(page, "/console/event-types/invoice.paid")
    assert ">\nAn invoice was paid</textarea>" in edit and esc('"invoice_id"') in edit
    answer = admin.post("/console/event-types/invoice.paid", {
        "csrf": admin.csrf(), "description": "Paid,\r\nin full", "schema": "  "})
    assert answer.status == 303 and answer.headers["location"].endswith("?notice=event_type_edited")
    assert stored(db, "invoice.paid") == [("Paid,\nin full", None, False)]
    assert "None: any payload is accepted." in admin.get("/console/event-types/invoice.paid").body.decode()

    # deprecate, and back
    answer = admin.post("/console/event-types/invoice.paid/deprecate", {"csrf": admin.csrf(),
                                                                         "deprecated": "true"})
    assert answer.status == 303 and answer.headers["location"].endswith("?notice=event_type_deprecated")
    assert stored(db, "invoice.paid")[0][2] is True
    page = admin.get("/console/event-types/invoice.paid").body.decode()
    assert "Make current again</button>" in page and 'name="deprecated" value="false"' in page
    answer = admin.post("/console/event-types/invoice.paid/deprecate", {"csrf": admin.csrf(),
                                                                         "deprecated": "false"})
    assert answer.status == 303 and answer.headers["location"].endswith("?notice=event_type_current")
    assert stored(db, "invoice.paid")[0][2] is False
    # the deprecated box of the edit form writes the flag too
    assert admin.post("/console/event-types/invoice.paid", {"csrf": admin.csrf(), "description": "Paid",
                                                            "deprecated": "true"}).status == 303
    assert stored(db, "invoice.paid") == [("Paid", None, True)]

    # adding a name that exists replaces nothing
    answer = admin.post("/console/event-types", {"csrf": admin.csrf(), "name": "invoice.paid",
                                                 "description": "clobbered", "schema": "true"})
    assert answer.status == 409
    assert "name: the event type &#34;invoice.paid&#34; exists" in answer.body.decode()
    assert stored(db, "invoice.paid") == [("Paid", None, True)]
    # nothing of either: a type that is not there, a deprecate button's value that is neither
    assert admin.post("/console/event-types/nothing.here", {"csrf": admin.csrf()}).status == 404
    assert admin.post("/console/event-types/nothing.here/deprecate",
                      {"csrf": admin.csrf(), "deprecated": "true"}).status == 404
    answer = admin.post("/console/event-types/invoice.paid/deprecate",
                        {"csrf": admin.csrf(), "deprecated": "x"})
    assert answer.status == 422 and "deprecated: must be true or false" in answer.body.decode()
    assert admin.get("/console/event-types/nothing.here").status == 404

    logged = capfd.readouterr().out
    assert "console event type added" in logged and "console event type changed" in logged
    assert "console event type deprecated" in logged and "alice" in logged


def test_a_name_with_slashes_and_spaces_is_one_path_segment(console, db):
    admin = logged_in(console, db, "admin")
    name = "billing/invoice paid?#x"
    answer = admin.post("/console/event-types", {"csrf": admin.csrf(), "name": name})
    assert answer.status == 303, answer.body
    where = "/console/event-types/billing%2Finvoice%20paid%3F%23x"
    assert answer.headers["location"] == where + "?notice=event_type_added"
    page = admin.get(where).body.decode()
    assert f'action="{where}/deprecate"' in page and f'action="{where}"' in page
    assert admin.post(where + "/deprecate", {"csrf": admin.csrf(), "deprecated": "true"}).status == 303
    assert stored(db, name) == [("", None, True)]
    assert f'href="{where}"' in admin.get("/console/event-types").body.decode()


def api_detail(console: ConsoleServer, token: str, name: str, body: dict[str, object]) -> str:
    answer = console.request("PUT", "/v1/event-types/" + name, token, body)
    assert answer.status == 422, answer.body
    return str(answer.json["detail"])


def test_the_form_refuses_what_the_api_and_the_cli_refuse_in_their_words_and_keeps_the_input(console, db):
    admin = logged_in(console, db, "admin")
    token = make_token(db, "admin")
    env = {"DATABASE_URL": db}
    query(db, "SELECT webhooks.upsert_event_type('order.created', 'An order')")
    before = query(db, "SELECT name, description, schema, deprecated FROM webhooks.event_types ORDER BY name")
    long_text = "x" * (event_types.MAX_DESCRIPTION_CHARS + 1)
    bad_schema = '{"type": 5}'
    cases = [
        # (the form, the words the console must show, where the same words come from)
        ({"name": "a*"}, api_detail(console, token, "a*", {})),
        ({"name": "webhook.mine"}, api_detail(console, token, "webhook.mine", {})),
        ({"name": "a.b", "schema": bad_schema}, api_detail(console, token, "a.b", {"schema": {"type": 5}})),
        ({"name": "a.b", "schema": "{not json"},
         "schema: " + cli("event-types", "set", "a.b", "--schema", "{not json", env=env).stderr.strip()
         .removeprefix("webhook-worker: --schema: ")),
        ({"name": "a.b", "description": long_text},
         "description: " + cli("event-types", "set", "a.b", "--description", long_text,
                               env=env).stderr.strip().removeprefix("webhook-worker: --description: ")),
    ]
    for form, said in cases:
        assert said.startswith(("name: ", "schema: ", "description: ")) and len(said) > 20, said
        typed = {"description": "kept <b>as typed</b>", "schema": "", **form}
        answer = admin.post("/console/event-types", {"csrf": admin.csrf(), **typed})
        page = answer.body.decode()
        assert answer.status == 422, (form, page)
        assert f'<p class="error" role="alert" id="form-error">{esc(said)}</p>' in page, (said, page)
        # the form comes back as it was typed (escaped), beside the catalogue
        assert f'name="name" required value="{esc(typed["name"])}"' in page
        assert f">\n{esc(typed['description'])}</textarea>" in page
        assert f">\n{esc(typed['schema'])}</textarea>" in page
        assert "<h1>Event types</h1>" in page
    # the edit form says the same, on the type's page
    answer = admin.post("/console/event-types/order.created", {"csrf": admin.csrf(), "schema": bad_schema,
                                                               "description": "changed"})
    page = answer.body.decode()
    assert answer.status == 422 and esc(cases[2][1]) in page
    assert "<h1>Event type order.created" in page
    assert f">\n{esc(bad_schema)}</textarea>" in page and ">\nchanged</textarea>" in page
    assert stored(db, "order.created") == [("An order", None, False)]
    # the worker's own types have no form, and a post to change one is refused with the API's words
    page = admin.get("/console/event-types/webhook.test").body.decode()
    assert "the worker's own type" in page
    assert "<textarea" not in page and "Deprecate</button>" not in page
    answer = admin.post("/console/event-types/webhook.test/deprecate",
                        {"csrf": admin.csrf(), "deprecated": "true"})
    reserved = console.post("/v1/event-types/webhook.test/deprecate", token).json["detail"]
    assert answer.status == 422 and esc(str(reserved)) in answer.body.decode()
    answer = admin.post("/console/event-types/webhook.test", {"csrf": admin.csrf(), "description": "mine"})
    said = api_detail(console, token, "webhook.test", {})
    assert answer.status == 422 and f'<p class="error" role="alert">{esc(said)}</p>' in answer.body.decode()
    # nothing was written by any of them
    assert query(db, "SELECT name, description, schema, deprecated FROM webhooks.event_types"
                     " ORDER BY name") == before


@pytest.mark.parametrize("role", ["reader", "tenant_admin"])
def test_readers_and_tenant_administrators_read_the_catalogue_and_change_nothing(console, db, role):
    query(db, "SELECT webhooks.upsert_event_type('invoice.paid', 'An invoice was paid')")
    before = query(db, "SELECT name, description, schema, deprecated FROM webhooks.event_types ORDER BY name")
    person = logged_in(console, db, role)
    for path in ("/console/event-types", "/console/event-types/invoice.paid"):
        answer = person.get(path)
        assert answer.status == 200 and "invoice.paid" in answer.body.decode(), path
        forms = re.findall(r'<form[^>]*method="post"[^>]*action="([^"]+)"', answer.body.decode())
        assert forms == ["/console/logout"], (path, forms)
    csrf = person.csrf()
    answers = [
        person.post("/console/event-types", {"csrf": csrf, "name": "mine.now", "description": "x"}),
        person.post("/console/event-types/invoice.paid", {"csrf": csrf, "description": "changed"}),
        person.post("/console/event-types/invoice.paid/deprecate", {"csrf": csrf, "deprecated": "true"}),
    ]
    assert [a.status for a in answers] == [403, 403, 403]
    said = answers[0].body.decode()
    # what the console says to a reader for every change, and to a tenant's administrator here
    assert ("needs admin" in said) if role == "reader" else ("the catalogue is the deployment&#39;s" in said)
    assert query(db, "SELECT name, description, schema, deprecated FROM webhooks.event_types"
                     " ORDER BY name") == before
    # the API refuses the same callers the same changes
    token = make_token(db, role)
    assert console.request("PUT", "/v1/event-types/mine.now", token, {"description": "x"}).status == 403
    assert console.post("/v1/event-types/invoice.paid/deprecate", token).status == 403


def test_each_type_lists_the_subscriptions_matching_it_and_the_list_those_matching_none(console, db):
    query(db, "SELECT webhooks.upsert_event_type('invoice.paid', 'An invoice was paid')")
    query(db, "SELECT webhooks.upsert_event_type('invoice.voided', 'Voided', NULL, true)")
    billing = add_endpoint(db, "http://127.0.0.1:9/billing", name="billing",
                           event_types=("invoice.*", "invoce.paid", "invoice.voided"))
    everything = add_endpoint(db, "http://127.0.0.1:9/all", name="everything", event_types=("*",))
    ops = add_endpoint(db, "http://127.0.0.1:9/ops", name="ops", event_types=("webhook.*",))
    person = logged_in(console, db, "reader")
    page = person.get("/console/event-types").body.decode()
    row = re.search(r'<tr id="event-type-\d+">\s*<th scope="row"><a href="/console/event-types/invoice.paid">'
                    r"(.*?)</tr>", page, re.S)
    assert row, page
    assert (f'<a href="/console/endpoints/{billing}">billing</a> <span class="muted">(invoice.*)</span>, '
            f'<a href="/console/endpoints/{everything}">everything</a> <span class="muted">(*)</span>'
            ) in row.group(1)
    assert "current" in row.group(1) and "ops" not in row.group(1)
    # the worker's own types go to the endpoints that name them, not to '*'
    page_of_test = person.get("/console/event-types/webhook.endpoint.disabled").body.decode()
    assert f'<a href="/console/endpoints/{ops}">ops</a></td><td>webhook.*</td>' in page_of_test
    assert "everything" not in page_of_test
    # the unmatched subscriptions, as `event-types unmatched` lists them
    listed = json.loads(cli("event-types", "unmatched", "--json", env={"DATABASE_URL": db}).stdout)
    table = page[page.index('id="unmatched"'):]
    table = table[:table.index("</table>")]
    shown = re.findall(r'<a href="/console/endpoints/(\d+)">([^<]*)</a></td><td>([^<]*)</td>\s*'
                       r'<td><span class="status[^"]*">([^<]*)</span>', table)
    assert shown == [(str(u["webhook_id"]), u["endpoint_name"], u["pattern"], u["problem"]) for u in listed]
    assert [s[2:] for s in shown] == [("invoce.paid", "unknown"), ("invoice.voided", "deprecated")]


def test_the_endpoint_page_names_the_subscriptions_that_match_no_current_type(console, db):
    query(db, "SELECT webhooks.upsert_event_type('invoice.paid', 'An invoice was paid')")
    query(db, "SELECT webhooks.upsert_event_type('invoice.voided', 'Voided', NULL, true)")
    billing = add_endpoint(db, "http://127.0.0.1:9/billing", name="billing",
                           event_types=("invoice.paid", "invoce.*", "invoice.voided", "webhook.*", "*"))
    fine = add_endpoint(db, "http://127.0.0.1:9/fine", name="fine", event_types=("invoice.*",))
    person = logged_in(console, db, "reader")
    page = person.get(f"/console/endpoints/{billing}").body.decode()
    found = re.search(r'<dd id="unmatched-subscriptions">(.*?)</dd>', page, re.S)
    assert found, page
    said = re.findall(r'<span class="status [^"]*">([^<]*)</span> <span class="muted">\(([^)]*)\)',
                      found.group(1))
    assert said == [("invoce.*", "no catalogued type matches it"),
                    ("invoice.voided", "only deprecated types match it")]
    # the same as `endpoints show` finds
    shown = json.loads(cli("endpoints", "show", "billing", "--json", env={"DATABASE_URL": db}).stdout)
    assert [u["pattern"] for u in shown["unmatched_subscriptions"]] == [s[0] for s in said]
    assert "unmatched-subscriptions" not in person.get(f"/console/endpoints/{fine}").body.decode()


def test_a_description_or_name_holding_html_is_shown_as_text(console, db):
    hostile = '<script>alert(1)</script><b onmouseover="x()">bold</b>'
    query(db, "SELECT webhooks.upsert_event_type(%s, %s, %s)",
          ("<i>x</i>", hostile, json.dumps({"description": "</pre><script>alert(2)</script>"})))
    admin = logged_in(console, db, "admin")
    for path in ("/console/event-types", "/console/event-types/%3Ci%3Ex%3C%2Fi%3E"):
        answer = admin.get(path)
        page = answer.body.decode()
        assert answer.status == 200, path
        assert "<script>alert" not in page and "<b onmouseover" not in page and "<i>x</i>" not in page, path
        assert esc(hostile) in page and "&lt;i&gt;x&lt;/i&gt;" in page, path
    assert "&lt;/pre&gt;&lt;script&gt;alert(2)" in page  # the schema too, and in the edit form


def test_the_catalogue_pages_keep_the_consoles_csp_and_label_every_field(console, db):
    person = logged_in(console, db, "admin")
    for path in ("/console/event-types", "/console/event-types/webhook.test"):
        answer = person.get(path)
        assert answer.status == 200, path
        assert answer.headers["content-security-policy"].startswith("default-src 'none'"), path
        page = answer.body.decode()
        assert not re.search(r"<script(?![^>]*\bsrc=)", page) and " style=" not in page, path
        labelled = set(re.findall(r'<label for="([^"]+)"', page))
        for field in re.findall(r"<(?:input|select|textarea)\b[^>]*>", page):
            if 'type="hidden"' not in field:
                found = re.search(r'\bid="([^"]+)"', field)
                assert found and found.group(1) in labelled, f"{path}: {field} has no label"
        for form in re.findall(r'<form[^>]*method="post".*?</form>', page, re.S):
            assert 'name="csrf"' in form, form
    # a post without the CSRF token changes nothing
    answer = Browserless(console)
    answer.cookies = dict(person.cookies)
    refused = answer.post("/console/event-types", {"name": "sneaky.type"})
    assert refused.status == 403 and query(db, "SELECT count(*) FROM webhooks.event_types"
                                               " WHERE name = 'sneaky.type'") == [(0,)]
