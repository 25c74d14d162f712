"""Dead workers found by their database session, not their lease: each case for real.

Workers are `webhook-worker` processes against a real PostgreSQL and receivers on 127.0.0.1, with
the default 60 s lease unless a case says otherwise. Each test prints its figures (run with -s).
"""

import asyncio
import signal
import time
from collections import Counter
from datetime import datetime

import pytest

from tests.receiver import Reply
from tests.support import (
    HANG_SECONDS,
    TEST_KEYRING,
    add_endpoint,
    enqueue,
    eventually,
    query,
    statuses,
    wait_final,
    wait_started,
    worker_dsn,
)
from worker.store.queue import LIVENESS_SERVER_SETTINGS, Queue

DEFAULT_LEASE_SECONDS = 60
# Requests held at the receiver stay open while a case sets its scene, however long a loaded machine
# takes to (the default 10 s timeout would end them first); still inside the default lease.
HELD_TIMEOUT_MS = (DEFAULT_LEASE_SECONDS - 10) * 1000


def report(name, **figures):
    print(f"\n[{name}] " + ", ".join(f"{k}={v}" for k, v in figures.items()))


def delivering(db, worker_name):
    return query(db, "SELECT count(*) FROM webhooks.alert_delivery_queue"
                     " WHERE status = 'delivering' AND locked_by = %s", (worker_name,))[0][0]


def histories(db):
    rows = query(db, "SELECT delivery_id, array_agg(worker_id || ':' || outcome"
                     " || CASE WHEN stale THEN '(stale)' ELSE '' END ORDER BY log_id)"
                     " FROM webhooks.alert_delivery_log GROUP BY 1")
    return Counter(tuple(h) for _, h in rows)


def started(worker):
    wait_started([worker])


def test_a_killed_worker_s_rows_come_back_within_seconds_not_a_lease(db, receiver, spawn):
    # The endpoint's cap is taken by the victim's five requests: nothing else moves until they
    # come back, which is what a crash used to cost for a whole lease.
    endpoint = add_endpoint(db, receiver.url("/crash"), max_in_flight=5, timeout_ms=HELD_TIMEOUT_MS)
    receiver.script("/crash", Reply(hold=True))
    ids = enqueue(db, endpoint, count=25)
    victim = spawn(db, name="victim", worker={"concurrency": 5})
    eventually(lambda: receiver.holding == 5, message="the victim holds the endpoint's 5 slots")
    rescuer = spawn(db, name="rescuer", worker={"concurrency": 5})
    started(rescuer)
    receiver.script("/crash", Reply(200))
    victim.signal(signal.SIGKILL)
    killed, killed_at = time.monotonic(), time.time()
    victim.process.wait(10)
    receiver.release()

    def resent():
        return [r.at - killed_at for r in receiver.to("/crash")
                if r.at > killed_at and r.headers.get("webhook-attempt") == "2"]

    eventually(resent, timeout=DEFAULT_LEASE_SECONDS + 15, message="the victim's rows sent again")
    first_resent = min(resent())  # as the receiver saw it
    wait_final(db, ids, message="every row final")
    finished = time.monotonic() - killed
    report("SIGKILL, default lease", lease_seconds=DEFAULT_LEASE_SECONDS,
           seconds_to_first_resend=round(first_resent, 2), seconds_to_all_delivered=round(finished, 2),
           audit=dict(histories(db)))
    assert first_resent < DEFAULT_LEASE_SECONDS / 3
    assert set(statuses(db, ids).values()) == {"delivered"}
    reclaimed = query(db, "SELECT delivery_id, attempt, outcome, error FROM webhooks.alert_delivery_log"
                          " WHERE worker_id = 'victim'")
    assert len(reclaimed) == 5
    # the crash used an attempt, as any crash does, and says so in the audit log
    assert {(attempt, outcome) for _, attempt, outcome, _ in reclaimed} == {(1, "lease_expired")}
    assert query(db, "SELECT DISTINCT attempts FROM webhooks.alert_delivery_queue"
                     " WHERE delivery_id = ANY(%s)", ([d for d, *_ in reclaimed],)) == [(2,)]


def test_a_killed_worker_s_rows_are_resent_before_the_backlog_that_waited_behind_them(db, receiver, spawn):
    # Reclaimed rows went to the back of their endpoint's queue, so under a backlog they
    # were resent after everything that had been waiting behind them. The order of arrival says it,
    # whatever the machine's speed: the cap keeps the rescuer idle until the victim's rows are back.
    endpoint = add_endpoint(db, receiver.url("/backlog"), max_in_flight=5)
    receiver.script("/backlog", Reply(hold=True))
    ids = enqueue(db, endpoint, count=305)
    victim = spawn(db, name="victim", worker={"concurrency": 5})
    eventually(lambda: receiver.holding == 5, message="the victim holds the endpoint's 5 slots")
    lost = {r.delivery_id for r in receiver.to("/backlog")}
    assert len(lost) == 5
    rescuer = spawn(db, name="rescuer", worker={"concurrency": 5})
    started(rescuer)
    receiver.script("/backlog", Reply(200))
    victim.signal(signal.SIGKILL)
    victim.process.wait(10)
    receiver.release()
    wait_final(db, ids, message="every row final")

    after_the_kill = [r.delivery_id for r in receiver.to("/backlog")][len(lost):]
    resent_at = [n for n, delivery in enumerate(after_the_kill) if delivery in lost]
    report("SIGKILL under a backlog", backlog=len(ids) - len(lost), resent_at_request=resent_at)
    assert len(after_the_kill) == len(ids)
    # the first claim after the reclaim takes them (the cap's 5 slots); a little slack for a resend
    # that leaves the rescuer after a later row's request
    assert len(resent_at) == 5 and max(resent_at) < 15, resent_at


