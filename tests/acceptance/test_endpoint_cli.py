"""`webhook-worker endpoints add|update|list|rotate-secret` as a user runs them: credentials from files
and standard input, header rules, format options, the loopback hint and URL fingerprints."""

import hashlib
import json

import pytest

from tests.acceptance.test_cli import cli as run_cli
from tests.support import TEST_KEYRING, query
from worker import encryption
from worker.rules import signing

URL = "https://hooks.example.test/services/T0/B0/PATHCANARY"


def cli(db, *args, stdin=None):
    return run_cli(*args, env={"DATABASE_URL": db}, stdin=stdin)


def ok(db, *args, stdin=None):
    result = cli(db, *args, stdin=stdin)
    assert result.returncode == 0, result.stderr
    return result


def refused(db, *args, stdin=None):
    result = cli(db, *args, stdin=stdin)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    return result.stderr


def stored(db, name):
    [(endpoint, url, secrets, headers, settings, body_format, ttl)] = query(
        db, "SELECT id, url, signing_secrets, headers, secret_settings, body_format, delivery_ttl"
            " FROM webhooks.endpoints WHERE name = %s", (name,))
    return {
        "id": endpoint,
        "url": TEST_KEYRING.open(url, encryption.URL, endpoint),
        "secrets": [TEST_KEYRING.open(s["secret"], encryption.SIGNING_SECRET, endpoint) for s in secrets],
        "headers": TEST_KEYRING.open_headers(headers, endpoint),
        "settings": TEST_KEYRING.open_settings(settings, endpoint),
        "format": body_format,
        "ttl": ttl,
    }


def test_credentials_are_read_from_files(db, tmp_path):
    secret = signing.generate_secret()
    (tmp_path / "url").write_text(URL + "\n")
    (tmp_path / "secret").write_text(secret + "\n")
    (tmp_path / "headers").write_text("Authorization: Bearer t0ken\n\nX-Team: ops\n")
    (tmp_path / "routing").write_text("R0UTINGKEY\n")
    ok(db, "endpoints", "add", "--name", "files", "--url-file", str(tmp_path / "url"),
       "--secret-file", str(tmp_path / "secret"), "--header-file", str(tmp_path / "headers"),
       "--format", "pagerduty", "--routing-key-file", str(tmp_path / "routing"))
    endpoint = stored(db, "files")
    assert endpoint["url"] == URL and endpoint["secrets"] == [secret]
    assert endpoint["headers"] == {"Authorization": "Bearer t0ken", "X-Team": "ops"}
    assert endpoint["settings"] == {"routing_key": "R0UTINGKEY"}

    (tmp_path / "url2").write_text(URL + "/v2")
    (tmp_path / "headers2").write_text("X-Other: 1\r\n")
    ok(db, "endpoints", "update", "files", "--url-file", str(tmp_path / "url2"),
       "--header-file", str(tmp_path / "headers2"))
    endpoint = stored(db, "files")
    assert endpoint["url"] == URL + "/v2" and endpoint["headers"] == {"X-Other": "1"}

    new_secret = signing.generate_secret()
    (tmp_path / "new-secret").write_text(new_secret)
    ok(db, "endpoints", "rotate-secret", "files", "--secret-file", str(tmp_path / "new-secret"))
    assert stored(db, "files")["secrets"][0] == new_secret


def test_credentials_are_read_from_standard_input(db):
    secret = signing.generate_secret()
    added = ok(db, "endpoints", "add", "--name", "piped", "--url-file", "-", "--secret", secret, "--json",
               stdin=URL + "\n")
    assert json.loads(added.stdout)["signing_secret"] == secret
    assert stored(db, "piped")["url"] == URL
    ok(db, "endpoints", "update", "piped", "--header-file", "-", stdin="Authorization: Bearer piped\n")
    assert stored(db, "piped")["headers"] == {"Authorization": "Bearer piped"}
    new_secret = signing.generate_secret()
    rotated = ok(db, "endpoints", "rotate-secret", "piped", "--secret-file", "-", "--json",
                 stdin=new_secret + "\n")
    assert json.loads(rotated.stdout)["signing_secret"] == new_secret
    assert stored(db, "piped")["secrets"][0] == new_secret
    ok(db, "endpoints", "update", "piped", "--format", "pagerduty", "--routing-key-file", "-",
       stdin="R0UTE\n")
    assert stored(db, "piped")["settings"] == {"routing_key": "R0UTE"}
    ok(db, "endpoints", "add", "--name", "piped-secret", "--url", URL, "--secret-file", "-",
       stdin=secret + "\n")
    assert stored(db, "piped-secret")["secrets"] == [secret]


