"""Section `triggers`, what a table trigger costs the application that writes: a large INSERT … SELECT
through a table trigger against the same deliveries inserted straight into the queue, and the latency
a single-row INSERT gains, beside the same for README's hand-written row trigger
(webhooks.observer_queue_alert)."""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import psycopg

from bench.common import PAD, median_of, register_endpoints
from bench.localworker import query
from bench.section import MEDIAN_RUNS, Context, Figures, Section, Target, get, log, target, three

TABLE = "public.bench_orders"
ROW_SQL = "SELECT n, 'order ' || n, 'critical', %s FROM generate_series(%s::bigint, %s::bigint) n"
SINGLE_SQL = "INSERT INTO " + TABLE + " (id, title, severity, pad) VALUES (%s, 'one order', 'critical', %s)"
# The queue and what hangs off it, emptied between runs so each starts from the same state.
EMPTY = ("TRUNCATE webhooks.alert_delivery_queue, webhooks.messages, webhooks.alert_delivery_log, "
         + TABLE + ", public.bench_plain")


def options(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--trigger-rows", type=int, default=100_000,
                       help="rows of the one INSERT … SELECT through the table trigger (100000)")
    group.add_argument("--trigger-observer-rows", type=int, default=20_000,
                       help="rows of the one INSERT … SELECT through observer_queue_alert, a trigger per"
                            " row (20000)")
    group.add_argument("--trigger-inserts", type=int, default=2_000,
                       help="single-row INSERTs per variant and round for the added latency (2000)")
    group.add_argument("--trigger-endpoints", type=int, default=2,
                       help="endpoints subscribed to the tables' events (2)")


