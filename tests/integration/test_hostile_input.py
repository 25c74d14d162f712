"""Hostile input: whatever producers and operators send gets a clear outcome and loses nothing."""

import base64
import json
import uuid

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.acceptance.test_cli import cli
from tests.receiver import Reply
from tests.support import add_endpoint, all_final, enqueue, eventually, query, statuses

# The errors a producer may see from enqueue, each naming its problem; anything else is a bug.
CLEAR_ERRORS = {
    psycopg.errors.CheckViolation: ("event_type_printable", "idempotency_key_printable",
                                    "alert_delivery_queue_event_type_check"),
    psycopg.errors.ProgramLimitExceeded: ("webhook payload is",),
    # a NUL cannot be stored in PostgreSQL text or jsonb
    psycopg.errors.UntranslatableCharacter: ("unsupported Unicode escape sequence",),
    psycopg.errors.InvalidTextRepresentation: ("invalid input syntax for type json",),
    # refused by psycopg before it is sent
    psycopg.DataError: ("cannot contain NUL",),
}

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=50),
    lambda children: st.lists(children, max_size=5)
    | st.dictionaries(st.text(max_size=10), children, max_size=5),
    max_leaves=30,
)


def _is_clear(exc: psycopg.Error) -> bool:
    for kind, markers in CLEAR_ERRORS.items():
        if isinstance(exc, kind):
            text = f"{exc} {exc.diag.constraint_name or ''}"
            return any(marker in text for marker in markers)
    return False


@pytest.fixture
def endpoint(db, receiver):
    return add_endpoint(db, receiver.url("/hostile"))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(event_type=st.text(max_size=300), key=st.none() | st.text(max_size=600), payload=json_values)
def test_enqueue_stores_exactly_what_it_was_given_or_refuses_it_clearly(db, endpoint, event_type, key,
                                                                        payload):
    if key is not None:
        key = f"{uuid.uuid4().hex}{key}"  # examples share the database: a repeated key would deduplicate
    with psycopg.connect(db, autocommit=True) as conn:
        try:
            row = conn.execute("SELECT webhooks.enqueue(%s, %s, %s::jsonb, %s)",
                               (endpoint, event_type, json.dumps(payload), key)).fetchone()
        except psycopg.Error as exc:
            assert _is_clear(exc), f"{type(exc).__name__}: {exc}"
            return
        assert row is not None
        stored = conn.execute("SELECT event_type, idempotency_key, payload FROM webhooks.alert_delivery_queue"
                              " WHERE delivery_id = %s", row).fetchone()
    assert stored is not None
    assert stored[0] == event_type
    assert key is None or stored[1] == key
    # jsonb keeps numbers as decimals (1e16 comes back as 10000000000000000): compare their values
    assert _numbers_as_floats(stored[2]) == _numbers_as_floats(json.loads(json.dumps(payload)))


def _numbers_as_floats(value):
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, list):
        return [_numbers_as_floats(v) for v in value]
    return {k: _numbers_as_floats(v) for k, v in value.items()}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(max_size=200))
def test_a_plain_insert_of_any_text_as_a_payload_is_stored_or_refused_clearly(db, endpoint, text):
    with psycopg.connect(db, autocommit=True) as conn:
        try:
            conn.execute("INSERT INTO webhooks.alert_delivery_queue (webhook_id, event_type, payload)"
                         " VALUES (%s, 'alert.created', %s)", (endpoint, text))
        except psycopg.Error as exc:
            assert _is_clear(exc), f"{type(exc).__name__}: {exc}"


def test_hostile_payloads_are_delivered_as_they_were_queued_and_the_worker_keeps_going(
        db, receiver, spawn):
    receiver.script("/payloads", *[Reply(200)] * 10)
    endpoint = add_endpoint(db, receiver.url("/payloads"))
    deep = "[" * 200 + '"bottom"' + "]" * 200
    payloads = ['"just a string"', "42", "null", "true", "[]", deep,
                json.dumps({"s": "\u202e\ufeff\U0001f4a5 line\r\nbreak", "n": 1e308}),
                json.dumps({"big": "x" * 250_000})]
    ids = [query(db, "SELECT webhooks.enqueue(%s, 'alert.created', %s::jsonb)", (endpoint, p))[0][0]
           for p in payloads]
    worker = spawn(db)
    eventually(lambda: all_final(db, ids), message="every payload final")
    assert set(statuses(db, ids).values()) == {"delivered"}
    received = sorted(receiver.to("/payloads"), key=lambda r: r.delivery_id)
    assert [_numbers_as_floats(json.loads(r.body)) for r in received] == [
        _numbers_as_floats(json.loads(p)) for p in payloads]
    assert worker.process.poll() is None


