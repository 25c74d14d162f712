"""Endpoint administration over HTTP: the CLI's registration rules, sealing, and what a reader sees."""

from __future__ import annotations

import json

from tests.api.test_tenant_isolation import scoped_token
from tests.support import TEST_KEYRING, add_endpoint, enqueue, query
from worker import encryption
from worker.rules import tokens

SECRET_URL = "https://hooks.example.com/services/T000/B000/very-secret-path?token=abc123"


def test_register_seals_the_url_and_a_reader_never_sees_its_path(api, role_tokens, db):
    created = api.post(
        "/v1/endpoints",
        role_tokens["admin"],
        {
            "name": "slack",
            "url": SECRET_URL,
            "event_types": ["alert.*"],
            "body_format": "slack",
            "headers": {"X-Team": "ops"},
            "max_attempts": 5,
            "retry_delays": [1, 10],
        },
    )
    assert created.status == 201, created.body
    endpoint_id = created.json["id"]
    assert created.headers["location"] == f"/v1/endpoints/{endpoint_id}"
    assert created.json["signing_secret"].startswith("whsec_")
    assert created.json["url_display"] == "https://hooks.example.com"
    [(stored_url,)] = query(db, "SELECT url FROM webhooks.endpoints WHERE id = %s", (endpoint_id,))
    assert "very-secret-path" not in stored_url
    assert TEST_KEYRING.open(stored_url, encryption.URL, endpoint_id) == SECRET_URL
    reader = role_tokens["reader"]
    for path in (
        "/v1/endpoints",
        f"/v1/endpoints/{endpoint_id}",
        f"/v1/endpoints/{endpoint_id}/health",
        "/v1/endpoints/slack",
    ):
        answer = api.get(path, reader)
        assert answer.status == 200, (path, answer.body)
        assert b"very-secret-path" not in answer.body and b"abc123" not in answer.body
        assert b"whsec_" not in answer.body


def test_registration_applies_the_destination_and_header_rules(api, role_tokens, db):
    admin = role_tokens["admin"]
    cases = [
        ({"name": "a", "url": "ftp://example.com/x"}, "url", "scheme"),
        ({"name": "a", "url": "http://10.1.2.3/hook"}, "url", "not a public address"),
        (
            {"name": "a", "url": "https://example.com", "headers": {"Content-Length": "5"}},
            "headers",
            "cannot be overridden",
        ),
        ({"name": "a", "url": "https://example.com", "secret": "not-a-secret"}, "secret", ""),
        ({"name": "a", "url": "https://example.com", "body_format": "pagerduty"}, "routing_key", "required"),
        ({"name": "a", "url": "https://example.com", "max_attempts": 0}, "max_attempts", ""),
        ({"name": "a", "url": "https://example.com", "retry_delays": [-1]}, "retry_delays", ""),
        ({"name": "a", "url": "https://example.com", "colour": "red"}, "colour", "unknown field"),
        ({"url": "https://example.com"}, "name", "required"),
        ({"name": " ", "url": "https://example.com"}, "name", "empty"),
    ]
    for body, field, words in cases:
        answer = api.post("/v1/endpoints", admin, body)
        assert answer.status == 422, (body, answer.body)
        assert answer.json["field"] == field and words in answer.json["detail"], (body, answer.json)
        assert "10.1.2.3" not in answer.json["detail"] or field == "url"
    assert query(db, "SELECT count(*) FROM webhooks.endpoints") == [(0,)]
    add_endpoint(db, "https://example.com/x", name="taken")
    duplicate = api.post("/v1/endpoints", admin, {"name": "taken", "url": "https://example.com/y"})
    assert duplicate.status == 409 and duplicate.json["field"] == "name"


