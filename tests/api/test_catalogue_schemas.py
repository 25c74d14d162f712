"""What catalogue schemas may do inside the API process: nothing is fetched or read whatever a schema
names (refused when written, by the API, the CLI and the console alike; flagged and refused at
publish when stored before), schemas are bounded in depth and size, a payload's check runs off the
event loop within a time budget while /health answers, and a made-up token is refused before its
body is read."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time

from markupsafe import escape

from tests.acceptance.test_cli import cli
from tests.api import test_console
from tests.api.server import Answer, ApiServer, api_config, make_token
from tests.api.test_console import logged_in
from tests.support import add_endpoint, query
from tests.unit import test_schemas
from tests.unit.test_schemas import SECRET

# the fixtures: the API with the console; a URL and a file a schema could name, each holding a secret
console = test_console.console
outside = test_schemas.outside

# jsonschema compares unhashable items pairwise: 20,000 distinct objects are 2e8 comparisons, minutes
UNIQUE = {"type": "array", "uniqueItems": True}
HOSTILE = [{"n": i} for i in range(20_000)]


def catalogued(db: str, name: str) -> list[tuple[object, ...]]:
    return query(db, "SELECT schema FROM webhooks.event_types WHERE name = %s", (name,))


def test_a_schema_naming_a_url_or_a_file_is_refused_by_the_api_the_cli_and_the_console(console, db, outside,
                                                                                     receiver):
    url, file_uri = outside
    admin = make_token(db, "admin")
    env = {"DATABASE_URL": db}
    refused = console.request("PUT", "/v1/event-types/card.charged", admin, {"schema": {"$ref": url}})
    assert refused.status == 422 and refused.json["field"] == "schema", refused.body
    assert refused.json["detail"].startswith("schema: at /$ref: ") and "nothing outside it is ever fetched" \
        in refused.json["detail"]
    by_file = {"properties": {"card": {"$ref": file_uri}}}
    refused = console.request("PUT", "/v1/event-types/card.charged", admin, {"schema": by_file})
    assert refused.status == 422 and refused.json["detail"].startswith("schema: at /properties/card/$ref: ")
    said = cli("event-types", "set", "card.charged", "--schema", json.dumps(by_file), env=env)
    assert said.returncode == 2, said.stderr
    detail = refused.json["detail"]
    assert said.stderr.strip() == "webhook-worker: --schema: " + detail.removeprefix("schema: ")
    person = logged_in(console, db, "admin")
    page = person.post("/console/event-types", {"csrf": person.csrf(), "name": "card.charged",
                                                "schema": json.dumps(by_file)})
    assert page.status == 422
    assert f'<p class="error" role="alert" id="form-error">{escape(refused.json["detail"])}</p>' \
        in page.body.decode()
    identified = console.request("PUT", "/v1/event-types/card.charged", admin, {"schema": {"$id": url}})
    assert identified.status == 422 and identified.json["detail"].startswith("schema: at /$id: ")
    assert catalogued(db, "card.charged") == []
    assert receiver.requests == []
    assert SECRET not in refused.body.decode() + said.stderr + page.body.decode()


def test_a_stored_schema_naming_a_url_or_a_file_is_flagged_and_its_publishes_refused_fetching_nothing(
        console, db, outside, receiver, role_tokens):
    url, file_uri = outside
    add_endpoint(db, receiver.url("/hook"), name="hook", event_types=("card.*",))
    # stored as a schema could be before the rules, or written in SQL around them
    query(db, "SELECT webhooks.upsert_event_type('card.charged', '', %s)",
          (json.dumps({"properties": {"card": {"$ref": file_uri}}}),))
    query(db, "SELECT webhooks.upsert_event_type('card.refunded', '', %s)", (json.dumps({"$ref": url}),))
    producer, reader = role_tokens["producer"], role_tokens["reader"]
    listed = {t["name"]: t for t in console.get("/v1/event-types", reader).json["items"]}
    assert listed["card.charged"]["problem"].startswith("at /properties/card/$ref: ")
    assert listed["card.refunded"]["problem"].startswith("at /$ref: ")
    assert console.get("/v1/event-types/card.refunded", reader).json["problem"].startswith("at /$ref: ")
    assert console.get("/v1/event-types/webhook.test", reader).json["problem"] is None
    env = {"DATABASE_URL": db}
    in_json = json.loads(cli("event-types", "list", "--json", env=env).stdout)
    cli_listed = {t["name"]: t["problem"] for t in in_json}
    assert cli_listed["card.charged"] == listed["card.charged"]["problem"]
    table = cli("event-types", "list", env=env)
    assert "at /$ref: " in table.stdout
    assert "2 event type(s) have a schema that cannot be used" in table.stderr
    page = logged_in(console, db, "reader").get("/console/event-types").body.decode()
    assert page.count('<span class="status status-dead_letter">cannot be used</span>') == 2

    answers: list[Answer] = []
    for attempt in range(2):  # the second time with the entries this process kept
        for name in ("card.charged", "card.refunded"):
            guess = {"event_type": name, "payload": {"card": "guess"}}
            refused = console.post("/v1/messages", producer, guess)
            assert refused.status == 422 and refused.json["field"] == "event_type", refused.body
            assert f"the schema of event type \"{name}\" cannot be used (at /" in refused.json["detail"]
            assert "an administrator must replace it (event-types set)" in refused.json["detail"]
            answers.append(refused)
        batch = console.post("/v1/messages/batch", producer, {"messages": [
            {"event_type": "card.refunded", "payload": {}}, {"event_type": "other.type", "payload": {}}]})
        refused_one, queued = batch.json["results"]
        assert refused_one["status"] == 422 and "cannot be used" in refused_one["detail"], attempt
        assert queued["created"] is False  # no subscriber: other.type is not a card.* type
        answers.append(batch)
        # a made-up token of the right shape is refused before any check
        assert console.post("/v1/messages", "whk_" + "x" * 43,
                            {"event_type": "card.refunded", "payload": {}}).status == 401
    assert receiver.requests == []
    assert all(SECRET not in answer.body.decode() for answer in answers)
    assert query(db, "SELECT count(*) FROM webhooks.alert_delivery_queue") == [(0,)]
    # replaced by an admin, it checks payloads again
    admin = make_token(db, "admin")
    fixed = console.request("PUT", "/v1/event-types/card.refunded", admin,
                            {"schema": {"$defs": {"card": {"type": "string"}},
                                        "properties": {"card": {"$ref": "#/$defs/card"}}}})
    assert fixed.status == 200 and fixed.json["problem"] is None, fixed.body
    refused = console.post("/v1/messages", producer, {"event_type": "card.refunded", "payload": {"card": 7}})
    assert refused.status == 422
    assert refused.json["detail"].startswith("payload: at /card: expected a string, got the number 7")
    assert console.post("/v1/messages", producer,
                        {"event_type": "card.refunded", "payload": {"card": "c"}}).status == 202


def test_a_schema_nested_too_deep_is_refused_with_422_and_the_cli_exits_2_without_a_traceback(api, db,
                                                                                               role_tokens):
    schema: dict[str, object] = {"type": "object"}
    for _ in range(100):  # crashed `event-types set` (RecursionError) and answered 500
        schema = {"properties": {"a": schema}}
    refused = api.request("PUT", "/v1/event-types/deep.type", role_tokens["admin"], {"schema": schema})
    assert refused.status == 422, refused.body
    assert refused.json["detail"] == "schema: nested more than 64 deep (objects and arrays within each other)"
    said = cli("event-types", "set", "deep.type", "--schema", json.dumps(schema), env={"DATABASE_URL": db})
    assert said.returncode == 2 and "Traceback" not in said.stderr, said.stderr
    assert said.stderr.strip() == "webhook-worker: --schema: nested more than 64 deep (objects and arrays " \
                                  "within each other)"
    large = api.request("PUT", "/v1/event-types/large.type", role_tokens["admin"],
                        {"schema": {"enum": [f"value-{i:06d}" for i in range(10_000)]}})
    assert large.status == 422 and "bytes of JSON text; at most 65536" in large.json["detail"], large.body
    doubling: dict[str, object] = {"l0": {"type": "string"}}
    for i in range(1, 19):  # 2 KB; took 9.7 s a publish
        doubling[f"l{i}"] = {"allOf": [{"$ref": f"#/$defs/l{i - 1}"}, {"$ref": f"#/$defs/l{i - 1}"}]}
    expanding = api.request("PUT", "/v1/event-types/doubling.type", role_tokens["admin"],
                            {"schema": {"$defs": doubling, "$ref": "#/$defs/l18"}})
    assert expanding.status == 422 and "its references expand it to more than 10000 schemas" in \
        expanding.json["detail"], expanding.body
    assert [catalogued(db, t) for t in ("deep.type", "large.type", "doubling.type")] == [[], [], []]


def _health_while(server: ApiServer, publish: dict[str, object], token: str) -> tuple[Answer, list[float]]:
    """Publish in a thread and ask /health over and over until it is answered: the publish's answer
    and how long each /health took."""
    answered: list[Answer] = []
    thread = threading.Thread(target=lambda: answered.append(server.post("/v1/messages", token, publish)))
    thread.start()
    waits: list[float] = []
    try:
        while thread.is_alive():
            started = time.monotonic()
            conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
            try:
                conn.request("GET", "/health")
                assert conn.getresponse().status == 200
            finally:
                conn.close()
            waits.append(time.monotonic() - started)
            time.sleep(0.05)
    finally:
        thread.join(120)
    return answered[0], waits


def test_a_check_past_its_budget_is_cut_off_while_health_answers_and_patterns_never_backtrack(db, receiver):
    add_endpoint(db, receiver.url("/hook"), name="hook", event_types=("list.*", "code.*"))
    query(db, "SELECT webhooks.upsert_event_type('list.sent', '', %s)", (json.dumps(UNIQUE),))
    query(db, "SELECT webhooks.upsert_event_type('code.sent', '', %s)",
          (json.dumps({"type": "string", "pattern": "^(a+)+$"}),))
    server = ApiServer(api_config(db, schema_validation_budget_seconds=2)).start()
    try:
        producer = make_token(db, "producer")
        # took 105 s with 30 a's on Python's engine, /health answering 408: RE2 answers at once
        code = server.post("/v1/messages", producer, {"event_type": "code.sent", "payload": "a" * 40 + "!"})
        assert code.status == 422 and 'does not match the pattern "^(a+)+$"' in code.json["detail"], code.body
        refused, waits = _health_while(server, {"event_type": "list.sent", "payload": HOSTILE}, producer)
        assert refused.status == 422 and refused.json["field"] == "payload", refused.body
        assert refused.json["detail"] == ('payload: not checked against the schema of event type "list.sent" '
                                          "within api.schema_validation_budget_seconds (2 s, for the "
                                          "request's payloads together)")
        # /health was asked throughout the check and never waited for it (each 10 s at most; on the
        # event loop, the check held it for minutes)
        assert len(waits) >= 2 and max(waits) < 10, waits
        assert "webhook_api_schema_checks_over_budget_total 1.0" in server.metrics()
        # the next check gets a new process
        assert server.post("/v1/messages", producer,
                           {"event_type": "list.sent", "payload": [1, 2, 3]}).status == 202
        # a made-up token is refused before its payload is checked: no check, no time spent
        hostile = {"event_type": "list.sent", "payload": HOSTILE}
        made_up = server.post("/v1/messages", "whk_" + "y" * 43, hostile)
        assert made_up.status == 401
        assert "webhook_api_schema_checks_over_budget_total 1.0" in server.metrics()
    finally:
        server.stop()
    assert query(db, "SELECT count(*) FROM webhooks.alert_delivery_queue") == [(1,)]


def test_a_made_up_token_is_refused_before_its_body_is_read(db, receiver, role_tokens):
    add_endpoint(db, receiver.url("/hook"), name="hook", event_types=("order.*",))
    server = ApiServer(api_config(db, body_timeout_seconds=300, max_body_bytes=16 * 1024 * 1024)).start()
    try:
        producer = role_tokens["producer"]
        message = {"event_type": "order.created", "payload": {"n": 1}}
        assert server.post("/v1/messages", producer, message).status == 202  # the type's entry is kept
        for path in ("/v1/messages", "/v1/messages/batch"):
            # the head of a 10 MB body, none of the body: the answer comes without it
            with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
                sock.sendall(f"POST {path} HTTP/1.1\r\nHost: api\r\nContent-Type: application/json\r\n"
                             f"Authorization: Bearer whk_{'z' * 43}\r\n"
                             "Content-Length: 10000000\r\n\r\n".encode())
                head = sock.recv(65536).decode(errors="replace")
            assert head.startswith("HTTP/1.1 401 "), head
        # a token in use is checked by the publish's own statement, as before
        assert server.post("/v1/messages/batch", producer, {"messages": [message]}).status == 202
    finally:
        server.stop()
