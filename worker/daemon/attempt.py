"""One request's attempt: render, span, send, classify; a row of its own and a digest's members alike."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, NamedTuple

from worker.daemon import outcomes
from worker.daemon.sender import Sender, carries_transport_text, error_text
from worker.observability import Metrics, attempt_span, tracing
from worker.rules import coalescing, formats
from worker.rules.classification import Outcome
from worker.rules.model import Claimed, Finished, Sent
from worker.rules.redaction import display_url


class PoisonRow(Exception):
    """A claimed row that cannot be attempted (for example unreadable endpoint settings)."""


@dataclass(slots=True, eq=False)
class InFlight:
    """One request between its claim and its outcomes: what a shutdown still has to answer for.
    Compared and hashed by identity, so the claim loop can keep its requests in a dict."""

    # The rows this request answers for, in delivery order: one, or a digest's members. A member
    # whose payload cannot be rendered leaves before the request is sent, its outcome already given.
    members: list[Claimed]
    # time.monotonic() when the request was sent; None: not yet, so a shutdown releases its rows.
    started: float | None = field(default=None)


class Rendered(NamedTuple):
    """A request's body and what it carries."""

    request: Claimed | None  # the row the request is sent as; None: no member could be rendered
    body: bytes
    carried: list[Claimed]  # the members it carries, in delivery order
    refused: list[tuple[Claimed, str]]  # members whose payload the format cannot take, and why


def render(members: list[Claimed]) -> Rendered:
    """The request for a row of its own or for a digest's members, its body in the endpoint's
    format. A member whose payload the format cannot take is refused alone and the rest go; a digest
    left with one member goes as a message of its own, with no digest id to show."""
    refused: list[tuple[Claimed, str]] = []
    if len(members) > 1:
        items, carried = [], []
        for member in members:
            try:
                items.append(formats.digest_item(member.body_format, member.body, event(member)))
                carried.append(member)
            except (formats.FormatError, ValueError) as exc:
                refused.append((member, str(exc)))
        if len(carried) > 1:
            request = replace(carried[0], idempotency_key=coalescing.digest_webhook_id(carried),
                              event_type=coalescing.DIGEST_EVENT_TYPE)
            return Rendered(request, formats.render_digest(request.body_format, items), carried, refused)
        members = carried
    if not members:
        return Rendered(None, b"", [], refused)
    row = members[0]
    if row.digest_id is not None:
        row = replace(row, digest_id=None)
    try:
        # raw goes as it came: no event to build for it (formats.render would not read it)
        body = row.body if row.body_format == formats.RAW else formats.render(
            row.body_format, row.body, event(row))
    except (formats.FormatError, ValueError) as exc:
        return Rendered(None, b"", [], [*refused, (members[0], str(exc))])
    return Rendered(row, body, members, refused)