def test_patch_changes_settings_and_keeps_credentials_sealed(api, role_tokens, db):
    admin = role_tokens["admin"]
    endpoint = add_endpoint(db, "https://example.com/old", name="patched")
    answer = api.request(
        "PATCH",
        f"/v1/endpoints/{endpoint}",
        admin,
        {"url": "https://example.org/new-path", "max_attempts": 7, "ttl_seconds": 3600},
    )
    assert answer.status == 200, answer.body
    assert answer.json["max_attempts"] == 7 and answer.json["url_display"] == "https://example.org"
    [(url, ttl)] = query(
        db, "SELECT url, delivery_ttl::text FROM webhooks.endpoints WHERE id = %s", (endpoint,)
    )
    assert TEST_KEYRING.open(url, encryption.URL, endpoint) == "https://example.org/new-path"
    assert ttl == "01:00:00"
    empty = api.request("PATCH", f"/v1/endpoints/{endpoint}", admin, {})
    assert empty.status == 422 and "nothing to change" in empty.json["detail"]
    wrong = api.request("PATCH", f"/v1/endpoints/{endpoint}", admin, {"max_attempts": "seven"})
    assert wrong.status == 422 and wrong.json["field"] == "max_attempts"
    assert api.request("PATCH", "/v1/endpoints/987654", admin, {"max_attempts": 3}).status == 404


def test_circuit_enable_disable_with_the_caller_recorded(api, role_tokens, db):
    admin = role_tokens["admin"]
    endpoint = add_endpoint(db, "https://example.com/x", name="controlled")
    opened = api.post(
        f"/v1/endpoints/{endpoint}/circuit", admin, {"action": "open", "until": "2099-01-01T00:00:00Z"}
    )
    assert opened.status == 200 and opened.json["circuit_state"] == "open"
    bad = api.post(
        f"/v1/endpoints/{endpoint}/circuit", admin, {"action": "reset", "until": "2099-01-01T00:00:00Z"}
    )
    assert bad.status == 422 and bad.json["field"] == "until"
    assert (
        api.post(f"/v1/endpoints/{endpoint}/circuit", admin, {"action": "explode"}).json["field"] == "action"
    )
    disabled = api.post(f"/v1/endpoints/{endpoint}/disable", admin, {"reason": "receiver migrating"})
    assert disabled.status == 200 and disabled.json == {
        "endpoint_id": endpoint,
        "active": False,
        "changed": True,
    }
    assert api.post(f"/v1/endpoints/{endpoint}/disable", admin).json["changed"] is False
    assert api.post(f"/v1/endpoints/{endpoint}/enable", admin).json["changed"] is True
    events = query(
        db,
        "SELECT change, reason, decided_by FROM webhooks.endpoint_events WHERE webhook_id = %s ORDER BY id",
        (endpoint,),
    )
    assert ("disabled", "receiver migrating") in [(c, r) for c, r, _ in events]
    assert all(by.startswith("api:admin-") for _, _, by in events), events
    health = api.get(f"/v1/endpoints/{endpoint}/health", role_tokens["reader"])
    assert health.status == 200 and health.json["circuit_state"] == "closed"


def test_rotate_secret_and_delete(api, role_tokens, db):
    admin = role_tokens["admin"]
    endpoint = add_endpoint(db, "https://example.com/x", name="rotated")
    rotated = api.post(f"/v1/endpoints/{endpoint}/rotate-secret", admin, {"expire_old_after_hours": 24})
    assert rotated.status == 200 and rotated.json["active_secrets"] == 2
    assert rotated.json["signing_secret"].startswith("whsec_")
    [delivery] = enqueue(db, endpoint)
    kept = api.request("DELETE", f"/v1/endpoints/{endpoint}", admin)
    assert kept.status == 409 and "still has 1 deliveries" in kept.json["detail"]
    query(db, "DELETE FROM webhooks.alert_delivery_queue WHERE delivery_id = %s", (delivery,))
    assert api.request("DELETE", f"/v1/endpoints/{endpoint}", admin).status == 204
    assert api.request("DELETE", f"/v1/endpoints/{endpoint}", admin).status == 404


