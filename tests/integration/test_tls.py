"""HTTPS receivers with certificates from a throwaway CA: every certificate is verified, and a
private CA is trusted only when security.ca_bundle_file names it."""

from __future__ import annotations

import json
import ssl
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import trustme

from tests.receiver import Receiver
from tests.support import add_endpoint, enqueue, query, wait_final
from worker.config import load_config
from worker.errors import ConfigError


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
def ca_file(ca: trustme.CA, tmp_path: Path) -> str:
    path = tmp_path / "private-ca.pem"
    ca.cert_pem.write_to_path(str(path))
    return str(path)


@pytest.fixture
def https_receivers() -> Iterator[list[Receiver]]:
    started: list[Receiver] = []
    yield started
    for receiver in started:
        receiver.stop()


def serve(started: list[Receiver], cert: trustme.LeafCert) -> Receiver:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    cert.configure_cert(context)
    receiver = Receiver(tls=context).start()
    started.append(receiver)
    return receiver


def outcome(db: str, delivery_id: int) -> tuple[str, str | None]:
    [(status, category)] = query(db, "SELECT status, failure_category FROM webhooks.alert_delivery_queue"
                                 " WHERE delivery_id = %s", (delivery_id,))
    return status, category


def test_only_a_certificate_valid_for_the_host_from_a_trusted_ca_delivers(
        db, spawn, ca, ca_file, https_receivers):
    now = datetime.now(UTC)
    receivers = {
        "valid": serve(https_receivers, ca.issue_cert("127.0.0.1")),
        "untrusted CA": serve(https_receivers, trustme.CA().issue_cert("127.0.0.1")),
        "expired": serve(https_receivers, ca.issue_cert(
            "127.0.0.1", not_before=now - timedelta(days=10), not_after=now - timedelta(days=1))),
        "another host": serve(https_receivers, ca.issue_cert("hooks.example.test")),
    }
    rows = {case: enqueue(db, add_endpoint(db, receiver.url("/tls"), max_attempts=1))[0]
            for case, receiver in receivers.items()}
    spawn(db, security={"ca_bundle_file": ca_file, "require_https": True})
    wait_final(db, list(rows.values()), message="every row final")
    assert {case: outcome(db, row) for case, row in rows.items()} == {
        "valid": ("delivered", None),
        "untrusted CA": ("dead_letter", "tls"),
        "expired": ("dead_letter", "tls"),
        "another host": ("dead_letter", "tls"),
    }
    # a failed handshake never reaches HTTP: no receiver but the valid one saw a request
    assert {case: len(receiver.requests) for case, receiver in receivers.items()} == {
        "valid": 1, "untrusted CA": 0, "expired": 0, "another host": 0}


def test_a_private_ca_is_not_trusted_unless_configured(db, spawn, ca, https_receivers):
    receiver = serve(https_receivers, ca.issue_cert("127.0.0.1"))
    [row] = enqueue(db, add_endpoint(db, receiver.url("/tls"), max_attempts=1))
    spawn(db)
    wait_final(db, [row], message="row final")
    assert outcome(db, row) == ("dead_letter", "tls")
    assert receiver.requests == []


def test_a_ca_bundle_that_cannot_be_loaded_is_named_at_start(tmp_path):
    not_pem = tmp_path / "ca.pem"
    not_pem.write_text("not a certificate\n")
    for path, reason in ((tmp_path / "missing.pem", "No such file or directory"),
                         (not_pem, "not PEM certificates")):
        with pytest.raises(ConfigError) as caught:
            load_config(None, environ={"DATABASE_URL": "postgresql://db/x",
                                       "WEBHOOK_WORKER_SECURITY__CA_BUNDLE_FILE": str(path)})
        said = f"security.ca_bundle_file: cannot be loaded: {reason} (got {json.dumps(str(path))})"
        assert str(caught.value) == said
