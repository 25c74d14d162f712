"""`webhook-worker api` as a process: a producer publishes with its token and a reader follows the
delivery to `delivered` through the API, with a real worker and a real receiver."""

from __future__ import annotations

import pytest

from tests.api.server import ApiProcess, make_token
from tests.support import eventually


@pytest.fixture
def api_process(db, tmp_path):
    process = ApiProcess(db, tmp_path)
    yield process
    process.kill()


def test_a_producer_publishes_and_a_reader_follows_it_to_delivered(api_process, db, receiver, spawn):
    client = api_process.client
    admin, producer, reader = (make_token(db, role) for role in ("admin", "producer", "reader"))
    assert client.get("/health").status == 200
    # the process serves the console beside the API, at /console/
    assert client.get("/console/login").status == 200
    eventually(lambda: client.get("/ready").status == 200, message="api ready")
    registered = client.post(
        "/v1/endpoints", admin, {"name": "orders", "url": receiver.url("/orders"), "event_types": ["order.*"]}
    )
    assert registered.status == 201, registered.body
    spawn(db)
    published = client.post(
        "/v1/messages",
        producer,
        {"event_type": "order.paid", "payload": {"order": 42}, "idempotency_key": "order-42-paid"},
    )
    assert published.status == 202, published.body
    [delivery] = published.json["deliveries"]
    # the producer's token reads nothing
    assert client.get(f"/v1/deliveries/{delivery['delivery_id']}", producer).status == 403

    def delivered():
        answer = client.get(f"/v1/deliveries/{delivery['delivery_id']}", reader)
        return answer.json["status"] == "delivered" and answer

    done = eventually(delivered, message="delivered")
    assert [a["outcome"] for a in done.json["attempts_history"]] == ["delivered"]
    [request] = receiver.requests
    assert request.path == "/orders" and request.headers["webhook-id"] == "order-42-paid"
    by_key = client.get("/v1/deliveries?idempotency_key=order-42-paid", reader)
    assert [d["status"] for d in by_key.json["items"]] == ["delivered"]
    # /metrics is served on api.metrics_port only: the public port's request counts stay private
    assert client.get("/metrics").status == 404
    metrics = client.metrics()
    assert 'webhook_api_requests_total{method="POST",route="/v1/messages",status="202"} 1.0' in metrics
    assert api_process.stop() == 0
    log = api_process.log_path.read_text()
    for token in (admin, producer, reader):
        assert token not in log and token not in metrics
    assert "/orders" not in log  # an endpoint URL's path never reaches a log line
    assert '"level": "error"' not in log, log
    # its own login (tests/api/server.py), as docs/security.md has it: checked, nothing to warn about
    assert '"api login checked"' in log and '"problems": 0' in log, log
    assert "more rights than it needs" not in log and "lacks a group role" not in log, log
