"""Faults injected for real: every queued row ends delivered or dead-lettered, whatever happens.

Each scenario runs `webhook-worker` processes against a real PostgreSQL and receivers on 127.0.0.1,
then checks the database and what the receivers recorded. Each prints a line of figures.
"""

import json
import random
import signal
import time
from collections import Counter

import psycopg
import pytest

from tests.faults import misbehaving
from tests.faults.misbehaving import TcpServer
from tests.receiver import Reply
from tests.support import (
    CONNECT_TIMEOUT_SECONDS,
    HANG_SECONDS,
    TEST_KEYRING,
    WORKER_LOGIN,
    add_endpoint,
    all_final,
    enqueue,
    eventually,
    login_dsn,
    query,
    statuses,
    wait_final,
    wait_started,
    worker_dsn,
)
from worker import encryption

QUICK_LEASE = {"timeout_seconds": 1, "lease_seconds": 6}
FAST_RETRY = {"delays": [0.1]}


def delivering(db, worker_name=None):
    sql = "SELECT count(*) FROM webhooks.alert_delivery_queue WHERE status = 'delivering'"
    if worker_name is None:
        return query(db, sql)[0][0]
    return query(db, sql + " AND locked_by = %s", (worker_name,))[0][0]


def sessions_of(db, worker_name):
    """How many PostgreSQL sessions a worker of that name still has (its pool, listener, liveness)."""
    names = [f"webhook-worker {worker_name}{suffix}" for suffix in ("", " listener", " liveness")]
    return query(db, "SELECT count(*) FROM pg_stat_activity WHERE application_name = ANY(%s)", (names,))[0][0]


def duplicates(receiver, path):
    seen = Counter(r.delivery_id for r in receiver.to(path))
    return sum(n - 1 for n in seen.values()), seen


def report(name, **figures):
    print(f"\n[{name}] " + ", ".join(f"{k}={v}" for k, v in figures.items()))


MIN_KILLS = 5


def unfinished(db):
    return query(db, "SELECT count(*) FROM webhooks.alert_delivery_queue"
                     " WHERE status NOT IN ('delivered', 'dead_letter')")[0][0]