def test_bad_credential_inputs_are_refused_clearly(db, tmp_path):
    (tmp_path / "empty").write_text("\n")
    (tmp_path / "two-lines").write_text(URL + "\n" + URL + "\n")
    assert "--url-file: empty" in refused(db, "endpoints", "add", "--name", "x", "--url-file",
                                          str(tmp_path / "empty"))
    assert "--url-file: expected one line" in refused(db, "endpoints", "add", "--name", "x", "--url-file",
                                                      str(tmp_path / "two-lines"))
    message = refused(db, "endpoints", "add", "--name", "x", "--url-file", str(tmp_path / "missing"))
    assert "--url-file: cannot read" in message
    message = refused(db, "endpoints", "add", "--name", "x", "--url-file", "-", "--secret-file", "-",
                      stdin=URL)
    assert "standard input is already read by --url-file" in message
    assert "not allowed with" in refused(db, "endpoints", "add", "--name", "x", "--url", URL,
                                         "--url-file", "-")
    assert query(db, "SELECT count(*) FROM webhooks.endpoints") == [(0,)]


@pytest.mark.parametrize(("header", "expected"), [
    ("Transfer-Encoding: chunked", "Transfer-Encoding: a framing, hop-by-hop or proxy header"),
    ("Connection: close", "hop-by-hop"),
    ("TE: trailers", "hop-by-hop"),
    ("Upgrade: websocket", "hop-by-hop"),
    ("Proxy-Authorization: Basic eA==", "proxy header"),
    ("Host: internal.example", "Host: set by webhook-worker"),
    ("webhook-signature: v1,forged", "cannot be overridden"),
    ("X-A B: v4lue", "HTTP token"),
    ("X-Naïve: v4lue", "HTTP token"),
    ("X-Token: café", "must be ASCII"),
], ids=lambda v: v if isinstance(v, str) and ":" in v else None)
def test_a_header_the_rules_refuse_is_refused_at_add_and_update(db, header, expected):
    message = refused(db, "endpoints", "add", "--name", "h", "--url", URL, "--header", header)
    assert expected in message
    assert header.partition(":")[2].strip() not in message  # the value never echoed
    ok(db, "endpoints", "add", "--name", "h", "--url", URL)
    assert expected in refused(db, "endpoints", "update", "h", "--header-file", "-", stdin=header + "\n")
    assert stored(db, "h")["headers"] == {}


def test_url_credentials_and_an_authorization_header_are_refused_together(db):
    with_userinfo = "https://user:pa55@hooks.example.test/x"
    message = refused(db, "endpoints", "add", "--name", "u", "--url", with_userinfo,
                      "--header", "Authorization: Bearer t")
    assert "Authorization: the URL carries credentials" in message and "pa55" not in message
    ok(db, "endpoints", "add", "--name", "u", "--url", URL, "--header", "Authorization: Bearer t")
    assert "URL carries credentials" in refused(db, "endpoints", "update", "u", "--url", with_userinfo)
    ok(db, "endpoints", "add", "--name", "v", "--url", with_userinfo)
    assert "URL carries credentials" in refused(db, "endpoints", "update", "v", "--header",
                                                "Authorization: Bearer t")
    assert stored(db, "u")["url"] == URL and stored(db, "v")["headers"] == {}


def test_a_loopback_url_is_refused_with_how_to_allow_it(db):
    message = refused(db, "endpoints", "add", "--name", "local", "--url", "http://127.0.0.1:9/hook")
    assert "destination 127.0.0.1 is not a public address" in message
    assert "127.0.0.1/32 under security.allow_networks" in message and "--config" in message
    message = refused(db, "endpoints", "add", "--name", "local", "--url", "http://localhost:9/hook")
    assert "security.allow_networks" in message
    message = refused(db, "endpoints", "add", "--name", "local", "--url", "ftp://hooks.example.test/x")
    assert "allow_networks" not in message  # only where it would help


def test_update_sets_format_routing_key_and_ttl(db):
    ok(db, "endpoints", "add", "--name", "pd", "--url", URL)
    assert "--routing-key: required with --format pagerduty" in refused(
        db, "endpoints", "update", "pd", "--format", "pagerduty")
    assert "--routing-key: only with --format pagerduty (the format is raw)" in refused(
        db, "endpoints", "update", "pd", "--routing-key", "R1")
    assert "--routing-key: only with --format pagerduty (the format is slack)" in refused(
        db, "endpoints", "update", "pd", "--format", "slack", "--routing-key", "R1")
    updated = ok(db, "endpoints", "update", "pd", "--format", "pagerduty", "--routing-key", "R1",
                 "--ttl-seconds", "3600")
    assert "body_format" in updated.stdout and "routing_key" in updated.stdout and "R1" not in updated.stdout
    endpoint = stored(db, "pd")
    assert endpoint["format"] == "pagerduty" and endpoint["settings"] == {"routing_key": "R1"}
    assert endpoint["ttl"].total_seconds() == 3600
    ok(db, "endpoints", "update", "pd", "--routing-key", "R2")  # the format is pagerduty already
    assert stored(db, "pd")["settings"] == {"routing_key": "R2"}
    assert "--ttl-seconds" in refused(db, "endpoints", "update", "pd", "--ttl-seconds", "0")


