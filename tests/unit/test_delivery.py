"""The pure parts of the HTTP side: what may be logged, what is stored, which headers are sent."""

import asyncio
import json
import socket
import threading
import time
import uuid
from datetime import UTC, datetime

import aiohttp
import pytest
from aiohttp.client_reqrep import ConnectionKey

from tests.faults import misbehaving
from tests.faults.misbehaving import TcpServer
from tests.support import TEST_KEYRING
from worker import encryption
from worker.daemon.sender import (
    Sender,
    carries_transport_text,
    dropped_keepalive,
    error_text,
    excerpt_text,
    request_headers,
    transport_failure,
)
from worker.rules import signing
from worker.rules.classification import Category, RetrySchedule
from worker.rules.destinations import url_problem
from worker.rules.model import Claimed
from worker.rules.redaction import display_url
from worker.store.queue import _claimed


@pytest.mark.parametrize(
    ("url", "shown"),
    [("https://hooks.slack.com/services/T0/B0/SECRET", "https://hooks.slack.com"),
     ("http://user:pw@127.0.0.1:8080/x?token=s", "http://127.0.0.1:8080"),
     ("http://[::1]:9000/a", "http://[::1]:9000"),
     ("http://[::1/broken", "(invalid URL)")],
)
def test_display_url_keeps_only_scheme_host_and_port(url, shown):
    assert display_url(url) == shown


def test_excerpt_is_at_most_1024_bytes_of_text_without_nul():
    text = excerpt_text(b"\xff\x00" * 1000, "https://x.test/hook")
    assert len(text.encode()) <= 1024 and "\x00" not in text
    cut = excerpt_text("é".encode() * 600, "https://x.test/hook")  # 1200 bytes: cut on a character boundary
    assert len(cut.encode()) <= 1024 and cut == "é" * 512


def test_the_excerpt_quotes_no_secret_of_the_url_not_even_one_cut_off_at_its_end():
    url = "https://hooks.example.test/in/T0/B0/SECRETPATHTOKENé?token=SECRETQUERYVALUE"
    page = b"<pre>Cannot POST /in/T0/B0/SECRETPATHTOKEN%C3%A9?token=SECRETQUERYVALUE</pre>"
    assert excerpt_text(page, url) == "<pre>Cannot POST [redacted]</pre>"
    # the body went on: what was read ends inside the path, even inside its é (the first of its
    # two bytes), and that start of a secret goes too
    padding = b"x" * 990
    head = padding + "/in/T0/B0/SECRETPATHTOKENé".encode()[:-1]
    assert head.endswith(b"SECRETPATHTOKEN\xc3")
    assert excerpt_text(head, url, cut=True) == padding.decode() + "[redacted]"
    # cut inside its percent-encoded form
    cut = page[:page.index(b"%C3") + 1]
    assert cut.endswith(b"/SECRETPATHTOKEN%") and "SECRET" not in excerpt_text(cut, url, cut=True)
    # a whole body (not cut) ending in a piece that is no secret keeps it
    assert excerpt_text(padding + b"/in/T0/B0/", url) == padding.decode() + "/in/T0/B0/"


def key() -> ConnectionKey:
    return ConnectionKey("hooks.example.test", 443, True, True, None, None, None)


@pytest.mark.parametrize(
    ("exc", "category"),
    [(TimeoutError(), Category.TIMEOUT),
     (aiohttp.ClientConnectorDNSError(key(), socket.gaierror(-2, "Name or service not known")), Category.DNS),
     (aiohttp.ClientConnectorError(key(), ConnectionRefusedError(111, "refused")), Category.CONNECT),
     (aiohttp.ClientConnectorError(key(), ConnectionRefusedError(111, "Connect call failed /SECRET")),
      Category.CONNECT),
     (aiohttp.ServerDisconnectedError(), Category.CONNECT),
     (aiohttp.ClientOSError(104, "Can not write request body for https://x.test/SECRET"), Category.CONNECT),
     (aiohttp.ClientOSError(None, "Can not write request body for https://x.test/SECRET"), Category.CONNECT),
     (aiohttp.ClientPayloadError("https://x.test/SECRET"), Category.CONNECT),
     (OSError(None, "https://x.test/SECRET"), Category.CONNECT),
     (aiohttp.InvalidUrlClientError("https://x.test/SECRET"), Category.INTERNAL),
     (RuntimeError("https://x.test/SECRET"), Category.INTERNAL)],
)
def test_transport_failures_are_categorised_without_echoing_the_url(exc, category):
    found, message = transport_failure(exc)
    assert found is category
    assert "SECRET" not in message


