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
from tests.support import add_endpoint, enqueue, eventually, query, statuses, wait_final

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


# What the schema refuses (sql/migrations/001_baseline.sql, sql/functions/enqueue.sql): an empty
# event type; an event type over 256 bytes or a key over 512 (they travel in headers); control
# characters in either (the constraint refuses [[:cntrl:]], which in every locale includes ASCII's);
# NUL anywhere (PostgreSQL text cannot hold it); a payload over max_payload_bytes (256 KiB by
# default, far above what is generated here).
EVENT_TYPE_BYTES, KEY_BYTES = 256, 512


def _has_ascii_control(text: str) -> bool:
    return any(ord(c) < 32 or ord(c) == 127 for c in text)


def _strings_in(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, list):
        for item in value:
            yield from _strings_in(item)
    elif isinstance(value, dict):
        for key, item in value.items():
            yield key
            yield from _strings_in(item)


def _verdict(event_type: str, key: str | None, payload) -> tuple[set[str], set[str]]:
    """The markers of the errors the input must be refused with (empty: it must be stored), and
    of those it may be refused with for text whose refusal depends on the locale's [[:cntrl:]]
    (non-printable characters that are not ASCII controls: C1 controls, format characters, other
    spaces). Printable text (str.isprintable) within the limits must be stored."""
    required: set[str] = set()
    if event_type == "":
        required.add("alert_delivery_queue_event_type_check")
    if _has_ascii_control(event_type) or len(event_type.encode()) > EVENT_TYPE_BYTES:
        required.add("event_type_printable")
    if key is not None and (_has_ascii_control(key) or len(key.encode()) > KEY_BYTES):
        required.add("idempotency_key_printable")
    if "\0" in event_type or (key is not None and "\0" in key):
        required.add("cannot contain NUL")  # refused by psycopg before it is sent
    if any("\0" in text for text in _strings_in(payload)):
        required.add("unsupported Unicode escape sequence")
    possible: set[str] = set()
    if not event_type.isprintable():
        possible.add("event_type_printable")
    if key is not None and not key.isprintable():
        possible.add("idempotency_key_printable")
    return required, possible


def _assert_refused_with(exc: psycopg.Error, markers: set[str]) -> None:
    assert _is_clear(exc), f"{type(exc).__name__}: {exc}"
    text = f"{exc} {exc.diag.constraint_name or ''}"
    assert any(marker in text for marker in markers), f"{type(exc).__name__}: {exc}; expected {markers}"


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(event_type=st.text(max_size=300),
       key=st.none() | st.text(max_size=600), payload=json_values)
def test_enqueue_stores_exactly_what_it_was_given_or_refuses_it_clearly(db, endpoint, event_type, key,
                                                                        payload):
    if key is not None:
        key = f"{uuid.uuid4().hex}{key}"  # examples share the database: a repeated key would deduplicate
    required, possible = _verdict(event_type, key, payload)
    with psycopg.connect(db, autocommit=True) as conn:
        try:
            row = conn.execute("SELECT webhooks.enqueue(%s, %s, %s::jsonb, %s)",
                               (endpoint, event_type, json.dumps(payload), key)).fetchone()
        except psycopg.Error as exc:
            # printable text within the limits and a payload PostgreSQL can hold must be stored
            assert required or possible, f"refused what must be stored: {type(exc).__name__}: {exc}"
            _assert_refused_with(exc, required | possible)
            return
        assert not required, f"stored what must be refused ({required})"
        assert row is not None
        stored = conn.execute("SELECT event_type, idempotency_key, payload FROM webhooks.deliveries"
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


def _refuse_constant(name: str):
    raise ValueError(name)


def _as_json(text: str):
    """The value of a JSON document PostgreSQL must take (RFC 8259, no NaN or Infinity, no NUL or
    lone surrogate in a string), or None if it is not one."""
    try:
        value = json.loads(text, parse_constant=_refuse_constant)
        for string in _strings_in(value):
            string.encode()  # a lone surrogate cannot be encoded
    except (ValueError, UnicodeEncodeError):
        return None
    if any("\0" in string for string in _strings_in(value)):
        return None
    return (value,)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(max_size=200) | json_values.map(json.dumps)
       | json_values.map(lambda v: json.dumps(v, ensure_ascii=False, indent=1)))
def test_a_plain_insert_of_any_text_as_a_payload_is_stored_or_refused_clearly(db, endpoint, text):
    document = _as_json(text)
    with psycopg.connect(db, autocommit=True) as conn:
        try:
            [(delivery_id,)] = conn.execute(
                "INSERT INTO webhooks.alert_delivery_queue (webhook_id, event_type, payload)"
                " VALUES (%s, 'alert.created', %s) RETURNING delivery_id", (endpoint, text)).fetchall()
        except psycopg.Error as exc:
            assert document is None, f"refused a JSON document: {type(exc).__name__}: {exc}"
            assert _is_clear(exc), f"{type(exc).__name__}: {exc}"
            return
        [(stored,)] = conn.execute("SELECT payload FROM webhooks.deliveries WHERE delivery_id = %s",
                                   (delivery_id,)).fetchall()
    assert document is not None, f"stored what is not JSON: {text!r}"
    assert _numbers_as_floats(stored) == _numbers_as_floats(document[0])


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
    wait_final(db, ids, message="every payload final")
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
    wait_final(db, [too_deep, fine], message="both rows final")
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
