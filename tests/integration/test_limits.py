"""Fleet-wide protection of receivers, with three worker processes unless said otherwise."""

import os
import time
from collections import Counter, defaultdict

import psycopg
import pytest

from tests.receiver import Reply
from tests.support import (
    HANG_SECONDS,
    SECONDS_PER_ROW,
    add_endpoint,
    drain_progress,
    enqueue,
    eventually,
    query,
    statuses,
    wait_final,
    wait_started,
)

FAST_RETRY = {"delays": [0.1]}


# Between its claim and its request, each worker may hold one claim batch, at most the burst: so
# that many requests per worker may arrive later than the bucket let them go, and land in a later
# window. A bucket per process would let the three workers send three times the limit.
def spread_allowance(workers: int, burst: int) -> int:
    return workers * burst


def start_fleet(spawn, db, count=3, **sections):
    workers = [spawn(db, name=f"worker-{n}", **sections) for n in range(1, count + 1)]
    wait_started(workers)
    return workers


def endpoint_events(db, endpoint):
    return query(db, "SELECT change, reason, decided_by, delivery_id, extract(epoch FROM at)::float8"
                     " FROM webhooks.endpoint_events WHERE webhook_id = %s ORDER BY id", (endpoint,))


def test_a_rate_limit_holds_across_the_fleet(db, receiver, spawn):
    endpoint = add_endpoint(db, receiver.url("/rated"), rate_limit_per_second=20, rate_limit_burst=5,
                            max_in_flight=100)
    ids = enqueue(db, endpoint, count=600)
    start_fleet(spawn, db)
    wait_final(db, ids, message="600 delivered")

    arrivals = sorted(r.at for r in receiver.to("/rated"))
    assert len(arrivals) == 600
    allowance = spread_allowance(workers=3, burst=5)
    busiest = max(sum(1 for t in arrivals[i:i + 80] if t < start + 1.0) for i, start in enumerate(arrivals))
    drain = arrivals[-1] - arrivals[0]
    print(f"rate limit 20/s burst 5: busiest 1 s window {busiest} requests, drain {drain:.1f} s")
    # The bucket's own bound over the whole run: by any arrival, no more requests than the burst plus
    # 20 a second since the first, give or take the batches between claim and send.
    over = [(n + 1, t - arrivals[0]) for n, t in enumerate(arrivals)
            if n + 1 > 5 + 20 * (t - arrivals[0]) + allowance]
    assert over == [], f"(requests so far, seconds) beyond the bucket: {over[:5]}"
    # And in any one second: at most 5 + 20 claimed, plus what the spread moved into it.
    assert busiest <= 25 + allowance
    assert query(db, "SELECT max(attempts), count(*) FILTER (WHERE status = 'delivered')"
                     " FROM webhooks.alert_delivery_queue") == [(1, 600)]


def test_a_concurrency_cap_holds_across_the_fleet(db, receiver, spawn):
    endpoint = add_endpoint(db, receiver.url("/capped"), max_in_flight=2)
    receiver.script("/capped", Reply(200, delay=0.3))
    ids = enqueue(db, endpoint, count=20)
    start_fleet(spawn, db)
    wait_final(db, ids, message="20 delivered")
    print(f"concurrency cap 2: at most {receiver.max_open['/capped']} open at the receiver")
    assert receiver.max_open["/capped"] == 2
    assert query(db, "SELECT max(attempts), count(*) FILTER (WHERE status = 'delivered')"
                     " FROM webhooks.alert_delivery_queue") == [(1, 20)]


def test_the_circuit_opens_probes_reopens_and_closes(db, receiver, spawn):
    endpoint = add_endpoint(
        db, receiver.url("/flaky"), retry_schedule=FAST_RETRY, max_attempts=50, max_in_flight=10,
        circuit_policy={"min_attempts": 20, "failure_ratio": 0.6, "window_seconds": 60,
                        "sleep_seconds": 2, "probes": 5})
    receiver.script("/flaky", Reply(500))
    ids = enqueue(db, endpoint, count=60)
    start_fleet(spawn, db)

    eventually(lambda: [e for e in endpoint_events(db, endpoint) if e[0] == "circuit_opened"][1:],
               progress=lambda: drain_progress(db, ids), message="the circuit opened, probed and reopened")
    events = endpoint_events(db, endpoint)
    opened, half_open, reopened = events[0], events[1], events[2]
    assert [opened[0], half_open[0], reopened[0]] == ["circuit_opened", "circuit_half_open", "circuit_opened"]
    assert opened[2] == "circuit breaker" and "attempts failed" in opened[1]
    arrivals = sorted(r.at for r in receiver.to("/flaky"))
    before_open = [t for t in arrivals if t <= opened[4]]
    assert len(before_open) >= 20
    # sleeping: nothing is claimed, so the receiver gets at most the requests already on their way
    # when it opened, no more than max_in_flight across the fleet
    assert len([t for t in arrivals if opened[4] < t < float(half_open[4])]) <= 10
    probes = [t for t in arrivals if float(half_open[4]) <= t <= float(reopened[4])]
    assert 1 <= len(probes) <= 5
    assert "probes failed" in reopened[1]

    receiver.script("/flaky", Reply(200))  # the receiver recovers
    wait_final(db, ids, message="the backlog drains once it closes")
    changes = [e[0] for e in endpoint_events(db, endpoint)]
    assert changes[-1] == "circuit_closed"
    print("circuit: " + " → ".join(f"{e[0]} at +{float(e[4]) - float(opened[4]):.1f} s"
                                   for e in endpoint_events(db, endpoint)))
    seen = Counter(r.delivery_id for r in receiver.to("/flaky"))
    attempts = dict(query(db, "SELECT delivery_id, attempts FROM webhooks.alert_delivery_queue"))
    assert seen == Counter(attempts)
    assert set(statuses(db, ids).values()) == {"delivered"}