# --- coalescing over HTTP ---------------------------------------------------------------------


def test_the_coalescing_policy_is_set_read_changed_and_turned_off_over_http(api, role_tokens, db):
    admin = role_tokens["admin"]
    created = api.post("/v1/endpoints", admin, {"name": "storm", "url": "https://example.com/x",
                                                "body_format": "slack", "coalesce_max": 20,
                                                "coalesce_window": 5})
    assert created.status == 201, created.body
    assert (created.json["coalesce_max"], created.json["coalesce_window"]) == (20, 5.0)
    endpoint = created.json["id"]
    assert query(db, "SELECT coalesce_max, extract(epoch FROM coalesce_window)::int FROM webhooks.endpoints"
                     " WHERE id = %s", (endpoint,)) == [(20, 5)]
    read = api.get(f"/v1/endpoints/{endpoint}", role_tokens["reader"])
    assert (read.json["coalesce_max"], read.json["coalesce_window"]) == (20, 5.0)
    listed = api.get("/v1/endpoints", role_tokens["reader"]).json["items"]
    assert [(e["coalesce_max"], e["coalesce_window"]) for e in listed] == [(20, 5.0)]
    changed = api.request("PATCH", f"/v1/endpoints/{endpoint}", admin, {"coalesce_max": 50})
    assert changed.status == 200, changed.body
    assert (changed.json["coalesce_max"], changed.json["coalesce_window"]) == (50, 5.0)
    off = api.request("PATCH", f"/v1/endpoints/{endpoint}", admin, {"coalesce_max": 0})
    assert off.status == 200, off.body
    assert (off.json["coalesce_max"], off.json["coalesce_window"]) == (None, None)


def test_a_bad_coalescing_policy_is_refused_naming_the_field(api, role_tokens, db):
    admin = role_tokens["admin"]
    cases = [
        ({"body_format": "raw", "coalesce_max": 10}, "coalesce_max", "never coalesced"),
        ({"body_format": "slack", "coalesce_max": 1}, "coalesce_max", "between 2 and 1000"),
        ({"body_format": "slack", "coalesce_max": 1001}, "coalesce_max", ""),
        ({"body_format": "slack", "coalesce_window": 5}, "coalesce_window", "needs coalesce_max"),
        ({"body_format": "slack", "coalesce_max": 5, "coalesce_window": 3601}, "coalesce_window", ""),
    ]
    for fields, field, words in cases:
        answer = api.post("/v1/endpoints", admin, {"name": "a", "url": "https://example.com/x", **fields})
        assert answer.status == 422, (fields, answer.body)
        assert answer.json["field"] == field and words in answer.json["detail"], (fields, answer.json)
    assert query(db, "SELECT count(*) FROM webhooks.endpoints") == [(0,)]
    slack = api.post("/v1/endpoints", admin, {"name": "s", "url": "https://example.com/x",
                                              "body_format": "slack",
                                              "coalesce_max": 5}).json["id"]
    # a coalescing endpoint cannot move to a format that never is
    answer = api.request("PATCH", f"/v1/endpoints/{slack}", admin, {"body_format": "raw"})
    assert answer.status == 422 and answer.json["field"] == "body_format", answer.body
    assert query(db, "SELECT body_format, coalesce_max FROM webhooks.endpoints WHERE id = %s",
                 (slack,)) == [("slack", 5)]


