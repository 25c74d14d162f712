"""The console's pure decisions: the chart's bars, form values, cookie attributes, CSRF tokens."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from worker.api.endpoints import ReasonBody
from worker.console import forms, sessions
from worker.console.chart import bucket_start, build
from worker.console.pages import notice
from worker.rules.endpoints import MAX_REASON_CHARS

TEN_MINUTES = timedelta(minutes=10)
END = datetime(2026, 11, 26, 14, 7, 30, tzinfo=UTC)


def test_the_chart_has_a_bar_for_every_bucket_even_empty_ones():
    chart = build({}, END, 6, TEN_MINUTES)
    assert len(chart.bars) == 36 and chart.peak == 0
    assert chart.bars[-1].start == datetime(2026, 11, 26, 14, 0, tzinfo=UTC)
    assert chart.end == datetime(2026, 11, 26, 14, 10, tzinfo=UTC) and chart.hours == 6
    assert all(b.delivered_height == 0 and b.failed_height == 0 for b in chart.bars)
    assert chart.first_failure is None


def test_the_busiest_bucket_fills_the_height_and_failures_stack_on_deliveries():
    start = bucket_start(END, TEN_MINUTES)
    counts = {start: (30, 10), start - TEN_MINUTES: (20, 0), start - 3 * TEN_MINUTES: (0, 5)}
    chart = build(counts, END, 6, TEN_MINUTES)
    last, before = chart.bars[-1], chart.bars[-2]
    assert chart.peak == 40
    assert last.delivered_height + last.failed_height == chart.height
    assert last.failed_height == chart.height / 4 and before.delivered_height == chart.height / 2
    assert chart.first_failure == start - 3 * TEN_MINUTES
    assert (chart.delivered_total, chart.failed_total) == (50, 15)
    assert chart.bars[0].x == 0 and chart.bars[-1].x + chart.bars[-1].width <= chart.width


def test_counts_outside_the_window_are_not_drawn():
    old = bucket_start(END, TEN_MINUTES) - timedelta(hours=7)
    assert build({old: (5, 5)}, END, 6, TEN_MINUTES).peak == 0


@pytest.mark.parametrize("text", ["", "0", "-1", "1.5", "abc", "١٢", str(2**63)])
def test_an_identifier_must_be_a_positive_whole_number(text):
    with pytest.raises(forms.FieldError, match=r"^delivery_id: must be a positive whole number"):
        forms.identifier("delivery_id", text)


def test_filters_and_selections_are_read_or_refused_naming_the_field():
    assert forms.dead_letter_filters({"endpoint": " failing ", "event_type": "", "category": "http_5xx"}) == {
        "endpoint": "failing", "event_type": None, "category": "http_5xx"}
    with pytest.raises(forms.FieldError, match=r"^event_type:"):
        forms.dead_letter_filters({"event_type": "x" * 201})
    assert forms.selected_ids(["3", "1", "3"]) == [1, 3]
    with pytest.raises(forms.FieldError, match=r"^delivery_id: select at least one"):
        forms.selected_ids([])
    with pytest.raises(forms.FieldError, match=r"^delivery_id: at most"):
        forms.selected_ids([str(i) for i in range(1, 202)])


def test_a_reason_is_required_printable_and_bounded():
    assert forms.reason("  receiver\n migrating ") == "receiver migrating"
    for bad, problem in (("   ", "say why"), ("x" * 1001, "at most 1000"), ("a\x00b", "printable")):
        with pytest.raises(forms.FieldError, match=rf"^reason: .*{problem}"):
            forms.reason(bad)
    assert forms.reason("x" * 600) == "x" * 600  # what the API takes, the console takes


def test_the_console_and_the_api_hold_reasons_to_one_limit():
    # an outside user's 600-character reason, taken by the API, was refused by the console (500)
    [limit] = [m.max_length for m in ReasonBody.model_fields["reason"].metadata if hasattr(m, "max_length")]
    assert forms.MAX_REASON_LENGTH == limit == MAX_REASON_CHARS
    with pytest.raises(forms.FieldError, match=r"^action: must be one of enable, disable, reset, open"):
        forms.endpoint_action("delete")


def test_the_cookie_is_secure_behind_tls_only():
    assert sessions.cookie_is_secure("https", None)
    assert sessions.cookie_is_secure("http", "https")
    assert sessions.cookie_is_secure("http", "HTTPS, http")
    assert not sessions.cookie_is_secure("http", None) and not sessions.cookie_is_secure("http", "http")
    options = sessions.cookie_options(True, 60)
    assert options["httponly"] and options["samesite"] == "Strict" and options["secure"]


def test_a_csrf_token_belongs_to_its_session():
    one, two = sessions.new_secret(), sessions.new_secret()
    assert sessions.csrf_token(one) == sessions.csrf_token(one) != sessions.csrf_token(two)
    assert one not in sessions.csrf_token(one)
    assert sessions.same_secret(sessions.csrf_token(one), sessions.csrf_token(one))
    assert not sessions.same_secret(sessions.csrf_token(one), "")
    assert not sessions.same_secret("", "")


def test_a_notice_is_one_of_the_fixed_texts():
    assert notice({"notice": "replayed", "n": "3"}) == "3 dead letter(s) put back in the queue."
    assert notice({"notice": "anything you like"}) is None
    assert notice({"notice": "replayed", "n": "<script>"}) is None