def test_a_second_worker_under_a_running_worker_s_id_is_refused_at_start(db, receiver, spawn):
    endpoint = add_endpoint(db, receiver.url("/twins"))
    first = spawn(db, name="twin")
    started(first)
    second = spawn(db, name="twin-2", worker={"id": "twin"})  # its own config and log files
    code = second.process.wait(HANG_SECONDS)
    said = second.log_path.read_text()
    report("duplicate worker.id", exit_code=code,
           error=[line for line in said.splitlines() if "worker.id" in line])
    assert code == 2  # a configuration error, as README says
    assert "worker.id: 'twin' is already in use by a running worker" in said
    assert not second.logged("worker started")
    # the first one is untouched
    ids = enqueue(db, endpoint, count=5)
    wait_final(db, ids, message="the first worker keeps delivering")
    assert first.process.poll() is None


def test_a_worker_whose_liveness_connection_is_cut_keeps_its_rows(db, receiver, spawn):
    endpoint = add_endpoint(db, receiver.url("/cut"), max_in_flight=5, timeout_ms=HELD_TIMEOUT_MS)
    receiver.script("/cut", Reply(hold=True))
    ids = enqueue(db, endpoint, count=5)
    holder = spawn(db, name="holder", worker={"concurrency": 5})
    eventually(lambda: receiver.holding == 5, message="5 requests held")
    reaper = spawn(db, name="reaper")
    started(reaper)
    [(cut,)] = query(db, "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                         " WHERE application_name = 'webhook-worker holder liveness'")
    cut_at, cut_at_wall = time.monotonic(), time.time()
    [again] = eventually(lambda: [line for line in holder.log_lines()
                                  if line.get("event") == "liveness registered again; claiming"],
                         message="re-registered")
    # as the worker logged it, not as this test's polling saw it
    registered_again = datetime.fromisoformat(again["timestamp"]).timestamp() - cut_at_wall
    # The reaper runs every half second and trusts a missing lock after 1 s: give it several
    # chances to take the rows (it must not).
    eventually(lambda: time.monotonic() - cut_at > 4, timeout=6, interval=0.2, message="time passes")
    receiver.script("/cut", Reply(200))
    receiver.release()
    wait_final(db, ids, message="every row final")
    audit = histories(db)
    report("liveness connection cut", connections_cut=cut,
           seconds_to_register_again=round(registered_again, 3), audit=dict(audit))
    assert cut == 1
    assert registered_again < 1.0
    assert audit == {("holder:delivered",): 5}
    assert len(receiver.to("/cut")) == 5


def test_a_paused_worker_keeps_its_lock_and_only_the_lease_reclaims_its_rows(db, receiver, spawn):
    lease = 8
    endpoint = add_endpoint(db, receiver.url("/stopped"), max_in_flight=5)
    receiver.script("/stopped", Reply(hold=True))
    ids = enqueue(db, endpoint, count=5)
    sleeper = spawn(db, name="sleeper", worker={"concurrency": 5},
                    delivery={"timeout_seconds": 3, "lease_seconds": lease})
    eventually(lambda: receiver.holding == 5, message="5 requests held")
    sleeper.signal(signal.SIGSTOP)
    try:
        rescuer = spawn(db, name="rescuer", delivery={"timeout_seconds": 3, "lease_seconds": lease})
        started(rescuer)
        receiver.script("/stopped", Reply(200))
        receiver.release()
        wait_final(db, ids, message="reclaimed after the lease")
        [(held_for,)] = query(db, "SELECT min(l.logged_at - q.created_at) FROM webhooks.alert_delivery_log l"
                                  " JOIN webhooks.alert_delivery_queue q USING (delivery_id)"
                                  " WHERE l.outcome = 'lease_expired'")
        errors = {e for (e,) in query(db, "SELECT error FROM webhooks.alert_delivery_log"
                                          " WHERE outcome = 'lease_expired'")}
    finally:
        sleeper.signal(signal.SIGCONT)
    report("SIGSTOP", lease_seconds=lease, seconds_from_enqueue_to_reclaim=round(held_for.total_seconds(), 2),
           errors=sorted(errors))
    # the lock stayed held (the process lives): its rows came back by their lease, not sooner
    assert held_for.total_seconds() >= lease
    assert errors == {"lease expired"}
    assert set(statuses(db, ids).values()) == {"delivered"}


@pytest.mark.parametrize("mode", ["fast", "immediate"])
def test_after_a_database_restart_rows_stay_with_their_living_worker(own_pg, receiver, spawn, mode):
    db = own_pg.url
    endpoint = add_endpoint(db, receiver.url("/restart"), max_in_flight=5, timeout_ms=HELD_TIMEOUT_MS)
    # the first five requests are held; any request after them (a duplicate) is answered at once
    receiver.script("/restart", *[Reply(hold=True)] * 5, Reply(200))
    ids = enqueue(db, endpoint, count=5)
    holder = spawn(db, name="holder", worker={"concurrency": 5})
    eventually(lambda: receiver.holding == 5, message="5 requests held")
    other = spawn(db, name="other")
    started(other)
    # The holder cannot reconnect while stopped: the other worker is back first, finds the
    # holder's lock gone, and must still leave its rows alone.
    holder.signal(signal.SIGSTOP)
    try:
        own_pg.restart(mode)
        eventually(lambda: other.logged("liveness registered again; claiming"),
                   message="the other worker registered again")
        back_at = time.monotonic()
        eventually(lambda: time.monotonic() - back_at > 4, timeout=6, interval=0.2, message="time passes")
        taken = delivering(db, "holder")
    finally:
        holder.signal(signal.SIGCONT)
    receiver.release()
    wait_final(db, ids, message="every row final")
    audit = histories(db)
    report(f"restart -m {mode} with the holder stopped", rows_still_with_holder=taken,
           requests=len(receiver.to("/restart")), audit=dict(audit))
    assert taken == 5
    assert audit == {("holder:delivered",): 5}
    assert len(receiver.to("/restart")) == 5
    assert holder.process.poll() is None and other.process.poll() is None


def test_the_liveness_session_would_see_a_vanished_host_within_seconds(db):
    # A node failure sends no FIN: PostgreSQL ends the session (and drops the lock) only when its
    # TCP keepalive or user timeout gives up, which the liveness session sets to about 11 s.
    async def session_settings():
        queue = Queue.create(worker_dsn(db), 1, 1, 5.0, "probe", TEST_KEYRING)
        async with await queue.liveness_connection() as conn:
            cur = await conn.execute("SELECT name, setting FROM pg_settings WHERE name = ANY(%s)",
                                     (list(LIVENESS_SERVER_SETTINGS),))
            return dict(await cur.fetchall())

    found = asyncio.run(session_settings())
    report("liveness session", **found)
    assert found == {"tcp_keepalives_idle": "5", "tcp_keepalives_interval": "2", "tcp_keepalives_count": "3",
                     "tcp_user_timeout": "11000"}


@pytest.mark.usefixtures("template_db")  # the group roles, which belong to the cluster
def test_a_worker_started_before_the_schema_is_migrated_waits_for_it(fresh_db, receiver, spawn):
    from worker import schema
    from worker.daemon.worker import SCHEMA_TOO_OLD

    db = fresh_db(False)
    worker = spawn(db, name="early")
    eventually(lambda: worker.logged(SCHEMA_TOO_OLD), progress=worker.activity, message="a clear log line")
    schema.migrate(db)
    endpoint = add_endpoint(db, receiver.url("/later"))
    ids = enqueue(db, endpoint, count=3)
    wait_final(db, ids, message="delivered once migrated")
    report("schema not migrated", waited_for_migration=True, delivered=len(ids))
    assert worker.process.poll() is None


def test_a_restarted_process_under_the_same_id_takes_back_what_its_predecessor_left(db, receiver, spawn):
    # A container restarted in its pod keeps its hostname, so the same worker.id: the new process
    # holds the id's lock at once, and must not mistake the dead process's rows for its own.
    endpoint = add_endpoint(db, receiver.url("/again"), max_in_flight=5)
    receiver.script("/again", Reply(hold=True))
    ids = enqueue(db, endpoint, count=5)
    before = spawn(db, name="pod-a", worker={"concurrency": 5})
    eventually(lambda: receiver.holding == 5, message="5 requests held")
    receiver.script("/again", Reply(200))
    before.signal(signal.SIGKILL)
    killed_at = time.time()
    before.process.wait(10)
    receiver.release()
    after = spawn(db, name="pod-a-restarted", worker={"id": "pod-a"})
    wait_final(db, ids, message="every row final")
    resent = min(r.at - killed_at for r in receiver.to("/again") if r.headers["webhook-attempt"] == "2")
    report("restart under the same id", seconds_to_resend=round(resent, 2), audit=dict(histories(db)))
    assert after.logged("reclaimed the rows an earlier process under this worker id left in flight")
    assert resent < DEFAULT_LEASE_SECONDS / 3
    assert histories(db) == {("pod-a:lease_expired", "pod-a:delivered"): 5}
