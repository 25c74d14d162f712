"""Section `producer`, the producer's cost: one row per transaction on one connection, into the queue
with NOTIFY on and off, into an application table without a trigger and with the fan-out trigger."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import psycopg

from bench.common import payload_json, register_endpoints
from bench.localworker import query
from bench.section import Context, Figures, Section, log


def options(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--producer-inserts", type=int, default=5000,
                       help="inserts per producer variant (5000)")
    group.add_argument(
        "--producer-seconds", type=float, default=10.0, help="time cap per producer variant (10 s)"
    )
    group.add_argument("--fanout", type=int, default=3,
                       help="endpoints subscribed for the fan-out trigger (3)")


def insert_rate(
    dsn: str, sql: str, params: Callable[[int], tuple[Any, ...]], count: int, seconds: float
) -> dict[str, Any]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for i in range(50):  # warm up
            conn.execute(sql, params(-i))
        done = 0
        started = time.monotonic()
        deadline = started + seconds
        while done < count and time.monotonic() < deadline:
            conn.execute(sql, params(done))
            done += 1
        elapsed = time.monotonic() - started
    return {
        "inserts": done,
        "per_second": round(done / elapsed, 1),
        "us_per_insert": round(elapsed * 1e6 / done, 1),
    }


def run(ctx: Context) -> dict[str, Any]:
    dsn = ctx.cluster.new_database("bench_producer")
    ids = register_endpoints(dsn, [ctx.sink.url(f"/ok/{i}") for i in range(ctx.args.fanout)])
    query(
        dsn,
        "CREATE TABLE public.bench_alerts (id bigserial PRIMARY KEY, title text, severity text, pad text)",
    )
    n, secs = ctx.args.producer_inserts, ctx.args.producer_seconds
    queue_insert = (
        "INSERT INTO webhooks.alert_delivery_queue (webhook_id, event_type, payload)"
        " VALUES (%s, 'alert.created', %s::jsonb)"
    )
    app_insert = "INSERT INTO public.bench_alerts (title, severity, pad) VALUES (%s, 'critical', %s)"
    pad = "x" * 900
    out: dict[str, Any] = {"one_insert_per_transaction": True, "fanout_endpoints": len(ids)}
    log("producer: queue insert, NOTIFY on")
    out["queue_notify_on"] = insert_rate(dsn, queue_insert, lambda i: (ids[0], payload_json(i)), n, secs)
    query(dsn, "UPDATE webhooks.delivery_config SET notify_enabled = false")
    log("producer: queue insert, NOTIFY off")
    out["queue_notify_off"] = insert_rate(dsn, queue_insert, lambda i: (ids[0], payload_json(i)), n, secs)
    query(dsn, "UPDATE webhooks.delivery_config SET notify_enabled = true")
    log("producer: application table, no trigger")
    out["app_table_no_trigger"] = insert_rate(dsn, app_insert, lambda i: (f"alert {i}", pad), n, secs)
    query(
        dsn,
        "CREATE TRIGGER bench_alerts_webhooks AFTER INSERT ON public.bench_alerts FOR EACH ROW"
        " EXECUTE FUNCTION webhooks.observer_queue_alert('alert.created', 'id')",
    )
    log("producer: application table with the fan-out trigger")
    out["app_table_fanout_trigger"] = insert_rate(dsn, app_insert, lambda i: (f"alert {i}", pad), n, secs)
    out["app_table_fanout_trigger"]["queue_rows_per_insert"] = len(ids)
    ctx.cluster.drop_database("bench_producer")
    return out


def figures(pr: dict[str, Any]) -> Figures:
    lines: Figures = []
    for k in ("queue_notify_on", "queue_notify_off", "app_table_no_trigger", "app_table_fanout_trigger"):
        r = pr[k]
        lines.append(
            (
                f"6. producer: {k.replace('_', ' ')}",
                f"{r['per_second']:,.0f} inserts/s ({r['us_per_insert']} µs each)",
            )
        )
    return lines


SECTION = Section("producer", run, options=options, figures=figures,
                  quick={"producer_inserts": 300, "producer_seconds": 2.0})
