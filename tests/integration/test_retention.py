"""Retention: rounds of short purge batches that keep pace with deliveries, several
workers purging at once, and audit-log partitions dropped on the right day."""

from __future__ import annotations

import asyncio
import itertools

import psycopg
import pytest
from psycopg import sql

from tests.support import TEST_KEYRING, add_endpoint, enqueue, eventually, query, worker_dsn
from worker.config import Config
from worker.daemon.maintenance import Maintenance, PurgeRound
from worker.observability import Metrics, get_logger
from worker.store.queue import Queue


def deliver(db: str, ids: list[int], age: str) -> None:
    query(db, "UPDATE webhooks.alert_delivery_queue SET status = 'delivered',"
              " delivered_at = now() - %s::interval WHERE delivery_id = ANY(%s)", (age, ids))


def delivered_long_ago(db: str, endpoint: int, count: int) -> None:
    """`count` rows delivered 8 days ago (delivered_retention is 7), inserted in one statement."""
    query(db, "INSERT INTO webhooks.alert_delivery_queue"
              " (webhook_id, event_type, payload, status, delivered_at)"
              " SELECT %s, 'alert.created', jsonb_build_object('n', n), 'delivered',"
              " now() - interval '8 days' - n * interval '1 millisecond'"
              " FROM generate_series(1, %s) n", (endpoint, count))


def counted(db: str) -> int:
    return int(query(db, "SELECT count(*) FROM webhooks.alert_delivery_queue")[0][0])


def purge_rounds(db: str, rounds: int, clock=None, **housekeeping) -> tuple[list[PurgeRound], Metrics]:
    """`rounds` calls of the worker's retention round, as webhooks_worker, with these settings."""
    config = Config.model_validate({"database": {"url": worker_dsn(db)}, "housekeeping": housekeeping})
    metrics = Metrics()

    async def run() -> list[PurgeRound]:
        queue = Queue.create(worker_dsn(db), 1, 1, 5.0, "purger", TEST_KEYRING)
        await queue.open()
        try:
            maintenance = Maintenance(config, queue, metrics, get_logger(), lambda: None)
            return [await (maintenance.purge() if clock is None else maintenance.purge(clock))
                    for _ in range(rounds)]
        finally:
            await queue.close()

    return asyncio.run(run()), metrics


def test_one_round_purges_every_eligible_row_in_as_many_batches_as_it_takes(db):
    endpoint = add_endpoint(db, "http://127.0.0.1:9/x")
    delivered_long_ago(db, endpoint, 20_000)
    recent, waiting = enqueue(db, endpoint, count=3), enqueue(db, endpoint, count=2)
    deliver(db, recent, "6 days")

    [round_], metrics = purge_rounds(db, 1, purge_batch_size=1000, purge_budget_seconds=3600,
                                     interval_seconds=3600)

    # twenty full batches, then one that finds nothing more: each batch its own transaction
    assert round_ == PurgeRound(batches=21, delivered_rows=20_000, log_partitions=0, log_rows=0,
                                finished=True)
    assert {r[0] for r in query(db, "SELECT delivery_id FROM webhooks.alert_delivery_queue")} == set(
        recent + waiting)
    assert metrics.purged_rows.labels("delivered")._value.get() == 20_000
    assert metrics.purge_batches._value.get() == 21
    assert metrics.purge_behind._value.get() == 0


def test_a_round_out_of_budget_stops_and_leaves_the_rest_to_the_next(db):
    endpoint = add_endpoint(db, "http://127.0.0.1:9/x")
    delivered_long_ago(db, endpoint, 5_000)
    # A clock that moves one second per reading: a round reads it once to set its deadline and once
    # after each batch, so a budget of 2.5 s lets it run three batches, however fast they are.
    ticks = itertools.count()

    def clock() -> float:
        return float(next(ticks))

    settings = {"purge_batch_size": 1000, "purge_budget_seconds": 2.5}
    [first], metrics = purge_rounds(db, 1, clock=clock, **settings)
    assert first == PurgeRound(batches=3, delivered_rows=3000, log_partitions=0, log_rows=0, finished=False)
    assert counted(db) == 2000
    assert metrics.purge_behind._value.get() == 1

    [second], metrics = purge_rounds(db, 1, clock=clock, **settings)
    assert second == PurgeRound(batches=3, delivered_rows=2000, log_partitions=0, log_rows=0, finished=True)
    assert counted(db) == 0
    assert metrics.purge_behind._value.get() == 0


