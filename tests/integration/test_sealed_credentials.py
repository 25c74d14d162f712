"""Credentials bound to their endpoint's row, values sealed before binding, and plaintext refused."""

import json

import pytest

from tests.acceptance.test_cli import cli
from tests.support import TEST_KEYRING, add_endpoint, enqueue, eventually, query, statuses, stored
from worker import encryption
from worker.encryption import DecryptionError
from worker.store.endpoints import InvalidEndpoint, update_endpoint

FAST_RETRY = {"delays": [0.2]}


def dead_letter_reason(db, delivery_id):
    [(status, reason)] = query(db, "SELECT status, dead_letter_reason FROM webhooks.alert_delivery_queue"
                                   " WHERE delivery_id = %s", (delivery_id,))
    return reason if status == "dead_letter" else None


def stored_url(db, endpoint):
    [(url,)] = query(db, "SELECT url FROM webhooks.endpoints WHERE id = %s", (endpoint,))
    return url


def test_a_sealed_url_copied_to_another_endpoints_row_does_not_open(db, receiver, spawn):
    victim = add_endpoint(db, receiver.url("/victim-private-path"))
    thief = add_endpoint(db, receiver.url("/thief"), max_attempts=1)
    # someone who may write the table (not holding the key) points one endpoint at another's URL
    query(db, "UPDATE webhooks.endpoints SET url = (SELECT url FROM webhooks.endpoints WHERE id = %s)"
              " WHERE id = %s", (victim, thief))
    with pytest.raises(DecryptionError, match="moved"):
        TEST_KEYRING.open(stored_url(db, thief), encryption.URL, thief)
    [delivery] = enqueue(db, thief)
    untouched = enqueue(db, victim)
    spawn(db).expect_errors("delivery cannot be attempted")
    reason = eventually(lambda: dead_letter_reason(db, delivery), message="the moved URL refused")
    assert "cannot be decrypted" in reason and "moved" in reason
    eventually(lambda: statuses(db, untouched) == {untouched[0]: "delivered"}, message="victim delivered")
    assert len(receiver.to("/victim-private-path")) == 1  # its own delivery only
    assert receiver.to("/thief") == []
    [(category,)] = query(db, "SELECT failure_category FROM webhooks.alert_delivery_log"
                              " WHERE delivery_id = %s", (delivery,))
    assert category == "internal"


def test_signing_secrets_and_headers_copied_between_endpoints_do_not_open(db, receiver):
    first = add_endpoint(db, receiver.url("/one"), headers={"Authorization": "Bearer one"})
    second = add_endpoint(db, receiver.url("/two"), headers={"Authorization": "Bearer two"})
    query(db, "UPDATE webhooks.endpoints t SET signing_secrets = s.signing_secrets, headers = s.headers"
              " FROM webhooks.endpoints s WHERE s.id = %s AND t.id = %s", (first, second))
    [(secrets, headers)] = query(db, "SELECT signing_secrets, headers FROM webhooks.endpoints WHERE id = %s",
                                 (second,))
    with pytest.raises(DecryptionError):
        TEST_KEYRING.open(secrets[0]["secret"], encryption.SIGNING_SECRET, second)
    with pytest.raises(DecryptionError):
        TEST_KEYRING.open_headers(headers, second)
    assert TEST_KEYRING.open_headers(headers, first) == {"Authorization": "Bearer one"}


def test_a_plaintext_url_is_refused_until_keys_rotate_seals_it(db, receiver, spawn):
    endpoint = add_endpoint(db, receiver.url("/legacy"), retry_schedule=FAST_RETRY, max_attempts=20)
    # a row written before sealing existed, or by hand in SQL
    query(db, "UPDATE webhooks.endpoints SET url = %s WHERE id = %s", (receiver.url("/legacy"), endpoint))
    [delivery] = enqueue(db, endpoint)
    worker = spawn(db)  # security.require_sealed is true by default
    worker.expect_errors("delivery cannot be attempted")

    def refused():
        rows = query(db, "SELECT failure_category, error FROM webhooks.alert_delivery_log"
                         " WHERE delivery_id = %s", (delivery,))
        return rows and rows[0]

    category, error = eventually(refused, message="an attempt refused")
    assert category == "internal"
    assert "stored unsealed" in error and "keys rotate" in error and "require_sealed" in error
    assert "/legacy" not in error
    assert receiver.to("/legacy") == []
    assert any("their deliveries are refused (security.require_sealed)" in line.get("event", "")
               for line in worker.log_lines())  # said at start-up, before any delivery

    rotated = cli("keys", "rotate", "--json", env={"DATABASE_URL": db})
    assert rotated.returncode == 0, rotated.stderr
    assert "plaintext" not in json.loads(rotated.stdout)["credentials_by_key"]
    assert TEST_KEYRING.is_bound(stored_url(db, endpoint), encryption.URL, endpoint)
    eventually(lambda: statuses(db, [delivery]) == {delivery: "delivered"}, message="delivered once sealed")
    assert len(receiver.to("/legacy")) == 1
    assert not any("/legacy" in line for line in worker.log_path.read_text().splitlines())


