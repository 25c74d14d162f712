"""Section `storm` (not in the default run): an alert storm to a rate-limited Slack-format endpoint, with
and without coalescing, then lone alerts on the idle endpoint."""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import psycopg

from bench.common import payload_json, register_endpoints, spawn_worker
from bench.localworker import query, wait_started
from bench.section import Context, Figures, Section


def options(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--storm-alerts", type=int, default=1000, help="storm section: alerts (1,000)")
    group.add_argument("--storm-seconds", type=float, default=10.0,
                       help="storm section: over this long (10 s)")
    group.add_argument("--storm-rate", type=float, default=1.0,
                       help="storm section: endpoint's requests/s (1)")
    group.add_argument("--storm-coalesce", type=int, default=50, help="storm section: --coalesce-max (50)")
    group.add_argument("--storm-lone-alerts", type=int, default=5,
                       help="storm section: lone alerts timed on the idle endpoint after each storm (5)")


def run(ctx: Context) -> dict[str, Any]:
    """--storm-alerts alerts in --storm-seconds to a Slack-format endpoint limited to --storm-rate
    requests/s (burst 1), once without coalescing and once with --coalesce-max --storm-coalesce;
    then one alert on the idle endpoint, with the same policy, to time a lone alert."""
    a = ctx.args
    out: dict[str, Any] = {"alerts": a.storm_alerts, "seconds": a.storm_seconds,
                           "rate_per_second": a.storm_rate, "coalesce_max": a.storm_coalesce}
    for label, coalesce_max in (("off", None), ("on", a.storm_coalesce)):
        out[label] = _storm_run(ctx, label, coalesce_max)
    return out


def _storm_run(ctx: Context, label: str, coalesce_max: int | None) -> dict[str, Any]:
    a = ctx.args
    name = f"bench_storm_{label}"
    dsn = ctx.cluster.new_database(name)
    [endpoint] = register_endpoints(dsn, [ctx.sink.url(f"/ok/storm-{label}")], prefix=f"storm-{label}",
                                    body_format="slack", rate_limit_per_second=a.storm_rate,
                                    rate_limit_burst=1, max_in_flight=10)
    if coalesce_max:
        query(dsn, "SELECT webhooks.update_endpoint(%s, %s)",
                (endpoint, json.dumps({"coalesce_max": coalesce_max})))
    ctx.sink.reset()
    [proc] = [spawn_worker(dsn, ctx.workdir, f"storm-{label}", ctx.settings)]
    insert = ("INSERT INTO webhooks.alert_delivery_queue (webhook_id, event_type, payload)"
              " SELECT %s, 'alert.created', %s::jsonb FROM generate_series(1, %s)")
    ticks = max(1, int(a.storm_seconds * 10))  # ten inserts a second, the storm spread evenly
    try:
        wait_started([proc])
        time.sleep(1.0)
        with psycopg.connect(dsn, autocommit=True) as conn:
            storm_start = time.time()
            for tick in range(ticks):
                due = storm_start + tick * a.storm_seconds / ticks
                time.sleep(max(0.0, due - time.time()))
                count = a.storm_alerts * (tick + 1) // ticks - a.storm_alerts * tick // ticks
                conn.execute(insert, (endpoint, payload_json(tick), count))
        deadline = time.monotonic() + a.drain_timeout
        delivered = 0
        while time.monotonic() < deadline:
            [(delivered,)] = query(dsn, "SELECT count(*) FROM webhooks.alert_delivery_queue"
                                          " WHERE status = 'delivered'")
            if delivered >= a.storm_alerts:
                break
            time.sleep(0.25)
        storm = ctx.sink.stats()
        sizes = [n for (n,) in query(
            dsn, "SELECT count(*) FROM webhooks.alert_delivery_log WHERE outcome = 'delivered'"
                 " GROUP BY coalesce('d' || digest_id, 'r' || delivery_id)")]
        # lone alerts, one at a time: the endpoint idle, its token back
        lone_ms = []
        for n in range(a.storm_lone_alerts):
            time.sleep(2.0 / a.storm_rate + 0.5)
            ctx.sink.reset()
            sent_at = time.time()
            query(dsn, insert, (endpoint, payload_json(n), 1))
            lone_deadline = time.monotonic() + 30
            while ctx.sink.stats()["count"] < 1 and time.monotonic() < lone_deadline:
                time.sleep(0.002)
            first = ctx.sink.stats()["first"]
            if first:
                lone_ms.append(round((first - sent_at) * 1000, 1))
    finally:
        proc.stop()
    ctx.cluster.drop_database(name)
    return {
        "complete": delivered >= a.storm_alerts,
        "messages": storm["count"],
        "last_alert_received_s": round(storm["last"] - storm_start, 1) if storm["last"] else None,
        "rows_per_message_mean": round(statistics.fmean(sizes), 1) if sizes else None,
        "rows_per_message_max": max(sizes) if sizes else None,
        "lone_alert_ms": lone_ms,
        "lone_alert_ms_median": round(statistics.median(lone_ms), 1) if lone_ms else None,
    }


def figures(st: dict[str, Any]) -> Figures:
    lines: Figures = []
    for label in ("off", "on"):
        r = st[label]
        policy = f"--coalesce-max {st['coalesce_max']}" if label == "on" else "no coalescing"
        lines.append(
            (
                f"9. storm: {st['alerts']:,} alerts in {st['seconds']:g} s, "
                f"{st['rate_per_second']:g} req/s, {policy}",
                f"{r['messages']:,} messages, last alert received after {r['last_alert_received_s']} s, "
                f"{r['rows_per_message_mean']} rows/message (max {r['rows_per_message_max']}); "
                f"a lone alert on the idle endpoint: median {r['lone_alert_ms_median']} ms of "
                f"{r['lone_alert_ms']}",
            )
        )
    return lines


SECTION = Section("storm", run, options=options, figures=figures, default=False)