def test_workers_purge_delivered_rows_at_once_without_waiting_on_each_other(db):
    endpoint = add_endpoint(db, "http://127.0.0.1:9/x")
    delivered_long_ago(db, endpoint, 300)
    with psycopg.connect(worker_dsn(db)) as first, psycopg.connect(worker_dsn(db)) as second:
        # the first worker's batch is still open (its rows locked) when the second one purges
        assert first.execute("SELECT delivered_rows FROM webhooks.purge(100)").fetchone() == (100,)
        second.execute("SET lock_timeout = '5s'")  # waiting would fail this test, not hang it
        assert second.execute("SELECT delivered_rows FROM webhooks.purge(100)").fetchone() == (100,)
        second.commit()
        first.commit()
    assert counted(db) == 100


@pytest.mark.parametrize("size", [0, None, 100_001])
def test_a_purge_batch_is_bounded(db, size):
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="batch_size must be between 1 and 100000"):
        query(db, "SELECT * FROM webhooks.purge(%s)", (size,))


def test_the_audit_log_partition_of_the_day_retention_ends_in_is_kept_and_the_day_before_dropped(db):
    # Database time decides: the day that holds now() - log_retention still has rows inside
    # retention (those after that instant); the day before it ends at or before that instant.
    [(cut_day, day_before)] = query(
        db, "SELECT (now() - log_retention)::date, (now() - log_retention)::date - 1"
            " FROM webhooks.delivery_config")
    for day in (cut_day, day_before):
        with psycopg.connect(db, autocommit=True) as conn:
            conn.execute(sql.SQL(  # as ensure_log_partitions() makes them: the day's midnights
                "CREATE TABLE webhooks.{} PARTITION OF webhooks.alert_delivery_log"
                " FOR VALUES FROM ({}::date::timestamptz) TO (({}::date + 1)::timestamptz)").format(
                    sql.Identifier(f"alert_delivery_log_{day:%Y%m%d}"), sql.Literal(day), sql.Literal(day)))

    [(_, partitions, _)] = query(db, "SELECT * FROM webhooks.purge(10)")

    assert partitions == 1
    assert query(db, f"SELECT to_regclass('webhooks.alert_delivery_log_{cut_day:%Y%m%d}') IS NOT NULL"
                     f", to_regclass('webhooks.alert_delivery_log_{day_before:%Y%m%d}') IS NULL") == [
        (True, True)]


def test_a_worker_left_behind_by_its_budget_comes_back_before_the_interval(db, spawn):
    endpoint = add_endpoint(db, "http://127.0.0.1:9/x")
    delivered_long_ago(db, endpoint, 20)
    # Twenty round trips take longer than a millisecond: the first round runs out of its budget.
    worker = spawn(db, housekeeping={"interval_seconds": 3600, "purge_batch_size": 1,
                                     "purge_budget_seconds": 0.001})
    eventually(lambda: counted(db) == 0, message="every row purged, within the first hour")
    rounds = [line for line in worker.log_lines() if line.get("event") == "housekeeping"]
    assert rounds[0]["purge_finished"] is False
    assert sum(r["purged_delivered"] for r in rounds) == 20


def test_a_purge_batch_reads_the_delivered_rows_through_their_index(db):
    # Without it each batch scanned the table from its start: with a week of delivered rows kept,
    # most of the table, for every batch (migration 009).
    endpoint = add_endpoint(db, "http://127.0.0.1:9/x")
    delivered_long_ago(db, endpoint, 2000)
    query(db, "INSERT INTO webhooks.alert_delivery_queue"
              " (webhook_id, event_type, payload, status, delivered_at)"
              " SELECT %s, 'alert.created', '{}', 'delivered', now() - interval '1 day'"
              " FROM generate_series(1, 20000)", (endpoint,))
    query(db, "ANALYZE webhooks.alert_delivery_queue")
    index = "alert_delivery_queue_delivered"

    def scans() -> int:
        with psycopg.connect(db, autocommit=True) as conn:
            found = conn.execute("SELECT idx_scan FROM pg_stat_user_indexes WHERE schemaname = 'webhooks'"
                                 " AND indexrelname = %s", (index,)).fetchall()
        assert found, f"no index {index}"
        return int(found[0][0])

    before = scans()
    # a session of its own: its statistics are counted at the latest when it ends
    assert query(worker_dsn(db), "SELECT delivered_rows FROM webhooks.purge(1000)") == [(1000,)]
    eventually(lambda: scans() > before, message="the purge's index scan counted")