def test_a_payload_too_deep_to_render_is_a_dead_letter_at_once_and_the_worker_keeps_going(
        db, receiver, spawn):
    receiver.script("/deep", Reply(200))
    endpoint = add_endpoint(db, receiver.url("/deep"), body_format="envelope")
    deep = "[" * 3000 + "1" + "]" * 3000
    [(too_deep,)] = query(db, "SELECT webhooks.enqueue(%s, 'alert.created', %s::jsonb)", (endpoint, deep))
    [fine] = enqueue(db, endpoint, {"ok": True})
    worker = spawn(db)
    worker.expect_errors("payload cannot be rendered")
    eventually(lambda: all_final(db, [too_deep, fine]), message="both rows final")
    assert statuses(db, [too_deep, fine]) == {too_deep: "dead_letter", fine: "delivered"}
    [(attempts, reason)] = query(db, "SELECT attempts, last_error FROM webhooks.alert_delivery_queue"
                                 " WHERE delivery_id = %s", (too_deep,))
    assert attempts == 1 and reason.startswith("cannot render as envelope: payload: nested too deeply")
    assert worker.process.poll() is None
    assert not [line for line in worker.log_lines() if "Traceback" in json.dumps(line)]


HOSTILE_URLS = [
    ("file:///etc/passwd", "scheme 'file' is not allowed"),
    ("gopher://127.0.0.1:25/_HELO", "scheme 'gopher' is not allowed"),
    ("javascript:alert(1)", "scheme 'javascript' is not allowed"),
    ("http://127.0.0.1:8080/admin", "not a public address"),
    ("http://2130706433/", "not a public address"),
    ("http://0177.0.0.1/", "not a public address"),
    ("http://[::1]:5432/", "not a public address"),
    ("http://[::ffff:169.254.169.254]/latest/meta-data/", "not a public address"),
    ("http://localhost:8080/", "resolves to a refused address"),
    ("http://hooks.example.test/a\r\nX-Injected: 1", "whitespace or control characters"),
    ("http://[::1/", "not a valid URL"),
]


@pytest.mark.parametrize("url, problem", HOSTILE_URLS)
def test_the_cli_refuses_hostile_urls_naming_the_problem(db, url, problem):
    result = cli("endpoints", "add", "--name", "hostile", "--url", url, env={"DATABASE_URL": db})
    assert result.returncode == 2
    assert problem in result.stderr and "Traceback" not in result.stderr
    assert query(db, "SELECT count(*) FROM webhooks.endpoints") == [(0,)]


def test_credentials_in_a_url_are_sent_as_basic_auth_and_kept_out_of_logs_and_output(db, receiver, spawn):
    url = receiver.url("/basic").replace("http://", "http://hook-user:PASSWORDCANARY@")
    added = cli("endpoints", "add", "--name", "basic", "--url", url,
                env={"DATABASE_URL": db, "WEBHOOK_WORKER_SECURITY__ALLOW_NETWORKS": "[127.0.0.1/32]"})
    assert added.returncode == 0, added.stderr
    query(db, "SELECT webhooks.enqueue(1, 'alert.created', '{}')")
    worker = spawn(db, logging={"level": "debug"})
    eventually(lambda: receiver.to("/basic"), message="delivered")
    [request] = receiver.to("/basic")
    credentials = base64.b64encode(b"hook-user:PASSWORDCANARY").decode()
    assert request.headers["authorization"] == f"Basic {credentials}"
    worker.stop()
    for text in (added.stdout, added.stderr, worker.log_path.read_text()):
        assert "PASSWORDCANARY" not in text