# The per-test hang guard above its own: the kills' 240 s and the drain's cap for 20,000 rows.
@pytest.mark.timeout(2700)
def test_workers_killed_at_random_lose_nothing(db, receiver, spawn):
    # Retries a second apart: on a loaded machine a starved worker's request may time out (1 s
    # here), and the default schedule's second retry, 5 minutes on, would only make the drain wait.
    # Attempts to spare: on a machine loaded several times over (seen: load 15 on 2 cores), a row
    # met ten such timeouts and ended a dead letter, which is not what this test is about.
    endpoint = add_endpoint(db, receiver.url("/kill"), max_in_flight=1000, retry_schedule={"delays": [1]},
                            max_attempts=50)
    receiver.script("/kill", Reply(200, delay=0.05))
    ids = enqueue(db, endpoint, count=10_000)
    settings = {"worker": {"concurrency": 100}, "delivery": QUICK_LEASE}
    workers = [spawn(db, name=f"w{n}", **settings) for n in range(3)]
    kills, started = 0, time.monotonic()
    held_at_kills = set()  # (delivery, worker): each row a worker held, in flight or unwritten, when killed
    rng = random.Random(42)
    # Bounded: at most 20 kills, about one a second (the cadence is the scenario, not a wait). Until
    # the fifth kill the backlog is topped up, so however fast the workers drain, the kills happen
    # under load (at most 240 s, and at most 10,000 more rows).
    while kills < 20 and time.monotonic() - started < 240:
        if kills >= MIN_KILLS and all_final(db, ids):
            break
        if kills < MIN_KILLS and len(ids) < 20_000 and unfinished(db) < 2_000:
            ids += enqueue(db, endpoint, count=2_000)
        time.sleep(0.7)
        victim = rng.choice(workers)
        if receiver.open_now("/kill") == 0 or delivering(db, victim.name) == 0:
            continue  # only kill while it has requests open
        victim.signal(signal.SIGKILL)
        victim.process.wait(10)
        # A COMMIT the worker had already sent still lands after it died (its server session runs
        # the command before it notices the client is gone): a finish caught so would read as held
        # here and then end 'delivered' under its name. Read only once its sessions are gone.
        eventually(lambda name=victim.name: sessions_of(db, name) == 0, message=f"{victim.name} gone")
        # Every row it held, in flight or with an unwritten outcome, is still 'delivering' under it.
        held_at_kills |= {(d, victim.name) for (d,) in query(
            db, "SELECT delivery_id FROM webhooks.alert_delivery_queue"
                " WHERE status = 'delivering' AND locked_by = %s", (victim.name,))}
        kills += 1
        workers.remove(victim)
        workers.append(spawn(db, name=f"w{2 + kills}", **settings))
    wait_final(db, ids)
    recovered = time.monotonic() - started
    dup, seen = duplicates(receiver, "/kill")
    # How each attempt ended, as its claimer's lease stood (stale outcomes are the late finishes of
    # leases taken over, which changed nothing).
    ended = query(db, "SELECT delivery_id, worker_id, outcome FROM webhooks.alert_delivery_log"
                      " WHERE NOT stale AND delivery_id = ANY(%s)", (ids,))
    lease_ends = {(d, w) for d, w, outcome in ended if outcome == "lease_expired"}
    failed = sum(1 for *_, outcome in ended if outcome not in ("delivered", "lease_expired"))
    [(stale,)] = query(db, "SELECT count(*) FROM webhooks.alert_delivery_log WHERE stale")
    report("kill -9", deliveries=len(ids), kills=kills, in_flight_at_kills=len(held_at_kills),
           leases_taken_over=len(lease_ends - held_at_kills), failed_attempts=failed, stale_outcomes=stale,
           lost=len(set(ids) - set(seen)), duplicates=dup, seconds=round(recovered, 1))
    assert kills >= MIN_KILLS
    assert set(statuses(db, ids).values()) == {"delivered"}
    assert delivering(db) == 0
    assert set(seen) == set(ids)
    # every row a killed worker held came back through the end of its lease, under its name
    assert held_at_kills <= lease_ends
    # At least once, and each request beyond a delivery's first is explained by an attempt of that
    # delivery that ended without delivering: its lease ended (its worker was killed, or starved
    # past the lease on a loaded machine and the row taken over), or it failed (a timeout: the
    # receiver may have had it). A second request with neither (two workers holding a row at once,
    # one attempt sent twice) fails here.
    explained = Counter(d for d, _, outcome in ended if outcome != "delivered")
    unexplained = {d: n for d, n in seen.items() if n - 1 > explained[d]}
    assert not unexplained, f"sent more often than attempts ended: {sorted(unexplained.items())[:5]}"


