"""The exact bodies each format sends, for a full alert and for one missing optional fields."""

import json
from datetime import UTC, datetime

import pytest

from worker.rules.classification import Category, RetryPolicy
from worker.rules.formats import Event, FormatError, digest_item, render, render_digest

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
        "text": "\\[CRITICAL\\] Disk almost full on db-1",
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


def test_a_numeric_title_is_rendered_as_text_and_other_kinds_are_named():
    assert body("slack", {"title": 12345})["text"] == "12345"
    assert body("mattermost", {"summary": 2.5})["attachments"][0]["title"] == "2.5"
    for fmt in ("slack", "mattermost", "pagerduty"):
        with pytest.raises(FormatError, match=r"payload\.title: must be a string or a number"):
            render(fmt, b'{"title": ["a", "list"]}', EVENT)


def test_slack_escapes_what_would_end_the_link_or_make_a_mention():
    sent = body("slack", {"summary": "CPU > 90% & <rising> | x", "link": "https://example.com/b?x=1&y=2"})
    assert sent["text"] == "CPU &gt; 90% &amp; &lt;rising&gt; | x"
    assert sent["blocks"][0]["text"]["text"] == (
        "*<https://example.com/b?x=1&amp;y=2|CPU &gt; 90% &amp; &lt;rising&gt; ¦ x>*")
    # characters that would end the URL part are percent-encoded; no producer text makes `<!channel>`
    sent = body("slack", {"title": "<!channel> now", "severity": "<b>", "source": "a&b",
                          "url": "https://h.example/p|q>r s"})
    assert sent["blocks"][0]["text"]["text"] == (
        "*<https://h.example/p%7Cq%3Er%20s|[&lt;B&gt;] &lt;!channel&gt; now>*")
    assert sent["blocks"][1]["elements"][0]["text"] == "Severity: &lt;b&gt; | Source: a&amp;b"


def test_mattermost_shows_markdown_and_mentions_as_written():
    alert = {"title": "# [click](https://evil.example) **now** @channel", "source": "@all > x",
             "severity": "warning"}
    sent = body("mattermost", alert)
    assert sent["text"] == "\\[WARNING\\] # \\[click\\](https://evil.example) \\*\\*now\\*\\* @\u2060channel"
    attachment = sent["attachments"][0]
    # unlinked, Mattermost renders the title as Markdown: escaped; the heading mark is defused
    assert attachment["title"] == "\u2060# \\[click\\](https://evil.example) \\*\\*now\\*\\* @\u2060channel"
    assert attachment["fields"][1]["value"] == "@\u2060all \\> x"
    # linked, it is shown as plain text: nothing to escape there
    linked = body("mattermost", {**alert, "url": "https://grafana.example.test/d/1"})["attachments"][0]
    assert linked["title"] == "\u2060# [click](https://evil.example) **now** @\u2060channel"


SECTION = 3000


@pytest.mark.parametrize("length, cut", [(SECTION - 2, False), (SECTION - 1, True), (5000, True)])
def test_slack_section_text_fits_block_kit(length, cut):
    sent = body("slack", {"title": "x" * length})
    section = sent["blocks"][0]["text"]["text"]
    assert len(section) == min(length + 2, SECTION)
    assert section.endswith("…*") is cut
    assert len(sent["text"]) <= SECTION


def test_a_cut_never_splits_an_escape_and_a_long_link_is_dropped_not_cut():
    section = body("slack", {"title": "&" * 1000})["blocks"][0]["text"]["text"]
    assert len(section) <= SECTION and section.endswith("&amp;…*")
    assert section[1:-2].replace("&amp;", "") == ""
    linked = body("slack", {"title": "t" * 5000, "url": "https://h.example/" + "p" * 1000})
    text = linked["blocks"][0]["text"]["text"]
    assert len(text) == SECTION and text.startswith("*<https://h.example/ppp") and text.endswith("…>*")
    unlinked = body("slack", {"title": "t", "url": "https://h.example/" + "p" * 3000})
    assert unlinked["blocks"][0]["text"]["text"] == "*t*"


@pytest.mark.parametrize("length", [3999, 4000, 4001, 20000])
def test_mattermost_fields_fit_its_limits(length):
    sent = body("mattermost", {"title": "y" * length, "source": "s" * length, "severity": "info",
                               "url": "https://h.example/" + "p" * length})
    assert len(sent["text"]) == min(length + len("[INFO] "), 4000)
    attachment = sent["attachments"][0]
    assert len(attachment["title"]) == 1000 and attachment["title"].endswith("…")
    assert len(attachment["fields"][1]["value"]) == 300
    assert "title_link" not in attachment  # over 2,000 characters: dropped rather than cut
    assert len(json.dumps(attachment, ensure_ascii=False)) < 7900