def test_require_sealed_false_delivers_a_plaintext_url(db, receiver, spawn):
    endpoint = add_endpoint(db, receiver.url("/plain"))
    query(db, "UPDATE webhooks.endpoints SET url = %s WHERE id = %s", (receiver.url("/plain"), endpoint))
    ids = enqueue(db, endpoint)
    spawn(db, security={"require_sealed": False})
    eventually(lambda: statuses(db, ids) == {ids[0]: "delivered"}, message="delivered")


def test_values_sealed_before_binding_still_deliver_and_keys_rotate_binds_them(db, receiver, spawn):
    endpoint = add_endpoint(db, receiver.url("/old"))
    other = add_endpoint(db, receiver.url("/other"), max_attempts=1)
    secret = "whsec_" + "QUJDREVGR0hJSktMTU5PUFFSU1RVVldY"
    # the form a worker before this change wrote: sealed, bound to the purpose only
    query(db, "UPDATE webhooks.endpoints SET url = %s, signing_secrets = %s WHERE id = %s",
          (TEST_KEYRING.seal(receiver.url("/old"), encryption.URL),
           json.dumps([{"secret": TEST_KEYRING.seal(secret, encryption.SIGNING_SECRET), "expires_at": None}]),
           endpoint))
    first = enqueue(db, endpoint)
    worker = spawn(db)
    eventually(lambda: statuses(db, first) == {first[0]: "delivered"}, message="a legacy value delivered")
    worker.stop()

    status = cli("keys", "status", "--json", env={"DATABASE_URL": db})
    assert json.loads(status.stdout)["unbound_credentials"] == 2  # the URL and the secret
    rotated = cli("keys", "rotate", "--json", env={"DATABASE_URL": db})
    assert rotated.returncode == 0, rotated.stderr
    assert json.loads(rotated.stdout)["endpoints_changed"] == 1  # the other was bound already
    status = cli("keys", "status", "--json", env={"DATABASE_URL": db})
    assert json.loads(status.stdout)["unbound_credentials"] == 0
    url = stored_url(db, endpoint)
    assert TEST_KEYRING.is_bound(url, encryption.URL, endpoint)
    # once bound, the value no longer opens on another endpoint's row
    query(db, "UPDATE webhooks.endpoints SET url = %s WHERE id = %s", (url, other))
    moved = enqueue(db, other)
    again = enqueue(db, endpoint)
    spawn(db).expect_errors("delivery cannot be attempted")
    eventually(lambda: statuses(db, again) == {again[0]: "delivered"}, message="delivered after rotate")
    assert "cannot be decrypted" in eventually(lambda: dead_letter_reason(db, moved[0]), message="moved")
    assert len(receiver.to("/old")) == 2
    assert receiver.to("/other") == []


def test_registration_stores_every_credential_sealed_and_bound_to_its_row(db, receiver):
    endpoint = add_endpoint(db, receiver.url("/sealed"), headers={"Authorization": "Bearer t"},
                            body_format="pagerduty", secret_settings={"routing_key": "R0UTE"})
    [(url, secrets, headers, settings)] = query(
        db, "SELECT url, signing_secrets, headers, secret_settings FROM webhooks.endpoints WHERE id = %s",
        (endpoint,))
    values = [(url, encryption.URL), (secrets[0]["secret"], encryption.SIGNING_SECRET),
              (headers["Authorization"], encryption.header("Authorization")),
              (settings["routing_key"], encryption.setting("routing_key"))]
    for value, purpose in values:
        assert encryption.is_sealed(value) and TEST_KEYRING.is_bound(value, purpose, endpoint), purpose


@pytest.mark.parametrize(("url", "headers", "expected"), [
    ("https://hooks.example.test/x", {"Transfer-Encoding": "chunked"}, "Transfer-Encoding"),
    ("https://hooks.example.test/x", {"X-A B": "1"}, "HTTP token"),
    ("https://u:p@hooks.example.test/x", {"Authorization": "Bearer t"}, "URL carries credentials"),
])
def test_the_python_api_refuses_headers_the_rules_refuse_and_stores_nothing(db, url, headers, expected):
    with pytest.raises(InvalidEndpoint, match=expected):
        add_endpoint(db, url, headers=headers)
    ok = add_endpoint(db, "https://u:p@hooks.example.test/x")
    with pytest.raises(InvalidEndpoint):
        stored(db, update_endpoint, ok, {"headers": {"Authorization": "Bearer t"}}, TEST_KEYRING)
    assert query(db, "SELECT count(*) FROM webhooks.endpoints") == [(1,)]
    assert query(db, "SELECT headers FROM webhooks.endpoints") == [({},)]