@pytest.mark.parametrize("mode", ["fast", "immediate"])
def test_a_database_restart_mid_run_loses_nothing_and_no_worker_exits(own_pg, receiver, spawn, mode):
    db = own_pg.url
    # retries a second apart, as in the kill test: a timed-out request need not wait 5 minutes
    endpoint = add_endpoint(db, receiver.url("/restart"), max_in_flight=1000, retry_schedule={"delays": [1]})
    receiver.script("/restart", Reply(200, delay=0.05))
    ids = enqueue(db, endpoint, count=2000)
    # a lease well above any restart's length: README promises no duplicate when the database is
    # back within the lease and no worker died
    lease = {"timeout_seconds": 1, "lease_seconds": 20}
    workers = [spawn(db, name=f"w{n}", worker={"concurrency": 50}, delivery=lease) for n in range(2)]
    pids = [w.pid for w in workers]
    eventually(lambda: len(receiver.to("/restart")) >= 300, message="delivering")
    restarted = time.monotonic()
    own_pg.restart(mode)
    outage = time.monotonic() - restarted  # down no longer than pg_ctl restart took
    wait_final(db, ids, message="every row final")
    dup, seen = duplicates(receiver, "/restart")
    [(stale, expired)] = query(db, "SELECT count(*) FILTER (WHERE stale),"
                                   " count(*) FILTER (WHERE outcome = 'lease_expired')"
                                   " FROM webhooks.alert_delivery_log")
    # attempts that failed (a timeout on a loaded machine): the receiver may have had them
    failed = Counter(d for (d,) in query(
        db, "SELECT delivery_id FROM webhooks.alert_delivery_log"
            " WHERE NOT stale AND outcome NOT IN ('delivered', 'lease_expired')"))
    report(f"restart -m {mode}", deliveries=len(ids), lost=len(set(ids) - set(seen)), duplicates=dup,
           outage_seconds=round(outage, 1), stale_outcomes=stale, leases_expired=expired,
           failed_attempts=sum(failed.values()),
           seconds_to_finish_after_restart=round(time.monotonic() - restarted, 1))
    assert outage < lease["lease_seconds"]
    assert set(statuses(db, ids).values()) == {"delivered"}
    assert delivering(db) == 0
    assert [w.pid for w in workers] == pids and all(w.process.poll() is None for w in workers)
    assert any(w.logged("claim failed; retrying") or w.logged("finish failed; retrying") for w in workers)
    # back within the lease, every held outcome was written under its own lease: the restart sent
    # nothing twice. (A claim the database committed but whose answer the crash cut off waits for
    # its lease and is sent then, once: leases_expired may be above 0; such a lease end explains no
    # second request.) A request sent again after its attempt failed is the retry schedule's, not
    # the restart's.
    sent_again_by_the_restart = {d: n for d, n in seen.items() if n - 1 > failed[d]}
    assert stale == 0 and not sent_again_by_the_restart, sorted(sent_again_by_the_restart.items())[:5]


def test_a_worker_started_before_its_database_waits_and_then_delivers(unstarted_pg, receiver, spawn):
    # the worker's login role can only be created once the cluster runs
    worker = spawn(login_dsn(unstarted_pg.url, WORKER_LOGIN), as_role=False, delivery=QUICK_LEASE)
    eventually(lambda: worker.logged("database not reachable; retrying"), progress=worker.activity,
               message="a clear log line")
    # each retry line follows a wait for a connection of up to the connect timeout
    eventually(lambda: sum(1 for line in worker.log_lines()
                           if line.get("event") == "database not reachable; retrying") >= 3,
               timeout=HANG_SECONDS + 3 * CONNECT_TIMEOUT_SECONDS, progress=worker.activity,
               message="retries with backoff")
    assert worker.process.poll() is None  # no crash loop: the same process waits
    delays = [line["retry_in"] for line in worker.log_lines()
              if line.get("event") == "database not reachable; retrying"]
    assert delays[:3] == sorted(delays[:3]) and delays[1] > delays[0]

    from worker import schema

    unstarted_pg.start()
    schema.migrate(unstarted_pg.url)
    worker_dsn(unstarted_pg.url)
    endpoint = add_endpoint(unstarted_pg.url, receiver.url("/late"))
    [delivery] = enqueue(unstarted_pg.url, endpoint)
    eventually(lambda: statuses(unstarted_pg.url, [delivery])[delivery] == "delivered",
               message="delivered once the database is there")
    report("database late", retries_logged=len(delays), backoff_seconds=delays[:5])


