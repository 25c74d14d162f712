"""The attempt's own decisions: what a request carries and as what, and who reports it."""

import asyncio
import json
import uuid
from dataclasses import replace
from datetime import UTC, datetime

from worker.daemon.attempt import Executor, InFlight, render
from worker.daemon.sender import Sender
from worker.observability import Metrics, get_logger
from worker.rules import coalescing
from worker.rules.classification import Outcome, RetrySchedule
from worker.rules.model import Claimed, Finished

GOOD = b'{"title": "disk full"}'
BAD = b'{"severity": "critical"}'  # no title: a Slack message cannot be made of it


def row(delivery_id: int, body: bytes = GOOD, digest_id: int | None = 9) -> Claimed:
    return Claimed(
        delivery_id=delivery_id, endpoint_id=1, event_id=f"evt_{delivery_id}",
        idempotency_key=f"evt_{delivery_id}", event_type="alert.created", body=body, attempt=1,
        max_attempts=10, lease_token=uuid.uuid4(), locked_until=datetime.now(UTC),
        url="http://127.0.0.1:9/hook", signing_secrets=(), headers={}, timeout_seconds=None,
        schedule=RetrySchedule(), body_format="slack", digest_id=digest_id,
    )


def test_a_member_that_cannot_be_rendered_is_refused_alone_and_the_rest_go_as_one_digest():
    members = [row(1), row(2, BAD), row(3)]
    rendered = render(members)
    assert rendered.carried == [members[0], members[2]]
    assert [(m.delivery_id, "payload.title" in why) for m, why in rendered.refused] == [(2, True)]
    assert rendered.request is not None and rendered.request.digest_id == 9
    assert rendered.request.event_type == coalescing.DIGEST_EVENT_TYPE
    assert rendered.request.idempotency_key == coalescing.digest_webhook_id(rendered.carried)


def test_a_digest_left_with_one_member_goes_as_a_message_of_its_own():
    lone = row(2)
    for members in ([row(1, BAD), lone], [lone]):  # the others refused, or left before the claim
        rendered = render(members)
        assert rendered.carried == [lone]
        assert rendered.request == replace(lone, digest_id=None)
        assert "blocks" in json.loads(rendered.body)  # a message of its own, not a digest's


def test_a_request_reports_to_the_endpoint_s_health_once_even_when_no_member_could_be_rendered():
    given: list[Finished] = []
    done: list[InFlight] = []
    flight = InFlight([row(1, BAD), row(2, BAD), row(3, BAD)])
    executor = Executor(Sender(1), Metrics(), get_logger(), given.append, done.append, 5.0, 55.0)
    asyncio.run(executor.run(flight))
    assert [(f.delivery_id, f.outcome, f.reports_request) for f in given] == [
        (1, Outcome.DEAD_LETTER, True), (2, Outcome.DEAD_LETTER, False), (3, Outcome.DEAD_LETTER, False)]
    assert done == [flight] and flight.members == [] and flight.started is None