def test_add_refuses_a_routing_key_without_the_pagerduty_format(db):
    assert "--routing-key: only with --format pagerduty" in refused(
        db, "endpoints", "add", "--name", "r", "--url", URL, "--routing-key", "R1")
    assert "--routing-key: must not be empty" in refused(
        db, "endpoints", "add", "--name", "r", "--url", URL, "--format", "pagerduty", "--routing-key", "")
    assert query(db, "SELECT count(*) FROM webhooks.endpoints") == [(0,)]


def test_list_tells_endpoints_on_one_host_apart_without_showing_their_paths(db):
    ok(db, "endpoints", "add", "--name", "team-a", "--url", "https://hooks.example.test/team-a")
    ok(db, "endpoints", "add", "--name", "team-b", "--url", "https://hooks.example.test/team-b")
    rows = json.loads(ok(db, "endpoints", "list", "--json").stdout)
    prints = [row["url_fingerprint"] for row in rows]
    assert len(set(prints)) == 2 and all(len(p) == 8 for p in prints)
    assert {row["url_display"] for row in rows} == {"https://hooks.example.test"}
    table = ok(db, "endpoints", "list").stdout
    assert all(p in table for p in prints)
    assert "/team-a" not in table and "/team-b" not in table
    # keyed: a plain hash of a guessed URL does not match
    for url in ("https://hooks.example.test/team-a", "https://hooks.example.test/team-b"):
        assert hashlib.sha256(url.encode()).hexdigest()[:8] not in prints
    # the same for the same URL, however often it is listed
    assert [r["url_fingerprint"] for r in json.loads(ok(db, "endpoints", "list", "--json").stdout)] == prints


def coalescing(db, name):
    return query(db, "SELECT coalesce_max, extract(epoch FROM coalesce_window)::float8"
                     " FROM webhooks.endpoints WHERE name = %s", (name,))[0]


def test_coalescing_is_set_at_add_changed_by_update_and_refused_where_it_cannot_apply(db):
    ok(db, "endpoints", "add", "--name", "storm", "--url", URL, "--format", "slack", "--rate-limit", "1",
       "--coalesce-max", "50")
    assert coalescing(db, "storm") == (50, None)
    ok(db, "endpoints", "update", "storm", "--coalesce-window", "2.5")
    assert coalescing(db, "storm") == (50, 2.5)
    shown = json.loads(ok(db, "endpoints", "show", "storm", "--json").stdout)
    assert shown["coalesce_max"] == 50 and shown["coalesce_window"]
    # a format that is never coalesced, while the endpoint coalesces: refused before SQL sees it
    assert "--format: the endpoint coalesces" in refused(
        db, "endpoints", "update", "storm", "--format", "raw")
    ok(db, "endpoints", "update", "storm", "--coalesce-max", "0")
    assert coalescing(db, "storm") == (None, None)
    ok(db, "endpoints", "update", "storm", "--format", "raw")
    assert "--coalesce-max: format raw is never coalesced" in refused(
        db, "endpoints", "update", "storm", "--coalesce-max", "10")
    assert "--coalesce-max: Input should be less than or equal to 1000" in refused(
        db, "endpoints", "add", "--name", "big", "--url", URL, "--format", "envelope",
        "--coalesce-max", "5000")


@pytest.mark.parametrize("secret", ["nope", "whsec_AA==", "whsec_" + "QUJD" * 5 + "QUI="],
                         ids=["no-prefix", "1-byte", "17-bytes"])
def test_a_signing_secret_that_is_not_24_to_64_bytes_of_whsec_base64_is_refused(db, tmp_path, secret):
    # the Standard Webhooks form, at add and at rotate-secret, from the option or a file
    (tmp_path / "secret").write_text(secret + "\n")
    for given in (["--secret", secret], ["--secret-file", str(tmp_path / "secret")]):
        message = refused(db, "endpoints", "add", "--name", "s", "--url", URL, *given)
        assert "--secret: a signing secret is 'whsec_' followed by the base64 of 24 to 64 bytes" in message
        assert secret.removeprefix("whsec_") not in message
    assert query(db, "SELECT count(*) FROM webhooks.endpoints") == [(0,)]
    ok(db, "endpoints", "add", "--name", "s", "--url", URL)
    before = stored(db, "s")["secrets"]
    message = refused(db, "endpoints", "rotate-secret", "s", "--secret", secret)
    assert "--secret: a signing secret is" in message
    assert stored(db, "s")["secrets"] == before