def delivered_in_a_digest(db: str, rows: int = 3) -> tuple[list[int], int]:
    """Rows claimed and delivered as one digest, through acquire() and finish() as a worker does."""
    endpoint = add_endpoint(db, "http://127.0.0.1:9/a", body_format="envelope", rate_limit_per_second=0.01,
                            rate_limit_burst=1)
    query(db, "SELECT webhooks.update_endpoint(%s, %s)", (endpoint, json.dumps({"coalesce_max": 10})))
    ids = enqueue(db, endpoint, count=rows)
    claimed = query(db, "SELECT delivery_id, lease_token, attempt, digest_id"
                        " FROM webhooks.acquire('w', 10, 30)")
    [digest] = {row[3] for row in claimed}
    assert digest is not None and sorted(row[0] for row in claimed) == ids
    outcomes = [{"delivery_id": d, "lease_token": str(t), "attempt": a, "outcome": "delivered",
                 "http_status": 200} for d, t, a, _ in claimed]
    query(db, "SELECT * FROM webhooks.finish('w', %s)", (json.dumps(outcomes),))
    return ids, digest


def test_a_deliverys_attempts_name_the_digest_that_carried_them(api, role_tokens, db):
    ids, digest = delivered_in_a_digest(db)
    answer = api.get(f"/v1/deliveries/{ids[1]}", role_tokens["reader"])
    assert answer.status == 200, answer.body
    [attempt] = [a for a in answer.json["attempts_history"] if a["attempt"] == 1]
    assert (attempt["digest_id"], attempt["digest"], attempt["digest_rows"]) == (digest, f"d-{digest}", 3)
    alone = enqueue(db, add_endpoint(db, "http://127.0.0.1:9/b"))[0]
    query(db, "UPDATE webhooks.alert_delivery_queue SET status = 'delivered', delivered_at = now()"
              " WHERE delivery_id = %s", (alone,))
    query(db, "SELECT webhooks.replay(%s)", (alone,))  # an audit row no digest carried
    history = api.get(f"/v1/deliveries/{alone}", role_tokens["reader"]).json["attempts_history"]
    assert history and all((a["digest_id"], a["digest"], a["digest_rows"]) == (None, None, None)
                           for a in history)


# --- every tenant's operational events: the operator's setting ----------------------------------


def test_only_an_unscoped_admin_marks_an_endpoint_for_every_tenants_operational_events(api, role_tokens, db):
    admin = role_tokens["admin"]
    created = api.post("/v1/endpoints", admin, {
        "name": "operator-ops", "url": "https://example.com/ops", "event_types": ["webhook.*"],
        "operational_all_tenants": True})
    assert created.status == 201, created.body
    assert created.json["operational_all_tenants"] is True
    endpoint = created.json["id"]
    assert api.get(f"/v1/endpoints/{endpoint}", role_tokens["reader"]).json["operational_all_tenants"] is True
    plain = api.post("/v1/endpoints", admin, {"name": "acme-ops", "url": "https://example.com/acme"})
    assert plain.json["operational_all_tenants"] is False
    patched = api.request("PATCH", f"/v1/endpoints/{endpoint}", admin, {"operational_all_tenants": False})
    assert patched.status == 200 and patched.json["operational_all_tenants"] is False
    wrong = api.request("PATCH", f"/v1/endpoints/{endpoint}", admin, {"operational_all_tenants": "yes"})
    assert wrong.status == 422 and wrong.json["field"] == "operational_all_tenants"

    query(db, "SELECT webhooks.register_tenant('acme')")
    scoped = {role: scoped_token(db, role, "acme") for role in ("producer", "reader", "tenant_admin")}
    # admin tokens cannot be scoped (tokens.create and a constraint refuse it); one made so anyway is
    # refused as well
    query(db, "ALTER TABLE webhooks.api_tokens DROP CONSTRAINT api_token_tenant_role")
    scoped["admin"] = tokens.generate_token()
    query(db, "SELECT webhooks.api_create_token('admin-acme', 'admin', %s, NULL, 'acme')",
          (tokens.token_hash(scoped["admin"]),))
    for role, token in scoped.items():
        for method, path in (("POST", "/v1/endpoints"), ("PATCH", f"/v1/endpoints/{endpoint}")):
            body = {"operational_all_tenants": True, **({"name": "x", "url": "https://example.com/x"}
                                                        if method == "POST" else {})}
            answer = api.request(method, path, token, body)
            assert answer.status == 403, (role, method, answer.body)
            assert role != "admin" or answer.json["field"] == "operational_all_tenants"
    assert query(db, "SELECT name, operational_all_tenants FROM webhooks.endpoints ORDER BY id") == [
        ("operator-ops", False), ("acme-ops", False)]


