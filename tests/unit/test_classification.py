"""Classification and backoff, as pinned in docs/design.md."""

import random
import re
from datetime import UTC, datetime

import pytest

from tests.support import ROOT
from worker.rules.classification import (
    CATEGORIES,
    DEFAULT_DELAYS,
    AttemptResult,
    Category,
    Decision,
    Outcome,
    RetryPolicy,
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


# --- every field of a decision, and the edges of each range (mutants showed them untested) -----


@pytest.mark.parametrize(("result", "decision"), [
    # a refused destination: dead at once, with the refusal as its reason (or a default one)
    (AttemptResult(failure=Category.BLOCKED, error="10.0.0.1 is private"),
     Decision(Outcome.DEAD_LETTER, Category.BLOCKED, reason="10.0.0.1 is private")),
    (AttemptResult(failure=Category.BLOCKED),
     Decision(Outcome.DEAD_LETTER, Category.BLOCKED, reason="destination refused")),
    # no status and no category: something inside the worker
    (AttemptResult(), Decision(Outcome.RETRY, Category.INTERNAL)),
    (AttemptResult(status=200, retry_after="60"), Decision(Outcome.DELIVERED)),
    (AttemptResult(status=300), Decision(Outcome.RETRY, Category.REDIRECT)),
    (AttemptResult(status=399), Decision(Outcome.RETRY, Category.REDIRECT)),
    (AttemptResult(status=429, retry_after="30"),
     Decision(Outcome.DEFERRED, Category.RATE_LIMITED, retry_after_seconds=30)),
    (AttemptResult(status=503, retry_after="30"),
     Decision(Outcome.DEFERRED, Category.HTTP_5XX, retry_after_seconds=30)),
    # a Retry-After on other retryable statuses is a floor for the delay, not a deferral
    (AttemptResult(status=408, retry_after="30"),
     Decision(Outcome.RETRY, Category.HTTP_4XX, retry_after_seconds=30)),
    (AttemptResult(status=500, retry_after="30"),
     Decision(Outcome.RETRY, Category.HTTP_5XX, retry_after_seconds=30)),
    (AttemptResult(status=410),
     Decision(Outcome.DEAD_LETTER, Category.HTTP_4XX, reason="HTTP 410 Gone: endpoint disabled",
              disable_endpoint=True)),
    (AttemptResult(status=404), Decision(Outcome.DEAD_LETTER, Category.HTTP_4XX, reason="HTTP 404")),
    (AttemptResult(status=499), Decision(Outcome.DEAD_LETTER, Category.HTTP_4XX, reason="HTTP 499")),
    (AttemptResult(status=500), Decision(Outcome.RETRY, Category.HTTP_5XX)),
    # outside every known range: retried as an internal problem, saying why
    (AttemptResult(status=199),
     Decision(Outcome.RETRY, Category.INTERNAL, reason="unexpected HTTP status 199")),
])
def test_each_result_gives_exactly_its_decision(result, decision):
    assert classify(result) == decision


def test_a_retry_after_date_is_counted_from_the_given_now_and_read_as_utc_without_a_zone():
    now = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
    decision = classify(AttemptResult(status=429, retry_after="Thu, 01 Jan 2026 12:00:45 GMT"), now)
    assert decision.retry_after_seconds == 45
    # "-0000" is RFC 2822's "zone unknown": parsed without one, taken as UTC
    assert parse_retry_after("Thu, 01 Jan 2026 12:00:45 -0000", now) == 45
    # a date is fine without `now` too (counted from the clock: long past, so zero)
    assert parse_retry_after("Thu, 01 Jan 2015 12:00:45 GMT") == 0


def test_schedule_bounds_are_inclusive_and_their_errors_say_which_rule():
    assert RetrySchedule.from_json({"delays": [0, 604_800]}, 0.1) == RetrySchedule(
        delays=(0.0, 604_800.0), jitter=0.1)
    assert RetrySchedule.from_json(None, 0.3) == RetrySchedule(jitter=0.3)
    for delays in ([-1], [604_801]):
        with pytest.raises(ValueError, match=r"^retry schedule: delays must be a non-empty list of 0 to"
                                             r" 604800 seconds$"):
            RetrySchedule.from_json({"delays": delays}, 0.2)
    assert RetrySchedule.from_json({"base": 0, "cap": 0, "multiplier": 1}, 0.1) == RetrySchedule(
        delays=(), base=0.0, multiplier=1.0, cap=0.0, jitter=0.1)
    assert RetrySchedule.from_json({"base": 604_800, "cap": 604_800, "multiplier": 100}, 0.0).cap == 604_800
    assert RetrySchedule.from_json({"base": 3}, 0.0) == RetrySchedule(
        delays=(), base=3.0, multiplier=2.0, cap=86_400.0, jitter=0.0)
    for spec in ({"base": -1}, {"base": 604_801}, {"base": 1, "cap": -1}, {"base": 1, "cap": 604_801},
                 {"base": 1, "multiplier": 0.5}, {"base": 1, "multiplier": 101}):
        with pytest.raises(ValueError, match=r"^retry schedule: base and cap 0 to 604800 s, multiplier 1 to"
                                             r" 100$"):
            RetrySchedule.from_json(spec, 0.2)
    with pytest.raises(ValueError, match=r"^retry schedule: expected \{'delays'"):
        RetrySchedule.from_json({"every": 5}, 0.2)


def test_a_zero_delay_stays_zero_and_jitter_uses_the_given_generator():
    assert RetrySchedule.from_json({"delays": [0.0, 0.5]}, 0.2).delay(1, random.Random(1)) == 0.0
    assert RetrySchedule.from_json({"delays": [0.5]}, 0.0).delay(1) == 0.5
    schedule = RetrySchedule.from_json({"delays": [100]}, 0.2)
    failed = classify(AttemptResult(status=500))
    assert retry_delay(failed, 1, schedule, random.Random(11)) == schedule.delay(1, random.Random(11))


def test_retry_policy_parses_every_key_in_its_units():
    policy = RetryPolicy.from_json({"connect_timeout_ms": 2500, "timeout_growth": 10,
                                    "timeout_cap_ms": 60_000,
                                    "category_min_delays": {"rate_limited": 60, "dns": 604_800}})
    assert policy == RetryPolicy(connect_timeout_seconds=2.5, timeout_growth=10.0, timeout_cap_seconds=60.0,
                                 category_min_delays={"rate_limited": 60.0, "dns": 604_800.0})
    assert RetryPolicy.from_json(None) == RetryPolicy(category_min_delays={})
    assert RetryPolicy.from_json({"timeout_growth": 1, "category_min_delays": {"dns": 0}}) == RetryPolicy(
        timeout_growth=1.0, category_min_delays={"dns": 0.0})


@pytest.mark.parametrize(("spec", "message"), [
    ({"connect_timeout_ms": 1, "retries": 3, "backoff": 1}, "retry policy: unknown key backoff"),
    ({"category_min_delays": {"dns": -1}}, "retry policy: category_min_delays are 0 to 604800 seconds"),
    ({"category_min_delays": {"dns": 604_801}}, "retry policy: category_min_delays are 0 to 604800 seconds"),
    ({"timeout_growth": 0.5}, "retry policy: timeout_growth is 1 to 10"),
    ({"timeout_growth": 10.5}, "retry policy: timeout_growth is 1 to 10"),
])
def test_retry_policy_refuses_what_is_out_of_range_naming_it(spec, message):
    with pytest.raises(ValueError) as raised:
        RetryPolicy.from_json(spec)
    assert str(raised.value) == message


def test_the_request_timeout_grows_per_attempt_up_to_its_cap_and_the_ceiling():
    policy = RetryPolicy.from_json({"timeout_growth": 2, "timeout_cap_ms": 30_000})
    assert [policy.timeout(5, n, 100) for n in (0, 1, 2, 3, 4, 5)] == [5, 5, 10, 20, 30, 30]
    assert policy.timeout(5, 3, 12) == 12  # never past what the lease allows
    assert policy.timeout(40, 3, 1000) == 40  # a cap below the base timeout does not cut the base
    assert RetryPolicy.from_json({"timeout_cap_ms": 1000}).timeout(5, 4, 100) == 5  # growth 1: unchanged
    assert RetryPolicy.from_json({"timeout_growth": 2}).timeout(1, 500, 1e300) == 2.0 ** 100  # bounded power


def test_a_category_minimum_delay_raises_only_that_category():
    policy = RetryPolicy.from_json({"category_min_delays": {"rate_limited": 60}})
    assert policy.min_delay(Category.RATE_LIMITED, 5) == 60
    assert policy.min_delay(Category.RATE_LIMITED, 90) == 90
    assert policy.min_delay(Category.DNS, 0.5) == 0.5
    assert policy.min_delay(None, 0.5) == 0.5
    assert RetryPolicy().min_delay(Category.DNS, 0.5) == 0.5