@pytest.mark.parametrize("length, cut", [(1024, False), (1025, True)])
def test_pagerduty_summary_fits_1024(length, cut):
    summary = body("pagerduty", {"title": "z" * length})["payload"]["summary"]
    assert len(summary) == 1024 and summary.endswith("…") is cut


@pytest.mark.parametrize("fmt", ["envelope", "slack", "mattermost", "pagerduty"])
def test_a_payload_nested_deeper_than_python_parses_cannot_be_rendered(fmt):
    deep = b"[" * 3000 + b"1" + b"]" * 3000
    with pytest.raises(FormatError, match="nested too deeply"):
        render(fmt, deep, EVENT)
    assert render("raw", deep, EVENT) == deep


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


# --- digests -----------------------------------------------------------------------------------


def storm(critical=12, warning=20, resolved=5):
    """A storm's members as the worker checks them: (payload, event) per alert."""
    grafana = "https://grafana.example.test"
    alerts = ([{"title": f"link {n} down", "severity": "warning", "url": f"{grafana}/{n}"}
               for n in range(warning)]
              + [{"title": f"core {n} down", "severity": "critical", "url": f"{grafana}/c{n}"}
                 for n in range(critical)]
              + [{"title": f"link {n} back", "severity": "warning", "status": "resolved"}
                 for n in range(resolved)])
    return [digest_item("slack", json.dumps(a).encode(), Event(f"evt_{n}", "alert.created", WHEN, {}))
            for n, a in enumerate(alerts)]


def digest(fmt, items):
    return json.loads(render_digest(fmt, items))


def test_a_slack_digest_counts_by_severity_names_the_most_severe_first_with_links_and_counts_the_rest():
    sent = digest("slack", storm())
    assert sent["text"] == "37 alerts — 12 critical, 20 warning, 5 resolved"
    header, listed, more = sent["blocks"]
    assert header["text"]["text"] == "*37 alerts — 12 critical, 20 warning, 5 resolved*"
    lines = listed["text"]["text"].split("\n")
    assert len(lines) == 10
    assert lines[0] == "• <https://grafana.example.test/c0|[CRITICAL] core 0 down>"
    assert all("[CRITICAL]" in line for line in lines)  # twelve critical: the ten named are all critical
    assert more == {"type": "context", "elements": [{"type": "mrkdwn", "text": "and 27 more"}]}
    assert all(len(block["text"]["text"]) <= 3000 for block in sent["blocks"][:2])


def test_a_slack_digest_stays_within_block_kit_limits_and_escapes_producer_text():
    items = [digest_item("slack", json.dumps({"title": "<!channel> " + "x" * 5000, "severity": "error",
                                              "url": "https://e.test/" + "p" * 200}).encode(), EVENT)] * 40
    sent = digest("slack", items)
    assert "<!channel>" not in json.dumps(sent)
    assert len(sent["blocks"][1]["text"]["text"]) <= 3000 and len(sent["text"]) <= 3000


def test_a_mattermost_digest_is_one_markdown_message_within_its_limit():
    sent = digest("mattermost", storm())
    lines = sent["text"].split("\n")
    assert lines[0] == "**37 alerts — 12 critical, 20 warning, 5 resolved**"
    assert lines[1] == "- [\\[CRITICAL\\] core 0 down](https://grafana.example.test/c0)"
    assert lines[-1] == "and 27 more" and len(lines) == 12
    assert len(sent["text"]) <= 4000


def test_an_envelope_digest_is_a_webhook_batch_of_envelopes():
    events = [Event(f"evt_{n}", "alert.created", WHEN, {}) for n in range(3)]
    items = [digest_item("envelope", json.dumps({"n": n}).encode(), e) for n, e in enumerate(events)]
    assert digest("envelope", items) == {"type": "webhook.batch", "data": [
        {"id": f"evt_{n}", "type": "alert.created", "timestamp": WHEN.isoformat(), "data": {"n": n}}
        for n in range(3)]}


def test_a_member_that_cannot_be_rendered_is_refused_alone_and_raw_or_pagerduty_never_coalesce():
    with pytest.raises(FormatError, match=r"payload\.title"):
        digest_item("slack", b'{"severity": "critical"}', EVENT)
    for fmt in ("raw", "pagerduty"):
        with pytest.raises(FormatError, match="never coalesced"):
            digest_item(fmt, b"{}", EVENT)
        with pytest.raises(FormatError, match="never coalesced"):
            render_digest(fmt, [])