def test_a_signing_secret_that_is_not_24_to_64_bytes_of_whsec_base64_is_refused(api, role_tokens, db):
    # the CLI's rule (worker.rules.signing.secret_problem), at registration and at rotation
    admin = role_tokens["admin"]
    endpoint = add_endpoint(db, "https://example.com/x", name="kept")
    before = query(db, "SELECT signing_secrets FROM webhooks.endpoints")
    for secret in ("nope", "whsec_AA==", "whsec_" + "QUJD" * 5 + "QUI="):
        registration = {"name": "new", "url": "https://example.com/y", "secret": secret}
        for path, body in (("/v1/endpoints", registration),
                           (f"/v1/endpoints/{endpoint}/rotate-secret", {"secret": secret})):
            answer = api.post(path, admin, body)
            assert answer.status == 422 and answer.json["field"] == "secret", (path, secret, answer.body)
            assert "whsec_' followed by the base64 of 24 to 64 bytes" in answer.json["detail"]
            assert secret.removeprefix("whsec_") not in answer.json["detail"]
    assert query(db, "SELECT signing_secrets FROM webhooks.endpoints") == before
    accepted = api.post("/v1/endpoints", admin, {"name": "new", "url": "https://example.com/y",
                                                 "secret": "whsec_" + "QUJD" * 8})
    assert accepted.status == 201, accepted.body


def test_a_url_longer_than_2048_characters_is_refused_at_registration_and_change(api, role_tokens, db):
    # README's limit, the CLI's constant; 3,018 characters were accepted
    admin = role_tokens["admin"]
    too_long = "https://example.com/SECRETPATH/" + "p" * (3018 - 31)
    created = api.post("/v1/endpoints", admin, {"name": "long", "url": too_long})
    assert created.status == 422 and created.json["field"] == "url", created.body
    assert created.json["detail"] == "url: URL longer than 2,048 characters (it has 3,018)"
    endpoint = add_endpoint(db, "https://example.com/short", name="short")
    patched = api.request("PATCH", f"/v1/endpoints/{endpoint}", admin, {"url": too_long})
    assert patched.status == 422 and patched.json["field"] == "url"
    assert b"SECRETPATH" not in created.body + patched.body
    longest = "https://example.com/" + "p" * (2048 - 20)
    assert api.request("PATCH", f"/v1/endpoints/{endpoint}", admin, {"url": longest}).status == 200
    [(url,)] = query(db, "SELECT url FROM webhooks.endpoints")
    assert TEST_KEYRING.open(url, encryption.URL, endpoint) == longest


# --- one shape: what GET answers can be sent back -------------------------------------------------


