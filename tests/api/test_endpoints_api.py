"""Endpoint administration over HTTP: the CLI's registration rules, sealing, and what a reader sees."""

from __future__ import annotations

from tests.support import TEST_KEYRING, add_endpoint, enqueue, query
from worker import encryption

SECRET_URL = "https://hooks.example.com/services/T000/B000/very-secret-path?token=abc123"


def test_register_seals_the_url_and_a_reader_never_sees_its_path(api, role_tokens, db):
    created = api.post(
        "/v1/endpoints",
        role_tokens["admin"],
        {
            "name": "slack",
            "url": SECRET_URL,
            "event_types": ["alert.*"],
            "format": "slack",
            "headers": {"X-Team": "ops"},
            "max_attempts": 5,
            "retry_delays": [1, 10],
        },
    )
    assert created.status == 201, created.body
    endpoint_id = created.json["id"]
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
        ({"name": "a", "url": "https://example.com", "format": "pagerduty"}, "routing_key", "required"),
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