def test_retry_after_pauses_the_endpoint_for_every_worker(db, receiver, spawn):
    endpoint = add_endpoint(db, receiver.url("/busy"), max_in_flight=1)
    receiver.script("/busy", Reply(429, headers={"Retry-After": "2"}), Reply(200))
    ids = enqueue(db, endpoint, count=5)
    start_fleet(spawn, db)
    wait_final(db, ids, message="5 delivered")

    requests = receiver.to("/busy")
    assert len(requests) == 6
    gap = requests[1].at - requests[0].at
    print(f"Retry-After 2: next request {gap:.2f} s after the 429")
    assert gap >= 2.0 - 0.05
    first = requests[0].delivery_id
    assert query(db, "SELECT attempts, deferrals, status FROM webhooks.alert_delivery_queue"
                     " WHERE delivery_id = %s", (first,)) == [(1, 1, "delivered")]
    assert query(db, "SELECT max(attempts) FROM webhooks.alert_delivery_queue") == [(1,)]


def test_410_disables_the_endpoint_and_enable_sends_the_rows_that_waited(db, receiver, spawn):
    endpoint = add_endpoint(db, receiver.url("/gone"), max_in_flight=1, name="gone-receiver")
    receiver.script("/gone", Reply(410), Reply(200))
    ids = enqueue(db, endpoint, count=4)
    start_fleet(spawn, db)
    eventually(lambda: query(db, "SELECT NOT active FROM webhooks.endpoints WHERE id = %s",
                             (endpoint,))[0][0], message="endpoint disabled")
    [gone] = [d for d, s in statuses(db, ids).items() if s == "dead_letter"]
    [(change, reason, decided_by, delivery_id, _)] = endpoint_events(db, endpoint)
    assert (change, reason, delivery_id) == ("disabled", f"HTTP 410 Gone on delivery {gone}", gone)
    assert decided_by.startswith("worker ")
    assert query(db, "SELECT disabled_reason FROM webhooks.endpoints") == [(reason,)]
    # its other rows wait: a sentinel on another endpoint proves the workers kept claiming
    sentinel = add_endpoint(db, receiver.url("/sentinel"))
    [probe] = enqueue(db, sentinel)
    eventually(lambda: statuses(db, [probe])[probe] == "delivered", message="sentinel delivered")
    waiting = [d for d in ids if d != gone]
    assert set(statuses(db, waiting).values()) == {"pending"}
    assert len(receiver.to("/gone")) == 1

    enabled = subprocess_cli(db, "endpoints", "enable", "gone-receiver")
    assert "enabled" in enabled
    eventually(lambda: set(statuses(db, waiting).values()) == {"delivered"}, message="delivered after enable")
    assert [e[0] for e in endpoint_events(db, endpoint)] == ["disabled", "enabled"]


def subprocess_cli(db, *args):
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-m", "worker", *args], capture_output=True, text=True,
                            env={**os.environ, "DATABASE_URL": db}, timeout=HANG_SECONDS, check=True)
    return result.stdout


def test_a_dead_endpoint_s_backlog_does_not_hold_up_a_healthy_one(db, receiver, spawn):
    dead = add_endpoint(db, receiver.url("/dead"), retry_schedule=FAST_RETRY)
    healthy = add_endpoint(db, receiver.url("/healthy"))
    receiver.script("/dead", Reply(hold=True))
    dead_ids = enqueue(db, dead, count=5000)
    healthy_ids = enqueue(db, healthy, count=500)  # inserted after the whole dead backlog
    start_fleet(spawn, db, delivery={"timeout_seconds": 1, "lease_seconds": 6})
    wait_final(db, healthy_ids, message="the healthy endpoint's 500 rows")
    [(untouched, tried)] = query(
        db, "SELECT count(*) FILTER (WHERE attempts = 0), count(*) FILTER (WHERE attempts > 0)"
            " FROM webhooks.alert_delivery_queue WHERE webhook_id = %s", (dead,))
    print(f"head of line: healthy endpoint done while {untouched} of {len(dead_ids)} dead-endpoint rows"
          f" untouched, {tried} tried")
    assert untouched > 4500
    # the dead endpoint was served meanwhile (its requests hung at the receiver): the healthy rows
    # went past a backlog that was in the way, not one the fleet had skipped
    assert tried > 0 and receiver.to("/dead")


