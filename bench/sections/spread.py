"""Section `spread`, the cost of a delivery as the rows spread over more endpoints: PostgreSQL CPU and
WAL per delivery over 1, 100, 1,000 and 10,000 endpoints, and the payload bytes one event fanned
out to five endpoints stores."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from typing import Any

from bench.common import median_of, payload_sql, register_endpoints
from bench.drain import drain
from bench.localworker import query
from bench.section import Context, Figures, Section, Target, get, log, target, three

FANOUT = 5


def options(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--spread-endpoints", default="1,100,1000,10000",
                       help="endpoint counts the spread section drains over (1,100,1000,10000)")
    group.add_argument("--spread-rows", type=int, default=20_000,
                       help="rows of each spread drain, spread evenly over the endpoints (20,000)")
    group.add_argument("--spread-runs", type=int, default=3,
                       help="drains per endpoint count, taken in turn; the figure is their median (3)")


def fanout_storage(ctx: Context) -> dict[str, Any]:
    """One ~1 KB event published to FANOUT endpoints: the payload bytes it stores, queue and messages."""
    dsn = ctx.cluster.new_database("bench_fanout")
    register_endpoints(dsn, [ctx.sink.url(f"/ok/fanout-{i}") for i in range(FANOUT)])
    [(queued,)] = query(dsn, f"SELECT webhooks.publish('alert.created', {payload_sql('1')})")
    [(in_rows,)] = query(dsn, "SELECT coalesce(sum(pg_column_size(payload)), 0)"
                              " FROM webhooks.alert_delivery_queue")
    [(in_messages,)] = query(dsn, "SELECT coalesce(sum(pg_column_size(payload)), 0) FROM webhooks.messages")
    [(one,)] = query(dsn, f"SELECT pg_column_size({payload_sql('1')})")
    ctx.cluster.drop_database("bench_fanout")
    return {"endpoints": FANOUT, "deliveries": queued, "payload_bytes": one,
            "stored_bytes": in_rows + in_messages, "times_payload": round((in_rows + in_messages) / one, 2)}


def run(ctx: Context) -> dict[str, Any]:
    """A worker drains --spread-rows rows spread evenly over each endpoint count (production limits
    but for one endpoint, which gets the e2e section's generous ones), the counts taken in turn
    --spread-runs times."""
    counts = [int(n) for n in ctx.args.spread_endpoints.split(",")]
    rows = ctx.args.spread_rows
    out: dict[str, Any] = {"rows": rows, "fanout": fanout_storage(ctx)}
    runs: dict[int, list[dict[str, Any]]] = {n: [] for n in counts}
    for i in range(ctx.args.spread_runs):
        for n in counts:
            log(f"spread: round {i + 1} of {ctx.args.spread_runs}, {n:,} endpoints")
            r = drain(ctx, "bench_spread", 1, rows, ctx.settings, endpoints=n,
                      limits=None if n == 1 else {})
            runs[n].append({"per_second": r["per_second"], "complete": r["complete"],
                            "wal_bytes_per_delivery": r["wal_bytes_per_delivery"],
                            "pg_cpu_ms_per_delivery": r["cpu_ms_per_delivery"]["postgres"],
                            "worker_cpu_ms_per_delivery": r["cpu_ms_per_delivery"]["workers"]})
    for n, done in runs.items():
        out[f"endpoints_{n}"] = {
            "runs": done,
            "complete": all(r["complete"] for r in done),
            "pg_cpu_ms_per_delivery": median_of([r["pg_cpu_ms_per_delivery"] for r in done]),
            "wal_bytes_per_delivery": median_of([r["wal_bytes_per_delivery"] for r in done]),
            "per_second": median_of([r["per_second"] or 0 for r in done]),
        }
    return out


def figures(s: dict[str, Any]) -> Figures:
    lines = [(f"spread: one event to {s['fanout']['endpoints']} endpoints stores",
              f"{s['fanout']['stored_bytes']:,} payload bytes ({s['fanout']['times_payload']}× its payload)")]
    for key, m in s.items():
        if key.startswith("endpoints_"):
            n = int(key.split("_")[1])
            lines.append((f"spread: {n:,} endpoint{'' if n == 1 else 's'}, per delivery",
                          f"PostgreSQL CPU {three(m['pg_cpu_ms_per_delivery'], fmt='{:.3f}')} ms; WAL "
                          f"{three(m['wal_bytes_per_delivery'], fmt='{:,.0f}')} bytes"))
    return lines


def targets(results: dict[str, Any], _args: argparse.Namespace) -> Iterator[Target]:
    fanout = get(results, "spread", "fanout")
    if fanout is not None:
        yield target(f"payload bytes stored for one event to {fanout['endpoints']} endpoints",
                     f"{fanout['times_payload']}× payload", "1× payload", fanout["times_payload"] <= 1.0)
    wal = get(results, "spread", "endpoints_1", "wal_bytes_per_delivery")
    if wal is not None:
        yield target("WAL bytes per delivery, 1 KB payload, 1 endpoint", three(wal, fmt="{:,.0f}"), "≤ 900",
                     wal["median"] <= 900)
    one = get(results, "spread", "endpoints_1", "pg_cpu_ms_per_delivery")
    wide = get(results, "spread", "endpoints_10000", "pg_cpu_ms_per_delivery")
    if one is not None and wide is not None:
        ratio = wide["median"] / max(1e-9, one["median"])
        yield target("PostgreSQL CPU per delivery, 10,000 endpoints ÷ 1 endpoint", f"{ratio:.2f}×", "≤ 1.5×",
                     ratio <= 1.5)


SECTION = Section("spread", run, options=options, figures=figures, targets=targets,
                  quick={"spread_endpoints": "1,10", "spread_rows": 300, "spread_runs": 1}, default=False)
