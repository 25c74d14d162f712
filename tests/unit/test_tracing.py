"""An attempt's OpenTelemetry span is a child of the queued row's W3C trace context."""

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from worker.observability import attempt_span

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
