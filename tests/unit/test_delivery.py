"""The pure parts of the HTTP side: what may be logged, what is stored, which headers are sent."""

import socket
import uuid
from datetime import UTC, datetime

import aiohttp
import pytest
from aiohttp.client_reqrep import ConnectionKey

from worker import signing
from worker.delivery import display_url, excerpt_text, request_headers, transport_failure
from worker.policy import Category, RetrySchedule
from worker.queue import Claimed


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
    text = excerpt_text(b"\xff\x00" * 1000)
    assert len(text.encode()) <= 1024 and "\x00" not in text
    cut = excerpt_text("é".encode() * 600)  # 1200 bytes: cut on a character boundary
    assert len(cut.encode()) <= 1024 and cut == "é" * 512


def key() -> ConnectionKey:
    return ConnectionKey("hooks.example.test", 443, True, True, None, None, None)


@pytest.mark.parametrize(
    ("exc", "category"),
    [(TimeoutError(), Category.TIMEOUT),
     (aiohttp.ClientConnectorDNSError(key(), socket.gaierror(-2, "Name or service not known")), Category.DNS),
     (aiohttp.ClientConnectorError(key(), ConnectionRefusedError(111, "refused")), Category.CONNECT),
     (aiohttp.ServerDisconnectedError(), Category.CONNECT),
     (aiohttp.InvalidUrlClientError("https://x.test/SECRET"), Category.INTERNAL),
     (RuntimeError("https://x.test/SECRET"), Category.INTERNAL)],
)
def test_transport_failures_are_categorised_without_echoing_the_url(exc, category):
    found, message = transport_failure(exc)
    assert found is category
    assert "SECRET" not in message


def test_request_headers_are_signed_and_custom_headers_cannot_replace_ours():
    secret = signing.generate_secret()
    row = Claimed(
        delivery_id=7, webhook_id=1, event_id="evt_1", idempotency_key="evt_1", event_type="alert.created",
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