def test_an_invalid_http_answer_is_a_protocol_failure_without_the_parser_s_400():
    exc = aiohttp.ClientResponseError(None, (), status=400, message="Bad status line 'SECRET'")  # type: ignore[arg-type]
    category, message = transport_failure(exc)
    assert (category, message) == (Category.PROTOCOL, "invalid HTTP response")


def test_an_os_error_is_described_by_its_errno_not_its_text():
    _, message = transport_failure(aiohttp.ClientOSError(104, "Can not write request body for /SECRET"))
    assert message == "ClientOSError: Connection reset by peer"


def write_failure_on_a_dropped_keepalive_connection(url: str, closed: threading.Event) -> BaseException:
    """What a dropped keep-alive connection raises: the receiver closes a kept-alive connection just
    as the client sends on it; aiohttp raises ClientOSError("Can not write request body for <url>").
    Made certain here: the second request, on the kept-alive connection, holds the event loop until
    the receiver has hung up, so the loop sees the hang-up in the same round as it schedules the
    request's write."""
    requests = 0

    async def hold_until_closed(session: object, context: object, params: object) -> None:
        nonlocal requests
        requests += 1
        if requests == 2:
            # blocking on purpose: the FIN reaches the socket while the loop cannot see it
            assert closed.wait(10), "the receiver never hung up"
            time.sleep(0.05)  # noqa: ASYNC251 - loopback delivery of the FIN, with the loop held
            await asyncio.sleep(0)

    async def run() -> BaseException:
        trace = aiohttp.TraceConfig()
        trace.on_request_headers_sent.append(hold_until_closed)
        async with aiohttp.ClientSession(trace_configs=[trace]) as session:
            async with session.post(url, data=b"{}") as first:
                await first.read()
            with pytest.raises(aiohttp.ClientOSError) as caught:
                async with session.post(url, data=b"{}"):
                    pass
            return caught.value

    return asyncio.run(run())


def test_a_real_write_failure_on_a_dropped_keepalive_connection_is_described_without_its_url():
    closed = threading.Event()
    server = TcpServer(misbehaving.answers_once_then_closes(0.3, closed)).start()
    try:
        url = server.url("/services/T0/B0/SECRETPATH?t=SECRETQUERY")
        exc = write_failure_on_a_dropped_keepalive_connection(url, closed)
    finally:
        server.stop()
    assert "SECRETPATH" in str(exc) and "SECRETQUERY" in str(exc)  # aiohttp's own text holds the URL
    category, message = transport_failure(exc)
    assert (category, message) == (Category.CONNECT, "ClientOSError")
    assert error_text(exc) == "ClientOSError" and carries_transport_text(exc)
    # no socket opened for the request: it went out on the kept-alive connection, and is sent again
    assert dropped_keepalive(exc, opened_sockets=0)
    assert not dropped_keepalive(exc, opened_sockets=1)


@pytest.mark.parametrize(
    ("exc", "again"),
    [(aiohttp.ServerDisconnectedError(), True),
     (aiohttp.ClientOSError(104, "reset"), True),
     (aiohttp.ClientConnectionResetError("Cannot write to closing transport"), True),
     # part of an answer arrived: the receiver saw the request
     (aiohttp.ServerDisconnectedError(object()), False),  # type: ignore[arg-type]
     (aiohttp.ClientConnectorError(key(), ConnectionRefusedError(111, "refused")), False),
     (TimeoutError(), False),
     (aiohttp.ClientResponseError(None, (), status=400), False)],  # type: ignore[arg-type]
)
def test_only_a_kept_alive_connection_closed_before_the_answer_is_sent_again(exc, again):
    assert dropped_keepalive(exc, opened_sockets=0) is again


def test_an_unexpected_error_keeps_its_message_unless_it_comes_from_the_transport():
    assert error_text(ValueError("a signing secret is 'whsec_' followed by base64\nmore")) == (
        "ValueError: a signing secret is 'whsec_' followed by base64")
    try:
        try:
            raise aiohttp.ClientOSError(None, "Can not write request body for https://x.test/SECRET")
        except aiohttp.ClientError as inner:
            raise RuntimeError(f"wrapped: {inner}") from inner
    except RuntimeError as outer:
        assert carries_transport_text(outer) and error_text(outer) == "RuntimeError"


