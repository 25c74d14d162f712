"""Deleting an endpoint from the console: a confirmation step that says what is kept, refused and
dropped; the delete itself as the CLI and the API make it; a deleted endpoint's dead letters named as
its own, never as the endpoint that has its name now, and their replay refused saying why."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from tests.api.console_client import ConsoleServer
from tests.api.server import api_config
from tests.api.test_console import dead_letter, logged_in
from tests.support import add_endpoint, enqueue, query


@pytest.fixture
def console(db: str) -> Iterator[ConsoleServer]:
    server = ConsoleServer(api_config(db)).start()
    yield server
    server.stop()


def test_an_endpoint_is_deleted_after_a_confirmation_and_its_waiting_rows_become_dead_letters(console, db):
    endpoint = add_endpoint(db, "http://127.0.0.1:9/hook", name="billing")
    dead = dead_letter(db, endpoint)
    waiting = enqueue(db, endpoint, count=2, deliver_after=3600)
    person = logged_in(console, db, "admin", name="bob")
    endpoint_page = person.get(f"/console/endpoints/{endpoint}").body.decode()
    assert f'href="/console/endpoints/{endpoint}/delete"' in endpoint_page

    page = person.get(f"/console/endpoints/{endpoint}/delete")
    html = page.body.decode()
    assert page.status == 200
    assert "Its 1 finished deliveries" in html and "2 of its deliveries are waiting" in html
    labelled = set(re.findall(r'<label for="([^"]+)"', html))
    assert {"drop-pending", "confirm-name"} <= labelled
    csrf = person.csrf(f"/console/endpoints/{endpoint}/delete")
    action = f"/console/endpoints/{endpoint}/delete"

    # without the CSRF token, with the wrong name, or with rows waiting and not dropped: nothing changes
    assert person.post(action, {"confirm_name": "billing", "drop_pending": "true"}).status == 403
    wrong = person.post(action, {"csrf": csrf, "confirm_name": "billin", "drop_pending": "true"})
    assert wrong.status == 422
    assert "confirm_name: type the endpoint&#39;s name, billing" in wrong.body.decode()
    kept = person.post(action, {"csrf": csrf, "confirm_name": "billing"})
    assert kept.status == 409 and "still has 2 deliveries waiting" in kept.body.decode()
    assert query(db, "SELECT count(*) FROM webhooks.endpoints") == [(1,)]

    done = person.post(action, {"csrf": csrf, "confirm_name": "billing", "drop_pending": "true"})
    assert done.status == 303 and "notice=endpoint_deleted" in done.headers["location"], done.body
    assert f"Endpoint {endpoint} deleted; 2 waiting delivery(ies) became dead letters" in person.get(
        done.headers["location"]).body.decode()
    assert query(db, "SELECT count(*) FROM webhooks.endpoints") == [(0,)]
    rows = query(db, "SELECT status, failure_category, dead_letter_reason FROM webhooks.alert_delivery_queue"
                     " WHERE delivery_id = ANY(%s)", (waiting,))
    assert {r[:2] for r in rows} == {("dead_letter", "endpoint_deleted")}
    assert "bob (console)" in rows[0][2]

    # the name goes to a new endpoint; the old rows stay the old endpoint's, unlinked, and say so
    new = add_endpoint(db, "http://127.0.0.1:9/new", name="billing")
    new_dead = dead_letter(db, new)
    listed = person.get("/console/dead-letters").body.decode()
    for delivery_id in (dead, *waiting):
        row = re.search(rf'<tr id="dead-letter-{delivery_id}">.*?</tr>', listed, re.S)
        assert row and f"billing (id {endpoint}, deleted)" in row.group(0), delivery_id
        assert f'href="/console/endpoints/{endpoint}"' not in row.group(0)
    row = re.search(rf'<tr id="dead-letter-{new_dead}">.*?</tr>', listed, re.S)
    assert row and f'<a href="/console/endpoints/{new}">billing</a>' in row.group(0)
    shown = person.get(f"/console/deliveries/{dead}").body.decode()
    assert f"billing (id {endpoint}, deleted)" in shown
    assert "Not replayable: its endpoint was deleted" in shown
    assert "Replay this delivery" not in shown
    # a replay posted anyway is refused, saying why
    refused = person.post(f"/console/deliveries/{dead}/replay", {"csrf": person.csrf()})
    assert refused.status == 303 and "notice=not_replayed_deleted" in refused.headers["location"]
    assert "belong to a deleted endpoint" in person.get(refused.headers["location"]).body.decode()
    mixed = person.post("/console/dead-letters/replay",
                        [("csrf", person.csrf()), ("delivery_id", dead), ("delivery_id", new_dead)])
    assert "notice=replayed_some" in mixed.headers["location"]
    assert query(db, "SELECT status FROM webhooks.alert_delivery_queue WHERE delivery_id = %s", (dead,)) == [
        ("dead_letter",)]


def test_an_endpoint_with_a_delivery_being_sent_is_not_deleted_and_the_page_says_so(console, db):
    endpoint = add_endpoint(db, "http://127.0.0.1:9/hook", name="pager")
    [row] = enqueue(db, endpoint)
    query(db, "UPDATE webhooks.alert_delivery_queue SET status = 'delivering', locked_by = 'w',"
              " lease_token = gen_random_uuid(), locked_until = now() + interval '1 minute'"
              " WHERE delivery_id = %s", (row,))
    person = logged_in(console, db, "admin")
    page = person.get(f"/console/endpoints/{endpoint}/delete").body.decode()
    assert "1 of its deliveries are being sent now" in page and "Disable it first" in page
    refused = person.post(f"/console/endpoints/{endpoint}/delete",
                          {"csrf": person.csrf(), "confirm_name": "pager", "drop_pending": "true"})
    assert refused.status == 409 and "being sent now" in refused.body.decode()
    assert query(db, "SELECT status FROM webhooks.alert_delivery_queue") == [("delivering",)]
    # a reader sees no delete, and its post is refused
    reader = logged_in(console, db, "reader")
    assert "/delete" not in reader.get(f"/console/endpoints/{endpoint}").body.decode()
    assert reader.post(f"/console/endpoints/{endpoint}/delete",
                       {"csrf": reader.csrf(), "confirm_name": "pager"}).status == 403
    assert person.get("/console/endpoints/424242/delete").status == 404