def test_connections_cut_between_claim_and_finish_are_retried(db, receiver, spawn):
    endpoint = add_endpoint(db, receiver.url("/cut"), max_in_flight=100)
    receiver.script("/cut", Reply(hold=True))
    ids = enqueue(db, endpoint, count=50)
    worker = spawn(db, worker={"concurrency": 50})
    eventually(lambda: receiver.holding == 50, message="50 requests held")
    cut = query(db, "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                    " WHERE application_name LIKE 'webhook-worker%%'")[0][0]
    receiver.release()
    wait_final(db, ids, message="every row final")
    dup, seen = duplicates(receiver, "/cut")
    history = Counter(query(db, "SELECT outcome, stale FROM webhooks.alert_delivery_log"))
    report("connections cut", deliveries=len(ids), connections_cut=cut, lost=len(set(ids) - set(seen)),
           duplicates=dup, audit=dict(history))
    assert cut >= 2
    assert set(statuses(db, ids).values()) == {"delivered"}
    assert dup == 0 and history == {("delivered", False): 50}
    assert worker.process.poll() is None


def test_outcomes_held_while_the_database_is_down_past_the_lease(own_pg, receiver, spawn):
    db = own_pg.url
    endpoint = add_endpoint(db, receiver.url("/down"), max_in_flight=100)
    receiver.script("/down", Reply(hold=True))
    ids = enqueue(db, endpoint, count=20)
    # The answers are released only once PostgreSQL is down, so the requests must still be open
    # then: a request timeout far above how long stopping it takes (it took over 1 s under load).
    lease = {"timeout_seconds": 5, "lease_seconds": 10}
    worker = spawn(db, worker={"concurrency": 20}, delivery=lease)
    eventually(lambda: receiver.holding == 20, message="20 requests held")
    [(lease_left,)] = query(db, "SELECT extract(epoch FROM max(locked_until) - now())::float8"
                                " FROM webhooks.alert_delivery_queue")
    claimed = time.monotonic()
    # Once the database is back, the worker may not write before the expired leases are taken
    # back: which of its own two loops (finish retrying, claim reaping) went first would be a race.
    query(db, f"ALTER ROLE {WORKER_LOGIN} NOLOGIN")  # its open sessions end with the shutdown
    own_pg.halt("fast")
    receiver.script("/down", Reply(200))
    receiver.release()
    eventually(lambda: worker.logged("finish failed; retrying"), message="outcomes cannot be written")
    eventually(lambda: time.monotonic() - claimed > lease_left + 0.5, timeout=lease_left + 10, interval=0.2,
               message="the database stays down past the lease")
    own_pg.start()
    expired = query(db, "SELECT count(*) FROM webhooks.alert_delivery_queue"
                        " WHERE status = 'delivering' AND locked_until < now()")
    reaped = query(db, "SELECT webhooks.reap_expired_leases()")
    query(db, f"ALTER ROLE {WORKER_LOGIN} LOGIN")
    wait_final(db, ids, message="every row final")
    rows = query(db, "SELECT delivery_id, array_agg(outcome || CASE WHEN stale THEN '(stale)' ELSE '' END"
                     " ORDER BY log_id) FROM webhooks.alert_delivery_log GROUP BY 1")
    histories = Counter(tuple(h) for _, h in rows)
    sent = Counter(r.delivery_id for r in receiver.to("/down"))
    report("database down past the lease", deliveries=len(ids), expired=expired[0][0],
           duplicates=sum(n - 1 for n in sent.values()), histories=dict(histories))
    assert expired == [(20,)] and reaped == [(20,)]
    assert set(statuses(db, ids).values()) == {"delivered"}
    assert query(db, "SELECT DISTINCT attempts FROM webhooks.alert_delivery_queue") == [(2,)]
    # Each lease expired with its outcome held; the held outcome (the receiver's 200, or a timeout
    # if the request ran out first) is logged as stale and changes nothing; a second attempt
    # delivers. So each delivery was sent exactly twice, with the same id.
    assert sum(histories.values()) == 20
    after_expiry = (["delivered", "delivered(stale)"], ["delivered", "retry(stale)"])
    for history in histories:
        assert history[0] == "lease_expired" and sorted(history[1:]) in after_expiry, history
    assert sent == {delivery: 2 for delivery in ids}
    assert worker.process.poll() is None


def test_a_paused_worker_s_late_outcomes_are_fenced_off(db, receiver, spawn):
    endpoint = add_endpoint(db, receiver.url("/paused"), max_in_flight=100)
    receiver.script("/paused", Reply(hold=True))
    ids = enqueue(db, endpoint, count=10)
    sleeper = spawn(db, name="sleeper", worker={"concurrency": 10}, delivery=QUICK_LEASE)
    eventually(lambda: receiver.holding == 10, message="10 requests held")
    sleeper.signal(signal.SIGSTOP)
    receiver.script("/paused", Reply(200))
    receiver.release()  # the answers wait in the stopped worker's sockets
    spawn(db, name="rescuer", delivery=QUICK_LEASE)
    wait_final(db, ids, message="reclaimed and delivered after the lease")
    sleeper.signal(signal.SIGCONT)
    eventually(lambda: query(db, "SELECT count(*) FROM webhooks.alert_delivery_log WHERE stale")[0][0] == 10,
               progress=sleeper.activity, message="the sleeper's late outcomes arrive, fenced off")
    histories = Counter(tuple(h) for _, h in query(
        db, "SELECT delivery_id, array_agg(worker_id || ':' || outcome || CASE WHEN stale THEN '(stale)'"
            " ELSE '' END ORDER BY log_id) FROM webhooks.alert_delivery_log GROUP BY 1"))
    report("SIGSTOP past the lease", deliveries=len(ids), duplicates=duplicates(receiver, "/paused")[0],
           histories=dict(histories))
    # The sleeper's late outcome is a success or, if its request timers ran out while it was
    # stopped, a timeout; either way it is logged as stale and changes nothing.
    assert sum(histories.values()) == 10
    for history in histories:
        assert history[:2] == ("sleeper:lease_expired", "rescuer:delivered")
        assert history[2] in ("sleeper:delivered(stale)", "sleeper:retry(stale)")
    final = query(db, "SELECT DISTINCT status, attempts FROM webhooks.alert_delivery_queue")
    assert final == [("delivered", 2)]


@pytest.mark.parametrize(
    ("behaviour", "handler", "category"),
    [("never answers", misbehaving.never_answers, "timeout"),
     ("resets the connection", misbehaving.resets, "connect"),
     ("answers garbage", misbehaving.garbage, "protocol"),
     ("answers 200 after the timeout", misbehaving.answers_late(3.0), "timeout"),
     ("answers one byte a second", misbehaving.trickles, "timeout"),
     ("sends a 100 KB header line", misbehaving.huge_header, "protocol"),
     ("sends headers without end", misbehaving.endless_headers, "protocol")],
)
def test_misbehaving_receivers_are_classified_and_others_keep_flowing(db, receiver, spawn, behaviour,
                                                                      handler, category):
    server = TcpServer(handler).start()
    try:
        bad = add_endpoint(db, server.url(), retry_schedule=FAST_RETRY, max_attempts=2)
        good = add_endpoint(db, receiver.url("/good"))
        bad_ids = enqueue(db, bad, count=5)
        worker = spawn(db, delivery=QUICK_LEASE)
        good_ids = enqueue(db, good, count=50)
        wait_final(db, good_ids, message="the healthy endpoint keeps flowing")
        wait_final(db, bad_ids, message="the misbehaving one dead-lettered")
        categories = Counter(query(db, "SELECT failure_category FROM webhooks.alert_delivery_log"
                                       " WHERE webhook_id = %s", (bad,)))
        report(behaviour, categories=dict(categories), connections=server.connections)
        assert categories == {(category,): 10}
        assert set(statuses(db, bad_ids).values()) == {"dead_letter"}
        assert set(statuses(db, good_ids).values()) == {"delivered"}
        assert worker.process.poll() is None
    finally:
        server.stop()


def test_a_receiver_sending_5_mb_is_read_only_up_to_the_limit(db, spawn):
    server = TcpServer(misbehaving.sends_megabytes(5)).start()
    try:
        # one request at a time, so a connection would be reused if the worker had read a whole body
        endpoint = add_endpoint(db, server.url(), max_in_flight=1)
        ids = enqueue(db, endpoint, count=3)
        worker = spawn(db)
        wait_final(db, ids, message="every row final")
        excerpts = query(db, "SELECT octet_length(response_excerpt) FROM webhooks.alert_delivery_log"
                             " WHERE webhook_id = %s", (endpoint,))
        report("5 MB answers", connections=server.connections, excerpt_bytes=sorted(excerpts))
        assert set(statuses(db, ids).values()) == {"delivered"}
        assert all(size <= 1024 for (size,) in excerpts)
        # each body was cut off at the read limit and its connection closed, never drained for reuse
        assert server.connections == 3
        assert worker.process.poll() is None
    finally:
        server.stop()


def test_a_receiver_closing_keepalive_connections_at_random_still_gets_everything(db, spawn):
    receiver = misbehaving.ClosesKeepaliveAtRandom(0.3)
    server = TcpServer(receiver).start()
    try:
        endpoint = add_endpoint(db, server.url(), retry_schedule=FAST_RETRY, max_in_flight=20)
        ids = enqueue(db, endpoint, count=300)
        spawn(db)
        wait_final(db, ids, message="every row final")
        retried = query(db, "SELECT count(*) FROM webhooks.alert_delivery_queue WHERE attempts > 1")[0][0]
        report("keep-alive closed at random", deliveries=len(ids), connections=server.connections,
               reused=receiver.reused_connections, hung_up=receiver.hung_up,
               sent_again=receiver.fresh_connection_requests, retried=retried)
        assert set(statuses(db, ids).values()) == {"delivered"}
        # kept-alive connections were reused, and the receiver hung up on kept-alive connections
        assert receiver.reused_connections > 0 and receiver.hung_up > 0
        assert retried == 0  # a request that met a closed connection is sent again, not failed
    finally:
        server.stop()


def test_a_poison_row_is_dead_lettered_as_internal_and_the_worker_keeps_going(db, receiver, spawn):
    poisoned = add_endpoint(db, receiver.url("/poisoned"), retry_schedule=FAST_RETRY, max_attempts=3)
    healthy = add_endpoint(db, receiver.url("/fine"))
    # a secret that cannot be used (sealed as the product seals it) makes the worker's own signing
    # code raise for this endpoint only
    unusable = TEST_KEYRING.seal("whsec_%%", encryption.SIGNING_SECRET, poisoned)
    query(db, "UPDATE webhooks.endpoints SET signing_secrets = %s WHERE id = %s",
          (json.dumps([{"secret": unusable, "expires_at": None}]), poisoned))
    [bad] = enqueue(db, poisoned)
    worker = spawn(db)
    worker.expect_errors("delivery failed inside the worker")
    pid = worker.pid
    eventually(lambda: statuses(db, [bad])[bad] == "dead_letter", message="poison row dead-lettered")
    good = enqueue(db, healthy, count=20)
    wait_final(db, good, message="other deliveries flow")

    [(category, reason, attempts)] = query(
        db, "SELECT failure_category, dead_letter_reason, attempts FROM webhooks.alert_delivery_queue"
            " WHERE delivery_id = %s", (bad,))
    assert (category, attempts) == ("internal", 3)
    assert "attempts exhausted" in reason and "ValueError" in reason
    assert receiver.to("/poisoned") == []
    assert worker.pid == pid and worker.process.poll() is None
    assert set(statuses(db, good).values()) == {"delivered"}


def test_a_rolling_restart_loses_nothing_and_duplicates_nothing(db, receiver, spawn):
    endpoint = add_endpoint(db, receiver.url("/rollout"), max_in_flight=1000)
    receiver.script("/rollout", Reply(200, delay=0.3))
    ids = enqueue(db, endpoint, count=2000)
    old = [spawn(db, name=f"old-{n}", worker={"concurrency": 200}) for n in range(3)]
    wait_started(old)
    eventually(lambda: delivering(db) >= 400, message="hundreds in flight")
    in_flight = delivering(db)
    for worker in old:
        worker.signal(signal.SIGTERM)
    new = [spawn(db, name=f"new-{n}", worker={"concurrency": 200}) for n in range(3)]
    exits = [worker.process.wait(HANG_SECONDS) for worker in old]
    wait_final(db, ids, message="every row final")
    dup, seen = duplicates(receiver, "/rollout")
    report("rolling restart", deliveries=len(ids), in_flight_at_sigterm=in_flight,
           lost=len(set(ids) - set(seen)), duplicates=dup)
    assert exits == [0, 0, 0]
    assert set(statuses(db, ids).values()) == {"delivered"}
    assert dup == 0
    assert all(w.process.poll() is None for w in new)
    with psycopg.connect(db, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM webhooks.alert_delivery_log WHERE stale").fetchone() == (0,)