def test_a_url_longer_than_2048_characters_is_refused_at_add_and_update(db, tmp_path):
    # README's limit; 3,018 characters were accepted
    too_long = URL + "/" + "p" * (3018 - len(URL) - 1)
    (tmp_path / "url").write_text(too_long + "\n")
    for given in (["--url", too_long], ["--url-file", str(tmp_path / "url")]):
        message = refused(db, "endpoints", "add", "--name", "long", *given)
        assert "--url: URL longer than 2,048 characters (it has 3,018)" in message
        assert "PATHCANARY" not in message
    assert query(db, "SELECT count(*) FROM webhooks.endpoints") == [(0,)]
    longest = URL + "/" + "p" * (2048 - len(URL) - 1)
    ok(db, "endpoints", "add", "--name", "long", "--url", longest)
    assert "--url: URL longer than 2,048 characters" in refused(db, "endpoints", "update", "long",
                                                                 "--url", longest + "p")
    assert stored(db, "long")["url"] == longest


def test_a_description_is_set_shown_changed_and_bounded(db):
    ok(db, "endpoints", "add", "--name", "described", "--url", URL, "--description", "billing's receiver",
       "--timeout-seconds", "2.5", "--rate-limit", "5")
    shown = json.loads(ok(db, "endpoints", "show", "described", "--json").stdout)
    # the API's shape: numbers as numbers, durations in seconds
    assert (shown["description"], shown["timeout_seconds"], shown["rate_limit_per_second"]) == (
        "billing's receiver", 2.5, 5.0)
    assert "description: billing's receiver" in ok(db, "endpoints", "show", "described").stdout
    assert "description" in ok(db, "endpoints", "update", "described", "--description", "finance").stdout
    assert json.loads(ok(db, "endpoints", "list", "--json").stdout)[0]["description"] == "finance"
    message = refused(db, "endpoints", "update", "described", "--description", "x" * 1001)
    assert message.startswith("webhook-worker: --description: ") and "1000" in message
    assert query(db, "SELECT description FROM webhooks.endpoints") == [("finance",)]


def test_an_endpoint_is_deleted_with_its_waiting_rows_dropped_as_dead_letters_that_stay_its_own(db):
    ok(db, "endpoints", "add", "--name", "billing", "--url", URL)
    [(old,)] = query(db, "SELECT id FROM webhooks.endpoints WHERE name = 'billing'")
    [(waiting,)] = query(db, "SELECT webhooks.enqueue(%s, 'invoice.paid', '{}', p_deliver_at => now() + "
                             "interval '1 hour')", (old,))
    query(db, "UPDATE webhooks.alert_delivery_queue SET status = 'retrying', attempts = 1")
    refusal = cli(db, "endpoints", "delete", "billing")
    assert refusal.returncode == 1 and "Traceback" not in refusal.stderr
    assert "still has 1 deliveries waiting" in refusal.stderr and "--drop-pending" in refusal.stderr
    assert query(db, "SELECT status FROM webhooks.alert_delivery_queue") == [("retrying",)]

    deleted = ok(db, "endpoints", "delete", "billing", "--drop-pending")
    assert f"endpoint {old} deleted" in deleted.stdout
    assert "1 waiting deliveries are dead letters now, category endpoint_deleted" in deleted.stdout
    assert query(db, "SELECT status, failure_category FROM webhooks.alert_delivery_queue") == [
        ("dead_letter", "endpoint_deleted")]
    # the name goes to a new endpoint; the old dead letter stays the old endpoint's, and says so
    ok(db, "endpoints", "add", "--name", "billing", "--url", URL)
    [(new,)] = query(db, "SELECT id FROM webhooks.endpoints WHERE name = 'billing'")
    query(db, "INSERT INTO webhooks.alert_delivery_queue (webhook_id, event_type, payload, status,"
              " dead_lettered_at, failure_category) VALUES (%s, 'invoice.paid', '{}', 'dead_letter', now(),"
              " 'http_4xx')", (new,))
    listed = ok(db, "dlq", "list").stdout
    assert f"billing (id {old}, deleted)" in listed
    assert [line.split()[1] for line in listed.splitlines()[1:]] == ["billing", "billing"]
    shown = json.loads(ok(db, "dlq", "list", "--json").stdout)
    assert [(r["endpoint_id"], r["endpoint_name"], r["endpoint_deleted_at"] is not None) for r in shown] == [
        (old, "billing", True), (new, "billing", False)]
    replayed = cli(db, "replay", str(waiting))
    assert replayed.returncode == 1
    assert f"belongs to endpoint billing (id {old}), deleted" in replayed.stderr
    assert "never sent again" in replayed.stderr
    assert json.loads(ok(db, "endpoints", "delete", "billing", "--json").stdout) == {
        "id": new, "deleted": True, "dropped": 0}
