"""Classification and backoff, as pinned in docs/design.md."""

import random
import re
from datetime import UTC, datetime

import pytest

from tests.support import ROOT
from worker.policy import (
    CATEGORIES,
    DEFAULT_DELAYS,
    AttemptResult,
    Category,
    Outcome,
    RetrySchedule,
    classify,
    parse_retry_after,
    retry_delay,
)


@pytest.mark.parametrize("status", [200, 201, 202, 204, 299])
def test_2xx_is_delivered(status):
    assert classify(AttemptResult(status=status)).outcome is Outcome.DELIVERED


@pytest.mark.parametrize(
    ("status", "category"),
    [(301, Category.REDIRECT), (302, Category.REDIRECT), (408, Category.HTTP_4XX),
     (425, Category.HTTP_4XX), (429, Category.RATE_LIMITED), (500, Category.HTTP_5XX),
     (502, Category.HTTP_5XX), (503, Category.HTTP_5XX), (504, Category.HTTP_5XX)],
)
def test_retryable_statuses(status, category):
    decision = classify(AttemptResult(status=status))
    assert (decision.outcome, decision.category) == (Outcome.RETRY, category)


@pytest.mark.parametrize("status", [400, 401, 403, 404, 405, 413, 422])
def test_other_4xx_dead_letter_at_once(status):
    decision = classify(AttemptResult(status=status))
    assert decision.outcome is Outcome.DEAD_LETTER
    assert decision.category is Category.HTTP_4XX
    assert not decision.disable_endpoint


def test_410_dead_letters_and_disables_the_endpoint():
    decision = classify(AttemptResult(status=410))
    assert decision.outcome is Outcome.DEAD_LETTER and decision.disable_endpoint


@pytest.mark.parametrize("category", [Category.TIMEOUT, Category.CONNECT, Category.DNS, Category.TLS,
                                      Category.PROTOCOL])
def test_transport_failures_retry_with_their_category(category):
    decision = classify(AttemptResult(failure=category, error="x"))
    assert (decision.outcome, decision.category) == (Outcome.RETRY, category)


@pytest.mark.parametrize("status", [429, 503])
def test_retry_after_on_429_and_503_is_a_deferral(status):
    decision = classify(AttemptResult(status=status, retry_after="120"))
    assert decision.outcome is Outcome.DEFERRED
    assert decision.retry_after_seconds == 120


def test_retry_after_http_date():
    now = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
    assert parse_retry_after("Thu, 01 Jan 2026 12:01:30 GMT", now) == 90
    assert parse_retry_after("Thu, 01 Jan 2026 11:00:00 GMT", now) == 0
    assert parse_retry_after("soon", now) is None
    assert parse_retry_after("999999999", now) == 86_400


def test_default_schedule_is_the_standard_webhooks_example():
    schedule = RetrySchedule.from_json(None, 0.2)
    assert [schedule.nominal_delay(n) for n in range(1, 10)] == list(DEFAULT_DELAYS)
    assert DEFAULT_DELAYS == (5, 300, 1800, 7200, 18000, 36000, 50400, 72000, 86400)
    # past the end of the list the last delay repeats
    assert schedule.nominal_delay(30) == 86400


def test_jitter_stays_within_twenty_percent():
    schedule = RetrySchedule.from_json({"delays": [100]}, 0.2)
    rng = random.Random(7)
    delays = [schedule.delay(1, rng) for _ in range(2000)]
    assert min(delays) >= 80 and max(delays) <= 120
    assert max(delays) - min(delays) > 30  # it really spreads


def test_exponential_schedule_is_capped():
    schedule = RetrySchedule.from_json({"base": 2, "multiplier": 3, "cap": 100}, 0.0)
    assert [schedule.nominal_delay(n) for n in range(1, 6)] == [2, 6, 18, 54, 100]


def test_bad_schedule_is_rejected():
    with pytest.raises(ValueError, match="delays"):
        RetrySchedule.from_json({"delays": []}, 0.2)
    with pytest.raises(ValueError, match="expected"):
        RetrySchedule.from_json({"every": 5}, 0.2)


def test_retry_after_wins_when_later_than_the_schedule():
    schedule = RetrySchedule.from_json({"delays": [5]}, 0.0)
    later = classify(AttemptResult(status=500, retry_after="60"))
    sooner = classify(AttemptResult(status=500, retry_after="1"))
    assert retry_delay(later, 1, schedule) == 60
    assert retry_delay(sooner, 1, schedule) == 5
    deferred = classify(AttemptResult(status=429, retry_after="2"))
    assert retry_delay(deferred, 1, schedule) == 2


def test_every_failure_category_sql_writes_is_one_the_filters_accept():
    # the filters (API, CLI, console) take policy.CATEGORIES: a category only SQL sets must be there
    # too, or its dead letters could not be found by it
    written = set()
    for path in (ROOT / "sql" / "functions").glob("*.sql"):
        written |= set(re.findall(r"failure_category = '([a-z_0-9]+)'", path.read_text()))
    assert written and written <= set(CATEGORIES), written - set(CATEGORIES)
