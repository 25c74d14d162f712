"""SIGTERM with requests that outlast the grace: what was sent is an attempt.

A real `webhook-worker` process, PostgreSQL and a receiver on 127.0.0.1; prints its figures (-s).
"""

import signal
import time
from collections import Counter

from tests.receiver import Reply
from tests.support import HANG_SECONDS, add_endpoint, enqueue, eventually, query, statuses, wait_final


def report(name, **figures):
    print(f"\n[{name}] " + ", ".join(f"{k}={v}" for k, v in figures.items()))


def test_requests_open_when_the_grace_runs_out_are_interrupted_attempts(db, receiver, spawn):
    grace, timeout = 2, 40
    # A receiver slower than the grace, and a timeout longer than it.
    endpoint = add_endpoint(db, receiver.url("/slow"), timeout_ms=timeout * 1000,
                            retry_schedule={"delays": [0.1]})
    receiver.script("/slow", Reply(hold=True))
    ids = enqueue(db, endpoint, count=10)
    first = spawn(db, name="first", worker={"concurrency": 10, "shutdown_grace_seconds": grace})
    eventually(lambda: receiver.holding == 10, message="10 requests open")
    signalled = time.monotonic()
    first.signal(signal.SIGTERM)
    code = first.process.wait(HANG_SECONDS)
    exited_after = time.monotonic() - signalled

    after_shutdown = query(db, "SELECT status, attempts, lease_token IS NULL"
                               " FROM webhooks.alert_delivery_queue WHERE delivery_id = ANY(%s)", (ids,))
    circuit = query(db, "SELECT circuit_state, window_failures FROM webhooks.webhook_health_metrics"
                        " WHERE webhook_id = %s", (endpoint,))
    audit = query(db, "SELECT outcome, failure_category, latency_ms, error, worker_id"
                      " FROM webhooks.alert_delivery_log WHERE delivery_id = ANY(%s)", (ids,))
    receiver.script("/slow", Reply(200))
    receiver.release()
    spawn(db, name="second")
    wait_final(db, ids, message="sent again and delivered")
    attempts_sent = Counter((r.headers["webhook-attempt"]) for r in receiver.to("/slow"))
    report("SIGTERM, requests outlasting the grace", grace_seconds=grace, exit_code=code,
           seconds_to_exit=round(exited_after, 2), audit=dict(Counter((o, c) for o, c, *_ in audit)),
           latency_ms=[lat for _, _, lat, *_ in audit], webhook_attempt_headers=dict(attempts_sent),
           circuit=circuit)

    # It exits once the grace is over, not once its requests time out (the margin is for a loaded
    # machine: the claim is the grace against the timeout, not a speed)
    assert code == 0 and exited_after < timeout / 2
    # the attempt stays counted: the row is due again, held by nobody
    assert Counter(after_shutdown) == {("retrying", 1, True): 10}
    assert len(audit) == 10
    # the receiver was slow, not down: interruptions say nothing against it
    assert circuit == [("closed", 0)]
    for outcome, category, latency_ms, error, worker_id in audit:
        assert (outcome, category, worker_id) == ("retry", "interrupted", "first")
        assert "interrupted" in error
        # measured from the request's start to the interruption: at least the grace, and cut off
        # long before the timeout (the request started before the signal, by however long a loaded
        # machine took to send SIGTERM once the receiver held all ten)
        assert grace * 1000 <= latency_ms < timeout * 1000 / 2
    assert set(statuses(db, ids).values()) == {"delivered"}
    # each delivery went out twice, and the second copy says it is the second attempt
    assert attempts_sent == {"1": 10, "2": 10}
    assert query(db, "SELECT DISTINCT attempts FROM webhooks.alert_delivery_queue") == [(2,)]
