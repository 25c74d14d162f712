"""Every way an attempt becomes a Finished (worker/daemon/outcomes.py), without a database or a request."""

import uuid
from datetime import UTC, datetime

from worker.daemon import outcomes
from worker.rules.classification import AttemptResult, Category, Outcome, RetryPolicy, RetrySchedule
from worker.rules.model import Claimed, Sent

SCHEDULE = RetrySchedule(delays=(10.0, 20.0), jitter=0.0)


def claimed(attempt: int = 1, **changes) -> Claimed:
    fields = dict(
        delivery_id=7, endpoint_id=1, event_id="evt_1", idempotency_key="evt_1", event_type="alert.created",
        body=b"{}", attempt=attempt, max_attempts=10, lease_token=uuid.uuid4(),
        locked_until=datetime.now(UTC), url="https://x.test/hook", signing_secrets=(), headers={},
        timeout_seconds=None, schedule=SCHEDULE,
    )
    return Claimed(**{**fields, **changes})


def test_a_2xx_answer_is_delivered_with_its_status_latency_and_excerpt_and_no_delay():
    row = claimed()
    finished = outcomes.from_attempt(row, Sent(AttemptResult(status=204), 12, "ok"))
    assert finished.outcome is Outcome.DELIVERED
    assert (finished.delivery_id, finished.lease_token, finished.attempt) == (7, row.lease_token, 1)
    assert (finished.http_status, finished.latency_ms, finished.response_excerpt) == (204, 12, "ok")
    assert finished.retry_after_s is None and finished.error is None and finished.failure_category is None


def test_a_5xx_answer_is_a_retry_on_the_schedule_naming_the_status():
    finished = outcomes.from_attempt(claimed(attempt=2), Sent(AttemptResult(status=502), 5, None))
    assert finished.outcome is Outcome.RETRY
    assert finished.failure_category == "http_5xx" and finished.error == "HTTP 502"
    assert finished.retry_after_s == 20.0  # the schedule's delay after attempt 2


def test_a_category_minimum_delay_wins_over_a_shorter_schedule():
    row = claimed(retry_policy=RetryPolicy(category_min_delays={"timeout": 60.0}))
    timed_out = AttemptResult(failure=Category.TIMEOUT, error="request timed out")
    finished = outcomes.from_attempt(row, Sent(timed_out, 3000, None))
    assert finished.outcome is Outcome.RETRY and finished.failure_category == "timeout"
    assert finished.retry_after_s == 60.0 and finished.error == "request timed out"


def test_a_429_with_retry_after_is_a_deferral_after_the_receiver_s_wait():
    finished = outcomes.from_attempt(claimed(), Sent(AttemptResult(status=429, retry_after="30"), 5, None))
    assert finished.outcome is Outcome.DEFERRED and finished.failure_category == "rate_limited"
    assert finished.retry_after_s == 30.0


def test_a_410_is_a_dead_letter_that_disables_the_endpoint():
    finished = outcomes.from_attempt(claimed(), Sent(AttemptResult(status=410), 5, None))
    assert finished.outcome is Outcome.DEAD_LETTER and finished.disable_endpoint
    assert finished.retry_after_s is None


def test_a_request_cut_off_by_shutdown_is_an_interrupted_retry_with_its_latency():
    finished = outcomes.interrupted(claimed(), grace_seconds=2.5, latency_ms=2500)
    assert finished.outcome is Outcome.RETRY and finished.failure_category == outcomes.INTERRUPTED
    assert finished.latency_ms == 2500 and finished.retry_after_s == 10.0
    assert "2.5 s grace" in (finished.error or "")


def test_a_payload_the_format_cannot_take_is_a_dead_letter_naming_the_format_within_bounds():
    finished = outcomes.cannot_render(claimed(body_format="slack"), "x" * 1000)
    assert finished.outcome is Outcome.DEAD_LETTER and finished.failure_category == "internal"
    assert (finished.reason or "").startswith("cannot render as slack: ")
    assert len(finished.reason or "") == len(finished.error or "") == outcomes.MAX_TEXT


def test_the_worker_s_own_failure_is_an_internal_retry_on_the_schedule_within_bounds():
    finished = outcomes.internal_failure(claimed(), "internal error: " + "y" * 1000)
    assert finished.outcome is Outcome.RETRY and finished.failure_category == "internal"
    assert finished.retry_after_s == 10.0 and len(finished.error or "") == outcomes.MAX_TEXT


URL = "https://hooks.example.test/services/T0/B0/SECRETPATHTOKEN?token=SECRETQUERYVALUE"