def test_an_endpoint_read_can_be_sent_back_unchanged_numbers_as_numbers_durations_in_seconds(
        api, role_tokens, db):
    admin = role_tokens["admin"]
    created = api.post("/v1/endpoints", admin, {
        "name": "shaped", "url": "https://example.com/x", "body_format": "slack", "rate_limit_per_second": 5,
        "rate_limit_burst": 3, "timeout_seconds": 2.5, "ttl_seconds": 3600, "retry_delays": [1, 10],
        "coalesce_max": 5, "coalesce_window": 30, "description": "the ops channel"})
    assert created.status == 201, created.body
    endpoint = created.json["id"]
    read = api.get(f"/v1/endpoints/{endpoint}", role_tokens["reader"]).json
    assert (read["rate_limit_per_second"], read["timeout_seconds"], read["ttl_seconds"], read["retry_delays"],
            read["coalesce_window"], read["body_format"]) == (5.0, 2.5, 3600.0, [1.0, 10.0], 30.0, "slack")
    assert isinstance(read["rate_limit_per_second"], float)  # a number, not the text "5.0"
    sent_back = api.request("PATCH", f"/v1/endpoints/{endpoint}", admin, read)
    assert sent_back.status == 200, sent_back.body
    again = api.get(f"/v1/endpoints/{endpoint}", role_tokens["reader"]).json
    assert again == read
    # and as a new endpoint: the read shape plus a URL and another name
    copy = api.post("/v1/endpoints", admin, {**read, "name": "shaped-copy", "url": "https://example.com/y"})
    assert copy.status == 201, copy.body
    settings = {k: v for k, v in read.items() if k not in ("id", "name", "created_at", "health_status")}
    assert {k: copy.json[k] for k in settings} == settings


def test_the_input_names_before_one_shape_still_work(api, role_tokens):
    created = api.post("/v1/endpoints", role_tokens["admin"], {
        "name": "old-names", "url": "https://example.com/x",
        "rate_limit": 2, "burst": 4, "format": "envelope"})
    assert created.status == 201, created.body
    assert (created.json["rate_limit_per_second"], created.json["rate_limit_burst"],
            created.json["body_format"]) == (2.0, 4, "envelope")


def test_a_description_is_written_read_changed_and_cleared(api, role_tokens, db):
    admin = role_tokens["admin"]
    created = api.post("/v1/endpoints", admin, {"name": "described", "url": "https://example.com/x",
                                                "description": "billing team's receiver"})
    assert created.status == 201 and created.json["description"] == "billing team's receiver", created.body
    endpoint = created.json["id"]
    listed = api.get("/v1/endpoints", role_tokens["reader"]).json["items"]
    assert [e["description"] for e in listed] == ["billing team's receiver"]
    changed = api.request("PATCH", f"/v1/endpoints/{endpoint}", admin, {"description": "moved to finance"})
    assert changed.status == 200 and changed.json["description"] == "moved to finance"
    too_long = api.request("PATCH", f"/v1/endpoints/{endpoint}", admin, {"description": "x" * 1001})
    assert too_long.status == 422 and too_long.json["field"] == "description"
    cleared = api.request("PATCH", f"/v1/endpoints/{endpoint}", admin, {"description": ""})
    assert cleared.status == 200 and cleared.json["description"] is None
    assert query(db, "SELECT description FROM webhooks.endpoints") == [(None,)]


def test_the_config_read_can_be_sent_back_with_durations_in_seconds(api, role_tokens):
    read = api.get("/v1/config", role_tokens["reader"]).json
    assert read["delivered_retention"] == 7 * 86400 and isinstance(read["delivered_retention"], float), read
    assert all(not isinstance(v, str) or k == "updated_at" for k, v in read.items()), read
    sent_back = api.request("PATCH", "/v1/config", role_tokens["admin"], read)
    assert sent_back.status == 200, sent_back.body
    assert {k: v for k, v in sent_back.json.items() if k != "updated_at"} == {
        k: v for k, v in read.items() if k != "updated_at"}
    in_seconds = api.request("PATCH", "/v1/config", role_tokens["admin"], {"log_retention": 86400 * 3})
    assert in_seconds.status == 200 and in_seconds.json["log_retention"] == 3 * 86400


def test_a_refused_choice_is_told_in_json_s_words_not_python_s(api, role_tokens, db):
    endpoint = add_endpoint(db, "http://127.0.0.1:9/hook", name="hook")
    answer = api.post(f"/v1/endpoints/{endpoint}/circuit", role_tokens["admin"], {"action": "shut"})
    assert answer.status == 422 and answer.json["field"] == "action", answer.body
    assert answer.json["detail"] == 'action: Input should be "reset", "open" or "close"', answer.json
