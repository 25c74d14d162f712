"""The exact bodies each format sends, for a full alert and for one missing optional fields."""

import json
from datetime import UTC, datetime

import pytest

from worker.formats import Event, FormatError, render
from worker.policy import Category, RetryPolicy

WHEN = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)
EVENT = Event("evt_1", "alert.created", WHEN, {"routing_key": "R0UT1NGKEY"})
FULL = {"alert_id": 42, "title": "Disk almost full on db-1", "severity": "critical", "source": "db-1",
        "url": "https://grafana.example.test/d/disk"}
BARE = {"title": "Disk almost full on db-1"}


def body(fmt, payload, event=EVENT):
    return json.loads(render(fmt, json.dumps(payload).encode(), event))


def test_raw_is_the_payload_byte_for_byte():
    raw = b'{"b": 1,  "a": [1,2]}'
    assert render("raw", raw, EVENT) == raw


def test_envelope_follows_standard_webhooks():
    assert body("envelope", FULL) == {"id": "evt_1", "type": "alert.created",
                                      "timestamp": "2026-11-25T12:00:00+00:00", "data": FULL}


def test_slack():
    link = "*<https://grafana.example.test/d/disk|[CRITICAL] Disk almost full on db-1>*"
    context = {"type": "mrkdwn", "text": "Severity: critical | Source: db-1"}
    assert body("slack", FULL) == {
        "text": "[CRITICAL] Disk almost full on db-1",
        "blocks": [
            {"type": "section", "text": {"type": "mrkdwn", "text": link}},
            {"type": "context", "elements": [context]},
        ],
    }
    assert body("slack", BARE) == {
        "text": "Disk almost full on db-1",
        "blocks": [{"type": "section", "text": {"type": "mrkdwn", "text": "*Disk almost full on db-1*"}}],
    }


def test_mattermost():
    assert body("mattermost", FULL) == {
        "text": "[CRITICAL] Disk almost full on db-1",
        "attachments": [{
            "fallback": "[CRITICAL] Disk almost full on db-1", "title": "Disk almost full on db-1",
            "color": "#d00000", "title_link": "https://grafana.example.test/d/disk",
            "fields": [{"short": True, "title": "Severity", "value": "critical"},
                       {"short": True, "title": "Source", "value": "db-1"}],
        }],
    }
    assert body("mattermost", BARE) == {
        "text": "Disk almost full on db-1",
        "attachments": [{"fallback": "Disk almost full on db-1", "title": "Disk almost full on db-1",
                         "color": "#808080"}],
    }


def test_pagerduty_trigger_and_resolve():
    assert body("pagerduty", FULL) == {
        "routing_key": "R0UT1NGKEY", "event_action": "trigger", "dedup_key": "evt_1",
        "payload": {"summary": "Disk almost full on db-1", "source": "db-1", "severity": "critical",
                    "timestamp": "2026-11-25T12:00:00+00:00", "custom_details": FULL},
        "links": [{"href": "https://grafana.example.test/d/disk", "text": "Alert"}],
    }
    assert body("pagerduty", BARE) == {
        "routing_key": "R0UT1NGKEY", "event_action": "trigger", "dedup_key": "evt_1",
        "payload": {"summary": "Disk almost full on db-1", "source": "webhook-worker", "severity": "error",
                    "timestamp": "2026-11-25T12:00:00+00:00", "custom_details": BARE},
    }
    cleared = Event("evt_2", "alert.resolved", WHEN, {"routing_key": "R0UT1NGKEY"})
    assert body("pagerduty", {**FULL, "dedup_key": "alert-42"}, cleared) == {
        "routing_key": "R0UT1NGKEY", "event_action": "resolve", "dedup_key": "alert-42"}


@pytest.mark.parametrize("fmt", ["slack", "mattermost", "pagerduty"])
def test_a_payload_without_a_title_names_the_missing_field(fmt):
    with pytest.raises(FormatError, match=r"payload\.title"):
        render(fmt, b'{"severity": "critical"}', EVENT)


def test_pagerduty_without_a_routing_key_says_so():
    with pytest.raises(FormatError, match="routing_key"):
        render("pagerduty", json.dumps(FULL).encode(), Event("e", "t", WHEN, {}))


def test_timeouts_grow_per_attempt_up_to_the_cap_and_the_lease():
    policy = RetryPolicy.from_json({"timeout_growth": 2, "timeout_cap_ms": 12000})
    assert [policy.timeout(2.0, n, 55.0) for n in (1, 2, 3, 4, 5)] == [2, 4, 8, 12, 12]
    assert RetryPolicy.from_json({}).timeout(10.0, 9, 55.0) == 10
    assert RetryPolicy.from_json({"timeout_growth": 3}).timeout(10.0, 5, 55.0) == 55


def test_category_minimum_delays():
    policy = RetryPolicy.from_json({"category_min_delays": {"rate_limited": 60, "dns": 5}})
    assert policy.min_delay(Category.RATE_LIMITED, 1.0) == 60
    assert policy.min_delay(Category.DNS, 30.0) == 30
    assert policy.min_delay(Category.HTTP_5XX, 1.0) == 1
    with pytest.raises(ValueError, match="unknown key"):
        RetryPolicy.from_json({"min_delays": {}})