def timed(dsn: str, sql: str, params: Any = None) -> float:
    """Seconds one statement took, committed."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        started = time.perf_counter()
        conn.execute(sql, params)
        return time.perf_counter() - started


def deliveries(dsn: str) -> int:
    return int(query(dsn, "SELECT count(*) FROM webhooks.alert_delivery_queue")[0][0])


def bulk_runs(dsn: str, rows: int, endpoints: int) -> dict[str, Any]:
    """Alternating runs of: the INSERT … SELECT through the table trigger, then the same deliveries
    (their event ids made new, the rest as the trigger wrote them, staged beforehand) inserted straight
    into the queue. Each run on an emptied queue; µs of the statement per delivery."""
    through: list[float] = []
    straight: list[float] = []
    plain: list[float] = []
    for run in range(MEDIAN_RUNS):
        query(dsn, EMPTY)
        seconds = timed(dsn, "INSERT INTO public.bench_plain " + ROW_SQL, (PAD, 1, rows))
        plain.append(seconds * 1e6 / rows)
        seconds = timed(dsn, "INSERT INTO " + TABLE + " " + ROW_SQL, (PAD, 1, rows))
        made = deliveries(dsn)
        if made != rows * endpoints:
            raise RuntimeError(f"the table trigger queued {made} deliveries for {rows} rows and {endpoints}"
                               f" endpoints")
        through.append(seconds * 1e6 / made)
        query(dsn, "DROP TABLE IF EXISTS bench_staged")
        query(dsn, "ANALYZE webhooks.alert_delivery_queue, webhooks.messages")
        query(dsn, "CREATE UNLOGGED TABLE bench_staged AS SELECT q.delivery_id, q.webhook_id, q.event_type,"
                   " 'direct-' || q.event_id AS event_id, m.payload, m.metadata, m.source_ref, q.ordering_key"
                   " FROM webhooks.alert_delivery_queue q JOIN webhooks.messages m ON m.message_id ="
                   " q.message_id")
        query(dsn, "TRUNCATE webhooks.alert_delivery_queue, webhooks.messages")
        seconds = timed(dsn, "INSERT INTO webhooks.alert_delivery_queue (webhook_id, event_type, event_id,"
                             " payload,"
                             " metadata, source_ref, ordering_key) SELECT s.webhook_id, s.event_type,"
                             " s.event_id,"
                             " s.payload, s.metadata, s.source_ref, s.ordering_key FROM bench_staged s"
                             " ORDER BY s.delivery_id")
        straight.append(seconds * 1e6 / deliveries(dsn))
        log(f"triggers: bulk run {run + 1}: {through[-1]:.1f} µs a delivery through the trigger,"
            f" {straight[-1]:.1f} straight into the queue")
    ratios = [t / s for t, s in zip(through, straight, strict=True)]
    return {"rows": rows, "deliveries": rows * endpoints,
            "us_per_delivery_through_trigger": median_of(through),
            "us_per_delivery_straight": median_of(straight),
            "us_per_row_without_trigger": median_of(plain),
            "ratio": median_of(ratios)}


# README's hand-written trigger, declared for each row (as README shows it) or for each statement.
OBSERVER = {
    "row": "CREATE TRIGGER bench_observer AFTER INSERT ON " + TABLE + " FOR EACH ROW"
           " EXECUTE FUNCTION webhooks.observer_queue_alert('order.changed', 'id')",
    "statement": "CREATE TRIGGER bench_observer AFTER INSERT ON " + TABLE + " REFERENCING NEW TABLE AS"
                                                                            " webhooks_new"
                 " FOR EACH STATEMENT EXECUTE FUNCTION webhooks.observer_queue_alert('order.changed', 'id')",
}


def observer_run(dsn: str, rows: int, endpoints: int, level: str) -> dict[str, Any]:
    """The same INSERT … SELECT through observer_queue_alert, once (for each row, it is slow)."""
    query(dsn, EMPTY)
    query(dsn, "SELECT webhooks.table_trigger_disable('bench')")
    query(dsn, OBSERVER[level])
    seconds = timed(dsn, "INSERT INTO " + TABLE + " " + ROW_SQL, (PAD, 1, rows))
    made = deliveries(dsn)
    query(dsn, "DROP TRIGGER bench_observer ON " + TABLE)
    query(dsn, "SELECT webhooks.table_trigger_enable('bench')")
    if made != rows * endpoints:
        raise RuntimeError(f"observer_queue_alert queued {made} deliveries for {rows} rows")
    return {"rows": rows, "deliveries": made, "seconds": round(seconds, 2),
            "us_per_delivery": round(seconds * 1e6 / made, 1)}


# The floor of a single-row statement's deliveries: the row, and its deliveries (one per endpoint,
# with the payload, ordering key and metadata the table trigger gives them) inserted straight into
# the queue by the same statement, as a producer that wrote them by hand would.
STRAIGHT_SQL = (
    "WITH o AS (INSERT INTO " + TABLE + " (id, title, severity, pad) VALUES (%s, 'one order', 'critical', %s)"
    " RETURNING *) INSERT INTO webhooks.alert_delivery_queue (webhook_id, event_type, event_id, payload,"
    " metadata,"
    " source_ref, ordering_key) SELECT e.id, 'order.changed', 'evt_' || md5(random()::text),"
    " jsonb_build_object('op', 'insert', 'new', to_jsonb(o)), '{\"table_trigger\": \"bench\"}',"
    " 'public.bench_orders:' || o.id, 'public.bench_orders:' || o.id FROM o, webhooks.endpoints e ORDER BY"
    " e.id")


def single_rows(dsn: str, inserts: int) -> dict[str, Any]:
    """p50 of a single-row INSERT (autocommit) into the table with no trigger, the table trigger,
    observer_queue_alert for each row, and with its deliveries inserted straight into the queue by the
    same statement (the floor), in alternating rounds on one connection each."""
    variants = ("none", "table_trigger", "observer", "straight")
    samples: dict[str, list[float]] = {v: [] for v in variants}
    next_id = 10_000_000
    for _round in range(MEDIAN_RUNS):
        for variant in variants:
            enabled = variant == "table_trigger"
            query(dsn, "SELECT webhooks.table_trigger_set_enabled('bench', %s)", (enabled,))
            if variant == "observer":
                query(dsn, OBSERVER["row"])
            statement = STRAIGHT_SQL if variant == "straight" else SINGLE_SQL
            with psycopg.connect(dsn, autocommit=True) as conn:
                for i in range(50):  # warm up: plans and caches
                    conn.execute(statement, (next_id + i, PAD))
                next_id += 50
                for _ in range(inserts):
                    started = time.perf_counter()
                    conn.execute(statement, (next_id, PAD))
                    samples[variant].append(time.perf_counter() - started)
                    next_id += 1
            if variant == "observer":
                query(dsn, "DROP TRIGGER bench_observer ON " + TABLE)
        query(dsn, EMPTY)
    query(dsn, "SELECT webhooks.table_trigger_enable('bench')")
    p50 = {v: statistics.median(samples[v]) * 1000 for v in variants}
    return {"inserts": inserts * MEDIAN_RUNS,
            "p50_ms": {v: round(p50[v], 3) for v in variants},
            "added_p50_ms": {v: round(p50[v] - p50["none"], 3) for v in variants if v != "none"}}


def run(ctx: Context) -> dict[str, Any]:
    dsn = ctx.cluster.new_database("bench_triggers")
    urls = [ctx.sink.url(f"/ok/t{i}") for i in range(ctx.args.trigger_endpoints)]
    endpoints = register_endpoints(dsn, urls,
                                   event_types=("order.*",))
    for table in (TABLE, "public.bench_plain"):
        query(dsn, f"CREATE TABLE {table} (id bigint PRIMARY KEY, title text, severity text, pad text)")
    query(dsn, "SELECT webhooks.table_trigger_add('bench', %s, ARRAY['insert', 'update', 'delete'],"
               " 'order.changed')",
          (TABLE,))
    out: dict[str, Any] = {"endpoints": len(endpoints)}
    log(f"triggers: {ctx.args.trigger_rows} rows in one statement, through the trigger and straight")
    out["bulk"] = bulk_runs(dsn, ctx.args.trigger_rows, len(endpoints))
    log(f"triggers: {ctx.args.trigger_observer_rows} rows in one statement through observer_queue_alert,"
        f" per row")
    out["observer_bulk"] = observer_run(dsn, ctx.args.trigger_observer_rows, len(endpoints), "row")
    log(f"triggers: {ctx.args.trigger_rows} rows in one statement through observer_queue_alert, per"
        " statement")
    out["observer_statement_bulk"] = observer_run(dsn, ctx.args.trigger_rows, len(endpoints), "statement")
    log("triggers: single-row inserts")
    out["single_row"] = single_rows(dsn, ctx.args.trigger_inserts)
    ctx.cluster.drop_database("bench_triggers")
    return out


def figures(r: dict[str, Any]) -> Figures:
    bulk, single = r["bulk"], r["single_row"]
    observer, statement = r["observer_bulk"], r["observer_statement_bulk"]
    return [
        (f"triggers: {bulk['rows']:,} rows in one INSERT, through the table trigger",
         f"{three(bulk['us_per_delivery_through_trigger'], fmt='{:.1f}')} µs per delivery"),
        ("triggers: the same deliveries straight into the queue",
         f"{three(bulk['us_per_delivery_straight'], fmt='{:.1f}')} µs per delivery"),
        ("triggers: the same rows, no trigger", f"{three(bulk['us_per_row_without_trigger'], fmt='{:.1f}')}"
                                                f" µs per row"),
        (f"triggers: {observer['rows']:,} rows in one INSERT, observer_queue_alert (per row)",
         f"{observer['seconds']} s, {observer['us_per_delivery']} µs per delivery"),
        (f"triggers: {statement['rows']:,} rows in one INSERT, observer_queue_alert (per statement)",
         f"{statement['seconds']} s, {statement['us_per_delivery']} µs per delivery"),
        ("triggers: single-row INSERT p50 (none / table trigger / observer / deliveries straight)",
         " / ".join(f"{single['p50_ms'][v]:.3f}" for v in ("none", "table_trigger", "observer", "straight"))
         + " ms"),
    ]


def targets(results: dict[str, Any], _args: argparse.Namespace) -> list[Target]:
    rows: list[Target] = []
    ratio = get(results, "triggers", "bulk", "ratio")
    if ratio is not None:
        rows.append(target("table trigger: per delivery, bulk ÷ straight into the queue", three(ratio),
                           "≤ 1.5×",
                           ratio["median"] <= 1.5))
    added = get(results, "triggers", "single_row", "added_p50_ms")
    if added is not None:
        rows.append(target("table trigger: added single-row INSERT latency p50",
                           f"{added['table_trigger']:.3f} ms",
                           "≤ 0.3 ms", added["table_trigger"] <= 0.3))
        rows.append(target("observer_queue_alert: added single-row INSERT latency p50",
                           f"{added['observer']:.3f} ms",
                           "(no goal)", None))
        rows.append(target("the same deliveries straight into the queue: added single-row latency p50",
                           f"{added['straight']:.3f} ms", "(the floor)", None))
    straight = get(results, "triggers", "bulk", "us_per_delivery_straight")
    for key, name in (("observer_bulk", "for each row"), ("observer_statement_bulk", "for each statement")):
        observer = get(results, "triggers", key)
        if observer is not None and straight is not None:
            rows.append(target(f"observer_queue_alert {name}: per delivery, bulk ÷ straight into the queue",
                               f"{observer['us_per_delivery'] / straight['median']:.2f}", "(no goal)", None))
    return rows


SECTION = Section("triggers", run, options=options, figures=figures, targets=targets,
                  quick={"trigger_rows": 2000, "trigger_observer_rows": 500, "trigger_inserts": 100})
