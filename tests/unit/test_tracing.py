"""An attempt's OpenTelemetry span is a child of the queued row's W3C trace context."""

import asyncio
import uuid
from datetime import UTC, datetime

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from worker.daemon.attempt import Executor, InFlight
from worker.daemon.sender import Sender
from worker.observability import Metrics, attempt_span, get_logger
from worker.rules.classification import Outcome, RetrySchedule
from worker.rules.destinations import DestinationRules
from worker.rules.model import Claimed, Finished

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)


def test_the_attempt_span_continues_the_row_s_trace():
    exporter.clear()
    with attempt_span(TRACEPARENT, {"webhook.delivery_id": 7}) as span:
        span.set_attribute("http.response.status_code", 200)
    [finished] = exporter.get_finished_spans()
    assert finished.name == "webhook.deliver"
    assert format(finished.context.trace_id, "032x") == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert format(finished.parent.span_id, "016x") == "00f067aa0ba902b7"
    assert finished.attributes["webhook.delivery_id"] == 7
    assert finished.kind is trace.SpanKind.CLIENT


def test_without_a_traceparent_the_span_starts_a_trace_of_its_own():
    exporter.clear()
    with attempt_span(None, {}):
        pass
    [finished] = exporter.get_finished_spans()
    assert finished.parent is None


# --- the worker's attempts: a row of its own and a digest alike ---------------------------------

OTHER_TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def member(delivery_id: int, url: str, traceparent: str, digest_id: int | None) -> Claimed:
    return Claimed(
        delivery_id=delivery_id, endpoint_id=1, event_id=f"evt_{delivery_id}",
        idempotency_key=f"evt_{delivery_id}", event_type="alert.created", body=b'{"title": "disk full"}',
        attempt=1, max_attempts=10, lease_token=uuid.uuid4(), locked_until=datetime.now(UTC), url=url,
        signing_secrets=(), headers={}, timeout_seconds=None, schedule=RetrySchedule(),
        traceparent=traceparent, body_format="slack", digest_id=digest_id,
    )


def attempt(members: list[Claimed]) -> list[Finished]:
    """One request through the worker's executor, as the claim loop hands it over; its outcomes."""
    given: list[Finished] = []

    async def run() -> None:
        sender = Sender(1, DestinationRules(block_private=False))
        await sender.start()
        executor = Executor(sender, Metrics(), get_logger(), given.append, lambda flight: None, 5.0, 55.0)
        try:
            await executor.run(InFlight(members))
        finally:
            await sender.close()

    asyncio.run(run())
    return given


@pytest.mark.parametrize("rows", [1, 3])
def test_every_request_the_worker_sends_has_its_span_a_digest_s_too(receiver, rows):
    url = receiver.url("/traced")
    digest_id = 9 if rows > 1 else None
    members = [member(10 + i, url, TRACEPARENT if i == 0 else OTHER_TRACEPARENT, digest_id)
               for i in range(rows)]
    exporter.clear()
    given = attempt(members)
    assert [(f.delivery_id, f.outcome, f.reports_request) for f in given] == [
        (m.delivery_id, Outcome.DELIVERED, m is members[0]) for m in members]
    [request] = receiver.to("/traced")
    [span] = exporter.get_finished_spans()
    # one span for the one request, a child of its first member's trace
    assert span.name == "webhook.deliver" and span.kind is trace.SpanKind.CLIENT
    assert format(span.parent.span_id, "016x") == "00f067aa0ba902b7"
    assert span.attributes["webhook.delivery_id"] == 10
    assert span.attributes["http.response.status_code"] == 200
    assert span.attributes["webhook.event_type"] == request.headers["webhook-event-type"]
    if rows > 1:
        assert span.attributes["webhook.digest_id"] == request.headers["webhook-digest-id"] == "d-9"
        assert span.attributes["webhook.digest_rows"] == 3
    else:
        assert "webhook.digest_id" not in span.attributes