def test_an_error_or_reason_quoting_the_url_is_stored_without_its_secret_parts():
    row = claimed(url=URL)
    quoting = f"Can not write request body for {URL}"
    failed = AttemptResult(failure=Category.CONNECT, error=quoting)
    finished = outcomes.from_attempt(row, Sent(failed, 5, None))
    assert finished.error == "Can not write request body for https://hooks.example.test[redacted]"
    refused = AttemptResult(failure=Category.BLOCKED, error=quoting)
    blocked = outcomes.from_attempt(row, Sent(refused, 0, None))
    assert blocked.outcome is Outcome.DEAD_LETTER and "SECRET" not in (blocked.reason or "")
    assert "SECRET" not in (blocked.error or "")


def test_the_worker_s_own_texts_lose_the_url_s_secret_parts_even_where_cut_to_their_bounds():
    row = claimed(url=URL)
    failed = outcomes.internal_failure(row, f"internal error: ValueError: bad {URL}")
    assert failed.error == "internal error: ValueError: bad https://hooks.example.test[redacted]"
    # cut at MAX_TEXT inside the path: the start of the secret goes too
    cut = "z" * (outcomes.MAX_TEXT - 25) + "/services/T0/B0/SECRETPATHTOKEN?token=SECRETQUERYVALUE"
    failed = outcomes.internal_failure(row, cut)
    assert "SECRET" not in (failed.error or "") and len(failed.error or "") <= outcomes.MAX_TEXT
    unrendered = outcomes.cannot_render(row, "payload.title: SECRETQUERYVALUE is not a title")
    assert unrendered.reason == unrendered.error == (
        "cannot render as raw: payload.title: [redacted] is not a title")


def test_every_outcome_names_its_row_lease_attempt_and_tenant():
    # the tenant and rank make the delivery counter's label; the lease token is the fencing token
    row = claimed(attempt=3, tenant="acme", tenant_rank=4)
    for finished in (outcomes.from_attempt(row, Sent(AttemptResult(status=500), 5, "")),
                     outcomes.from_attempt(row, Sent(AttemptResult(status=200), 5, "")),
                     outcomes.interrupted(row, 2.0, 5),
                     outcomes.cannot_render(row, "no title"),
                     outcomes.internal_failure(row, "boom")):
        assert (finished.delivery_id, finished.lease_token, finished.attempt, finished.tenant,
                finished.tenant_rank) == (7, row.lease_token, 3, "acme", 4)


def test_only_a_non_2xx_status_becomes_the_error_and_a_dead_letter_keeps_its_reason():
    def error(status):
        return outcomes.from_attempt(claimed(), Sent(AttemptResult(status=status), 1, "")).error

    assert [error(s) for s in (199, 200, 299, 300)] == ["HTTP 199", None, None, "HTTP 300"]
    gone = outcomes.from_attempt(claimed(), Sent(AttemptResult(status=404), 1, ""))
    assert (gone.outcome, gone.reason, gone.error) == (Outcome.DEAD_LETTER, "HTTP 404", "HTTP 404")


def test_a_digest_s_outcome_goes_to_each_member_under_its_own_lease_and_attempt_and_one_reports_it():
    members = [claimed(delivery_id=11, attempt=1), claimed(delivery_id=12, attempt=3),
               claimed(delivery_id=13, attempt=2)]
    answered = outcomes.from_attempt(members[0], Sent(AttemptResult(status=503), 40, "busy"))
    given = outcomes.for_members(answered, members)
    assert [(f.delivery_id, f.lease_token, f.attempt) for f in given] == [
        (m.delivery_id, m.lease_token, m.attempt) for m in members]
    # the request counts once in the endpoint's health and circuit: the first member speaks for it
    assert [f.reports_request for f in given] == [True, False, False]
    # what the receiver answered, and one delay for the group, are every member's
    assert {(f.outcome, f.http_status, f.latency_ms, f.response_excerpt, f.retry_after_s, f.error)
            for f in given} == {(Outcome.RETRY, 503, 40, "busy", answered.retry_after_s, "HTTP 503")}


def test_the_worker_s_own_failure_of_a_digest_retries_each_member_on_its_schedule_and_one_reports_it():
    members = [claimed(delivery_id=21, attempt=1), claimed(delivery_id=22, attempt=2)]
    failed = outcomes.internal_failures(members, "renderer exploded")
    assert [(f.delivery_id, f.lease_token, f.attempt) for f in failed] == [
        (m.delivery_id, m.lease_token, m.attempt) for m in members]
    assert [f.reports_request for f in failed] == [True, False]
    assert [f.retry_after_s for f in failed] == [10.0, 20.0]  # each member's own place in the schedule
    assert all(f.outcome is Outcome.RETRY and f.failure_category == Category.INTERNAL.value
               and f.error == "renderer exploded" for f in failed)
    assert outcomes.internal_failures([], "nothing to carry") == []