def test_ordering_key_rows_go_one_at_a_time_in_order_and_other_keys_flow(db, receiver, spawn):
    endpoint = add_endpoint(db, receiver.url("/ordered"), retry_schedule={"delays": [0.3]})
    with psycopg.connect(db, autocommit=True) as conn:
        keyed = [r[0] for r in conn.execute(
            "INSERT INTO webhooks.alert_delivery_queue (webhook_id, event_type, payload, ordering_key)"
            " SELECT %s, 'alert.created', jsonb_build_object('n', n), 'alert-1'"
            " FROM generate_series(1, 50) n RETURNING delivery_id", (endpoint,)).fetchall()]
        other = [r[0] for r in conn.execute(
            "INSERT INTO webhooks.alert_delivery_queue (webhook_id, event_type, payload, ordering_key)"
            " SELECT %s, 'alert.created', jsonb_build_object('n', n), 'alert-2'"
            " FROM generate_series(1, 10) n RETURNING delivery_id", (endpoint,)).fetchall()]
    failing_first = keyed[0]
    # fails twice, then its third attempt is held open at the receiver until released below
    receiver.script_delivery(failing_first, Reply(500), Reply(500), Reply(200, hold=True))
    start_fleet(spawn, db)
    # the other key is not held back: all of it is delivered while alert-1's head is still unfinished
    wait_final(db, other, message="alert-2 delivered")
    assert statuses(db, [failing_first])[failing_first] != "delivered"
    # ...and nothing of alert-1 has overtaken its unfinished head
    assert {r.delivery_id for r in receiver.requests if r.delivery_id in keyed} == {failing_first}
    receiver.release()  # the gate stays open, so a third attempt still to come is answered at once
    wait_final(db, keyed + other, message="all delivered")

    order = [r.delivery_id for r in receiver.requests if r.delivery_id in keyed]
    assert order == [failing_first] * 3 + keyed[1:]
    assert len([r for r in receiver.requests if r.delivery_id in other]) == 10


# The per-test hang guard above the drain's own cap for 20,000 rows.
@pytest.mark.timeout(2700)
def test_many_endpoints_and_workers_never_deadlock(db, receiver, spawn, pg_server):
    healthy = [add_endpoint(db, receiver.url(f"/ok/{n}"), max_in_flight=20) for n in range(80)]
    rejecting = [add_endpoint(db, receiver.url(f"/bad/{n}")) for n in range(10)]
    failing = [add_endpoint(db, receiver.url(f"/err/{n}"), retry_schedule=FAST_RETRY, max_attempts=2,
                            circuit_policy={"min_attempts": 100000}) for n in range(10)]
    for n in range(10):
        receiver.script(f"/bad/{n}", Reply(400))
        receiver.script(f"/err/{n}", Reply(503))
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO webhooks.alert_delivery_queue (webhook_id, event_type, payload)"
            " SELECT (%s::bigint[])[1 + n %% 100], 'alert.created', jsonb_build_object('n', n)"
            " FROM generate_series(0, 19999) n", (healthy + rejecting + failing,))
        deadlocks_before = conn.execute(
            "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()").fetchone()[0]
    started = time.monotonic()
    workers = start_fleet(spawn, db, count=4, worker={"concurrency": 100})
    left = -1

    def final() -> bool:
        nonlocal left
        [(left,)] = query(db, "SELECT count(*) FROM webhooks.alert_delivery_queue"
                              " WHERE status NOT IN ('delivered', 'dead_letter')")
        return left == 0

    eventually(final, timeout=HANG_SECONDS + SECONDS_PER_ROW * 20_000, interval=0.5, progress=lambda: left,
               message="20,000 rows final")
    elapsed = time.monotonic() - started
    counts = dict(query(db, "SELECT status, count(*) FROM webhooks.alert_delivery_queue GROUP BY 1"))
    deadlocks = query(db, "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()")[0][0]
    print(f"contention: 20,000 rows over 100 endpoints by 4 workers in {elapsed:.1f} s, {counts},"
          f" deadlocks {deadlocks - deadlocks_before}")
    assert counts == {"delivered": 16000, "dead_letter": 4000}
    assert deadlocks - deadlocks_before == 0
    problems = defaultdict(list)
    for worker in workers:
        for line in worker.log_lines():
            # database trouble (deadlocks, serialization failures) shows as failed claims or finishes
            if line.get("level") == "error" or "failed; retrying" in str(line.get("event")):
                problems[worker.name].append(line)
    assert not problems, dict(problems)