class Executor:
    """Runs each claimed request to its outcomes: the body rendered, one POST inside an
    OpenTelemetry span, the answer classified. Every member gets its outcome through `finish`, and
    one of them reports the request to the endpoint's health and circuit; then `done` is called."""

    def __init__(self, sender: Sender, metrics: Metrics, log: Any, finish: Callable[[Finished], None],
                 done: Callable[[InFlight], None], timeout_seconds: float, longest_seconds: float) -> None:
        self.sender = sender
        self.metrics = metrics
        self.log = log
        self._finish = finish
        self._done = done
        self.timeout_seconds = timeout_seconds  # when the endpoint sets none
        self.longest_seconds = longest_seconds  # what the lease allows, whatever the endpoint asks for
        self._debug = log.is_enabled_for(logging.DEBUG)

    def request_timeout(self, row: Claimed) -> float:
        """A request may never outlive its lease, whatever the endpoint asks for."""
        return row.retry_policy.timeout(row.timeout_seconds or self.timeout_seconds, row.attempt,
                                        self.longest_seconds)

    async def run(self, flight: InFlight) -> None:
        members = flight.members
        first = members[0]
        finished: list[Finished] = []
        given: set[int] = set()  # members whose outcome was given before the request
        try:
            if first.problem is not None:
                raise PoisonRow(first.problem)
            timeout = self.request_timeout(first)
            rendered = render(members)
            request, carried = rendered.request, rendered.carried
            flight.members = carried  # what a shutdown still has to release or record
            for i, (member, reason) in enumerate(rendered.refused):
                # Given at once, so that a shutdown does not release it again. No request was made
                # for it: the request the others make reports for the claim, or, when none is
                # made, the first refused does (one report per claimed request, as for failures).
                self._finish(outcomes.cannot_render(member, reason, reports_request=not carried and i == 0))
                given.add(member.delivery_id)
                self._row_log(member).error(
                    "payload cannot be rendered", body_format=member.body_format, error=reason)
            if request is not None:
                if tracing():
                    sent = await self._send_traced(flight, request, carried, rendered.body, timeout)
                else:
                    # no span to make: neither its attributes nor its context manager per request
                    flight.started = time.monotonic()
                    sent = await self.sender.send(request, rendered.body, timeout)
                self.metrics.request_duration.observe(sent.latency_ms / 1000.0)
                answered = outcomes.from_attempt(request, sent)
                if len(carried) > 1:
                    self.metrics.digests.inc()
                    self.metrics.digest_rows.observe(len(carried))
                    finished = outcomes.for_members(answered, carried)
                else:
                    finished = [answered]
                if answered.outcome != Outcome.DELIVERED or self._debug:
                    with contextlib.suppress(Exception):  # a log line must never cost an outcome
                        log = self._row_log(carried[0])
                        if first.digest_id is not None:
                            log = log.bind(digest=coalescing.digest_label(first.digest_id), rows=len(carried))
                        _log_attempt(log, request, sent, answered)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - one bad request must never stop the worker (logged below)
            what = "digest" if len(members) > 1 else "delivery"
            if isinstance(exc, PoisonRow):
                self._row_log(first).error(f"{what} cannot be attempted", error=str(exc))
            elif carries_transport_text(exc):
                # its text, and so its traceback, may quote the endpoint's URL: the type only
                self._row_log(first).error(f"{what} failed inside the worker", error=error_text(exc))
            else:
                self._row_log(first).exception(f"{what} failed inside the worker")
            done = given | {f.delivery_id for f in finished}
            finished += outcomes.internal_failures(
                [m for m in members if m.delivery_id not in done], failure_text(exc))
        finally:
            self._done(flight)
        for outcome in finished:
            self._finish(outcome)

    async def _send_traced(self, flight: InFlight, request: Claimed, carried: list[Claimed], body: bytes,
                           timeout_seconds: float) -> Sent:
        """The POST inside an OpenTelemetry span, child of the row's trace context."""
        attributes = {
            "webhook.delivery_id": request.delivery_id, "webhook.endpoint_id": request.endpoint_id,
            "webhook.attempt": request.attempt, "webhook.event_type": request.event_type,
        }
        if len(carried) > 1:
            attributes["webhook.digest_id"] = coalescing.digest_label(request.digest_id or 0)
            attributes["webhook.digest_rows"] = len(carried)
        with attempt_span(request.traceparent, attributes) as span:
            flight.started = time.monotonic()
            sent = await self.sender.send(request, body, timeout_seconds)
            if span is not None:
                span.set_attribute("http.response.status_code", sent.result.status or 0)
        return sent

    def _row_log(self, row: Claimed) -> Any:
        # Bound only when a line is written: binding on every delivery cost more than the line.
        return self.log.bind(
            delivery_id=row.delivery_id,
            endpoint_id=row.endpoint_id,
            attempt=row.attempt,
            event_type=row.event_type,
            **({"traceparent": row.traceparent} if row.traceparent else {}),
        )


def failure_text(exc: Exception) -> str:
    """The error column's text for a failure inside the worker: a poison row says why; anything
    else by its type only, as its text may quote the endpoint's URL."""
    return str(exc) if isinstance(exc, PoisonRow) else f"internal error: {error_text(exc)}"


def event(row: Claimed) -> formats.Event:
    created_at = row.created_at or datetime.now(UTC)
    return formats.Event(row.event_id, row.event_type, created_at, row.secret_settings)


def _log_attempt(log: Any, row: Claimed, sent: Sent, finished: Finished) -> None:
    fields = {
        "outcome": finished.outcome,
        "http_status": finished.http_status,
        "latency_ms": finished.latency_ms,
        "endpoint": display_url(row.url),
    }
    if finished.outcome == Outcome.DELIVERED:
        log.debug("delivered", **fields)
    else:
        log.info(
            "attempt failed",
            failure_category=finished.failure_category,
            error=finished.error,
            retry_in=finished.retry_after_s,
            **fields,
        )
