"""Every way an attempt becomes a Finished: answered, cut off by shutdown, unrenderable, or failed inside.

Error and reason texts leave here without the secret parts of the row's URL (worker/rules/redaction.py);
the response excerpt already came without them from the HTTP side, which knows where it was cut.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from worker.rules.classification import Category, Outcome, classify, retry_delay
from worker.rules.model import Claimed, Finished, Sent
from worker.rules.redaction import redact

# The failure category of a request still open when the shutdown grace ran out: a retry, its
# attempt counted; finish() keeps it out of the endpoint's health and circuit, since the worker,
# not the receiver, cut it off.
INTERRUPTED = "interrupted"
# The error and reason columns keep this much of a text.
MAX_TEXT = 500


def from_attempt(row: Claimed, sent: Sent) -> Finished:
    """The outcome of a request that was sent: classified, with its delay when it is tried again."""
    decision = classify(sent.result)
    delay = None
    if decision.outcome in (Outcome.RETRY, Outcome.DEFERRED):
        scheduled = retry_delay(decision, row.attempt, row.schedule)
        delay = row.retry_policy.min_delay(decision.category, scheduled)
    status = sent.result.status
    error = sent.result.error or (
        f"HTTP {status}" if status is not None and not 200 <= status < 300 else None
    )
    return Finished(
        delivery_id=row.delivery_id,
        lease_token=row.lease_token,
        attempt=row.attempt,
        tenant=row.tenant,
        tenant_rank=row.tenant_rank,
        outcome=decision.outcome,
        retry_after_s=delay,
        http_status=status,
        failure_category=decision.category.value if decision.category else None,
        error=None if error is None else redact(error, row.url),
        response_excerpt=sent.excerpt,
        latency_ms=sent.latency_ms,
        reason=None if decision.reason is None else redact(decision.reason, row.url),
        disable_endpoint=decision.disable_endpoint,
    )


def interrupted(row: Claimed, grace_seconds: float, latency_ms: int) -> Finished:
    """A request still open when the shutdown grace ran out: it was sent, so it was an attempt."""
    return Finished(
        delivery_id=row.delivery_id,
        lease_token=row.lease_token,
        attempt=row.attempt,
        tenant=row.tenant,
        tenant_rank=row.tenant_rank,
        outcome=Outcome.RETRY,
        retry_after_s=row.schedule.delay(row.attempt),
        failure_category=INTERRUPTED,
        error=f"interrupted: the worker shut down with the request open after its {grace_seconds:g} s grace",
        latency_ms=latency_ms,
    )


def for_members(answered: Finished, members: Sequence[Claimed]) -> list[Finished]:
    """A digest's outcome given to each member it carried, under the member's own lease token and
    attempt; the first reports the request to the endpoint's health and circuit, the others do not.
    One delay for all: a failed digest is claimed again as one group."""
    return [replace(answered, delivery_id=m.delivery_id, lease_token=m.lease_token, attempt=m.attempt,
                    reports_request=i == 0) for i, m in enumerate(members)]


def cannot_render(row: Claimed, reason: str, reports_request: bool = True) -> Finished:
    """A payload the endpoint's body format cannot take: retrying would not change that.
    `reports_request`: False when the request goes for the others of its digest, which speaks for it."""
    text = stored_text(f"cannot render as {row.body_format}: {reason}", row)
    return Finished(
        delivery_id=row.delivery_id,
        lease_token=row.lease_token,
        attempt=row.attempt,
        tenant=row.tenant,
        tenant_rank=row.tenant_rank,
        outcome=Outcome.DEAD_LETTER,
        failure_category=Category.INTERNAL.value,
        error=text,
        reason=text,
        reports_request=reports_request,
    )


def internal_failures(rows: Sequence[Claimed], error: str) -> list[Finished]:
    """The worker's own failure of one request: each row it was to carry tried again on the
    schedule; the first reports the request."""
    return [internal_failure(row, error, reports_request=i == 0) for i, row in enumerate(rows)]


def internal_failure(row: Claimed, error: str, reports_request: bool = True) -> Finished:
    """The worker's own failure (unreadable settings, an exception): tried again on the schedule."""
    return Finished(
        delivery_id=row.delivery_id,
        lease_token=row.lease_token,
        attempt=row.attempt,
        tenant=row.tenant,
        tenant_rank=row.tenant_rank,
        outcome=Outcome.RETRY,
        retry_after_s=row.schedule.delay(row.attempt),
        failure_category=Category.INTERNAL.value,
        error=stored_text(error, row),
        reports_request=reports_request,
    )


def stored_text(text: str, row: Claimed) -> str:
    """An error or reason as the error and reason columns keep it: at most MAX_TEXT characters,
    without the row's URL's secret parts (a text may quote them; the URL is in hand only here)."""
    cut = len(text) > MAX_TEXT
    return redact(text[:MAX_TEXT], row.url, cut)[:MAX_TEXT]
