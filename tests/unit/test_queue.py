"""The outcome document the worker hands to webhooks.finish(), built without a database."""

import json
import uuid

from worker.rules.classification import Outcome
from worker.rules.model import Finished
from worker.store.queue import outcomes_document


def test_the_outcome_document_has_every_field_by_name_and_the_token_as_text():
    token = uuid.uuid4()
    delivered = Finished(delivery_id=7, lease_token=token, attempt=2, outcome=Outcome.DELIVERED,
                         http_status=200, latency_ms=12, response_excerpt="ok")
    # the worker passes Outcome members as well as their values; error texts can be any language
    retry = Finished(delivery_id=8, lease_token=token, attempt=1, outcome=Outcome.RETRY, retry_after_s=4.5,
                     failure_category="timeout", error="délai dépassé après 10 s")

    assert json.loads(outcomes_document([delivered, retry])) == [
        {"delivery_id": 7, "lease_token": str(token), "attempt": 2, "outcome": "delivered",
         "retry_after_s": None, "http_status": 200, "failure_category": None, "error": None,
         "response_excerpt": "ok", "latency_ms": 12, "reason": None, "disable_endpoint": False,
         "reports_request": True, "tenant": "default", "tenant_rank": 1},
        {"delivery_id": 8, "lease_token": str(token), "attempt": 1, "outcome": "retry",
         "retry_after_s": 4.5, "http_status": None, "failure_category": "timeout",
         "error": "délai dépassé après 10 s", "response_excerpt": None, "latency_ms": None, "reason": None,
         "disable_endpoint": False, "reports_request": True, "tenant": "default", "tenant_rank": 1},
    ]  # (finish() reads no tenant: it counts in the worker's metrics only)


def test_a_lone_surrogate_still_makes_a_document_with_every_outcome():
    # orjson refuses such a string; the batch must still be written (the database then refuses
    # that one outcome, and the worker isolates it) rather than fail whole.
    token = uuid.uuid4()
    odd = Finished(delivery_id=1, lease_token=token, attempt=1, outcome=Outcome.RETRY,
                   error="bad \ud800 text")
    fine = Finished(delivery_id=2, lease_token=token, attempt=1, outcome=Outcome.DELIVERED)

    document = json.loads(outcomes_document([odd, fine]))

    assert [o["delivery_id"] for o in document] == [1, 2]
    assert document[0]["error"] == "bad \ud800 text"
    assert document[0]["lease_token"] == str(token)
