"""How full a claim is: one call of webhooks.acquire(), as the worker makes it, returns as many rows as
the batch, the due rows and the endpoints' limits allow, over one endpoint and over many, and also
while other claims hold some of the endpoints."""

from contextlib import ExitStack

import psycopg
import pytest

from tests.support import add_endpoints, enqueue, query

both_claims = pytest.mark.parametrize("claim_path", ["auto", "full"])
URL = "http://127.0.0.1:9/x"


def claim(conn: psycopg.Connection, claim_path: str, worker: str, batch: int) -> list[tuple]:
    conn.execute("SELECT set_config('webhooks.claim_path', %s, false)", (claim_path,))
    # the worker's call (worker/store/queue.py Queue.acquire)
    return conn.execute("SELECT * FROM webhooks.acquire(%s, %s, %s)", (worker, batch, 30)).fetchall()


def claim_once(db: str, claim_path: str, batch: int) -> int:
    with psycopg.connect(db, autocommit=True) as conn:
        return len(claim(conn, claim_path, "w", batch))


@both_claims
@pytest.mark.parametrize("due, batch, max_in_flight", [
    (5, 10, 1000), (50, 10, 1000), (250, 100, 1000), (250, 100, 7),
])
def test_a_claim_over_one_endpoint_takes_the_least_of_batch_due_rows_and_limit(
        db, claim_path, due, batch, max_in_flight):
    [endpoint] = add_endpoints(db, [URL], max_in_flight=max_in_flight)
    enqueue(db, endpoint, count=due)
    assert claim_once(db, claim_path, batch) == min(batch, due, max_in_flight)


@both_claims
@pytest.mark.parametrize("per_endpoint, batch, max_in_flight", [
    ([10] * 20, 100, 1000), ([10] * 20, 10, 1000), ([10] * 20, 100, 1), ([10] * 20, 100, 3),
    ([200] + [1] * 19, 100, 1000), ([1] * 20, 5, 1000),
])
def test_a_claim_over_twenty_endpoints_takes_the_least_of_batch_due_rows_and_limits(
        db, claim_path, per_endpoint, batch, max_in_flight):
    endpoints = add_endpoints(db, [URL] * len(per_endpoint), max_in_flight=max_in_flight)
    for endpoint, due in zip(endpoints, per_endpoint, strict=True):
        enqueue(db, endpoint, count=due)
    allowed = sum(min(due, max_in_flight, batch) for due in per_endpoint)
    assert claim_once(db, claim_path, batch) == min(batch, allowed)
    # and the claims that follow take the rest, a batch at a time, until the limits stop them
    total = min(batch, allowed)
    while (got := claim_once(db, claim_path, batch)) > 0:
        total += got
    assert total == sum(min(due, max_in_flight) for due in per_endpoint)


@both_claims
@pytest.mark.parametrize("holding", [1, 2, 3])
def test_a_claim_fills_its_batch_from_endpoints_other_open_claims_do_not_hold(db, claim_path, holding):
    # Claims of a fleet overlap: each skips the endpoints another holds (SKIP LOCKED) and takes the
    # next ones in the line. With (holding + 1) batches of endpoints due, the last claim still fills.
    batch = 4
    endpoints = add_endpoints(db, [URL] * (batch * (holding + 1)), max_in_flight=1)
    for endpoint in endpoints:
        enqueue(db, endpoint, count=2)
    with ExitStack() as open_claims:
        for n in range(holding):
            conn = open_claims.enter_context(psycopg.connect(db))  # its transaction stays open
            assert len(claim(conn, claim_path, f"holder-{n}", batch)) == batch
        with psycopg.connect(db, autocommit=True) as last:
            last.execute("SET lock_timeout = '2s'")  # waiting would fail the test, not hang it
            got = claim(last, claim_path, "last", batch)
    assert len(got) == batch
    assert len({row[1] for row in got}) == batch  # one row from each endpoint not held
    assert query(db, "SELECT count(*) FROM webhooks.alert_delivery_queue WHERE status = 'delivering'"
                     " AND locked_by = 'last'") == [(batch,)]