def test_request_headers_are_signed_and_custom_headers_cannot_replace_ours():
    secret = signing.generate_secret()
    row = Claimed(
        delivery_id=7, endpoint_id=1, event_id="evt_1", idempotency_key="evt_1", event_type="alert.created",
        body=b'{"a": 1}', attempt=2, max_attempts=10, lease_token=uuid.uuid4(),
        locked_until=datetime.now(UTC), url="https://x.test/", signing_secrets=(secret,),
        headers={"X-Team": "ops", "webhook-id": "forged"}, timeout_seconds=None,
        schedule=RetrySchedule(), traceparent="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    )
    headers = request_headers(row, 1_700_000_000, row.body)
    assert headers["webhook-id"] == "evt_1" and headers["X-Team"] == "ops"
    assert headers["webhook-attempt"] == "2" and headers["webhook-delivery-id"] == "7"
    assert headers["traceparent"] == row.traceparent
    signing.verify(secret, headers, row.body, now=1_700_000_000)


def test_stored_headers_the_registration_rules_refuse_are_never_sent():
    # written before the rules existed, or by hand in SQL; sealed as the product seals them
    stored = {"Transfer-Encoding": "chunked", "Connection": "close", "Proxy-Authorization": "x",
              "X-A B": "1", "X-Naïve": "1", "X-Split": "a\r\nX-Injected: 1", "X-Team": "ops"}
    now = datetime.now(UTC)
    row = {"delivery_id": 7, "webhook_id": 3, "event_id": "evt_1", "idempotency_key": "evt_1",
           "event_type": "alert.created", "attempt": 1, "max_attempts": 10, "lease_token": uuid.uuid4(),
           "locked_until": now, "endpoint_url": TEST_KEYRING.seal("https://x.test/", encryption.URL, 3),
           "signing_secrets": "[]", "headers": json.dumps(TEST_KEYRING.seal_headers(stored, 3)),
           "timeout_ms": None, "retry_schedule": None, "retry_jitter": 0.2, "body_format": "raw",
           "secret_settings": "{}", "retry_policy": "{}", "payload": "{}", "traceparent": None,
           "created_at": now}
    claimed = _claimed(row, TEST_KEYRING, {})
    assert claimed.problem is None
    sent = request_headers(claimed, 1_700_000_000, claimed.body)
    assert [name for name in sent if name in stored] == ["X-Team"]


def claimed_row(endpoint_id: int, url: str) -> dict:
    """A row as webhooks.acquire() returns it, its URL sealed to its endpoint."""
    now = datetime.now(UTC)
    return {"delivery_id": 7, "webhook_id": endpoint_id, "event_id": "evt_1", "idempotency_key": "evt_1",
            "event_type": "alert.created", "attempt": 1, "max_attempts": 10, "lease_token": uuid.uuid4(),
            "locked_until": now, "endpoint_url": TEST_KEYRING.seal(url, encryption.URL, endpoint_id),
            "signing_secrets": "[]", "headers": "{}", "timeout_ms": None, "retry_schedule": None,
            "retry_jitter": 0.2, "body_format": "raw", "secret_settings": "{}", "retry_policy": "{}",
            "payload": "{}", "traceparent": None, "created_at": now}


def test_the_url_check_is_remembered_by_endpoint_and_url_version_never_by_the_url():
    # Nothing keeps a URL (which may carry a token) for the sake of speed: the module's check is
    # not cached, and the sender remembers answers by endpoint id and a digest of the stored URL.
    assert not hasattr(url_problem, "cache_info")
    token_url = "https://hooks.example.com/services/T0/B0/tok3nTOK3Ntok3n"
    first = _claimed(claimed_row(4, token_url), TEST_KEYRING, {})
    sender = Sender(1)
    assert sender.url_problem(first) is None
    assert "tok3n" not in repr(sender._url_problems) and first.url_version
    # The URL changed to a refused one: a new version, checked again, for the same endpoint.
    changed = _claimed(claimed_row(4, "http://10.0.0.1/hook"), TEST_KEYRING, {})
    assert changed.url_version != first.url_version
    assert "not a public address" in (sender.url_problem(changed) or "")
