"""Section `db`, the database ceiling: acquire() + finish() in a loop on one connection, no HTTP (the
SQL cost of a delivery), against a features-free claim and finish on the same table shape."""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Iterator
from typing import Any

import psycopg

from bench.common import median_of, reset_statements, statement_counts
from bench.localworker import query
from bench.section import MEDIAN_RUNS, Context, Figures, Section, Target, get, target, three
from bench.sections.features import (
    BARE_CLAIM,
    BARE_FINISH,
    acquire_finish_drain,
    end_state,
    one_endpoint_backlog,
)


def options(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--db-rows", type=int, default=20_000,
                       help="rows for each database-ceiling run (20,000)")


def _db_full(ctx: Context, rows: int) -> dict[str, Any]:
    """acquire() + finish() over `rows` rows on one connection, no HTTP; PostgreSQL CPU per row."""
    dsn, preload_s = one_endpoint_backlog(ctx, "bench_db", rows)
    batch = ctx.settings.claim_batch_size or 100
    reset_statements(dsn)
    pg0 = ctx.cluster.cpu()
    out = asyncio.run(acquire_finish_drain(dsn, rows, batch))
    pg_cpu = ctx.cluster.cpu() - pg0
    statements = [s for s in statement_counts(dsn) if "pg_stat_statements" not in s["query"]]
    nested = statement_counts(dsn, nested=True)[:12] if ctx.args.track_nested else None
    calls = sum(s["calls"] for s in statements)
    state = end_state(dsn)
    ctx.cluster.drop_database("bench_db")
    out.update(
        {
            "batch_size": batch,
            "preload_seconds": round(preload_s, 1),
            "loop": "asyncio (default)",
            "pg_cpu_seconds": round(pg_cpu, 2),
            "pg_cpu_ms_per_row": round(pg_cpu * 1000 / max(1, out["rows"]), 4),
            "round_trips": calls,
            "round_trips_per_row": round(calls / max(1, out["rows"]), 4),
            "statements": statements[:6],
            "nested_statements": nested,
            **state,
        }
    )
    return out


def _db_bare(ctx: Context, rows: int) -> dict[str, Any]:
    dsn, _ = one_endpoint_backlog(ctx, "bench_db_bare", rows)
    batch = ctx.settings.claim_batch_size or 100
    done = 0
    with psycopg.connect(dsn, autocommit=True) as conn:
        pg0, started = ctx.cluster.cpu(), time.monotonic()
        while done < rows:
            claimed = conn.execute(BARE_CLAIM, (batch,)).fetchall()
            if not claimed:
                break
            conn.execute(BARE_FINISH, ([r[0] for r in claimed],))
            done += len(claimed)
        elapsed, pg_cpu = time.monotonic() - started, ctx.cluster.cpu() - pg0
    logged = query(dsn, "SELECT count(*) FROM webhooks.alert_delivery_log")[0][0]
    ctx.cluster.drop_database("bench_db_bare")
    return {"rows": done, "per_second": round(done / elapsed, 1), "audit_rows": logged,
            "pg_cpu_ms_per_row": round(pg_cpu * 1000 / max(1, done), 4)}


def run(ctx: Context) -> dict[str, Any]:
    """The SQL cost of a delivery, and the cost of the features: acquire() + finish() against a
    features-free claim and finish on the same table shape, alternating, median of three."""
    rows = min(ctx.args.rows, ctx.args.db_rows)
    full_runs, bare_runs = [], []
    for _ in range(MEDIAN_RUNS):
        full_runs.append(_db_full(ctx, rows))
        bare_runs.append(_db_bare(ctx, rows))
    out = dict(sorted(full_runs, key=lambda r: r["pg_cpu_ms_per_row"])[len(full_runs) // 2])
    out["full_pg_cpu_ms_per_row"] = median_of([r["pg_cpu_ms_per_row"] for r in full_runs])
    out["features_free"] = {"runs": bare_runs,
                            "pg_cpu_ms_per_row": median_of([r["pg_cpu_ms_per_row"] for r in bare_runs])}
    out["features_cost_ratio"] = median_of(
        [f["pg_cpu_ms_per_row"] / max(1e-9, b["pg_cpu_ms_per_row"]) for f, b in zip(full_runs, bare_runs,
                                                                                     strict=True)])
    return out


def figures(d: dict[str, Any]) -> Figures:
    return [
        (
            "2. database ceiling, acquire+finish, no HTTP",
            f"{d['per_second']:,.0f} rows/s (batch {d['batch_size']}, {d['pg_cpu_ms_per_row']} ms PG "
            f"CPU/row, {d['round_trips_per_row']} round trips/row)",
        )
    ]


def targets(results: dict[str, Any], _args: argparse.Namespace) -> Iterator[Target]:
    features = get(results, "db", "features_cost_ratio")
    if features is not None:
        db = results["db"]
        yield target("PostgreSQL CPU: acquire+finish vs features-free claim/finish (alternating)",
                     three(features, 1, "{:.2f}x") + f" ({db['full_pg_cpu_ms_per_row']['median']} vs "
                     f"{db['features_free']['pg_cpu_ms_per_row']['median']} ms/row)",
                     "<= 1.5x", features["median"] <= 1.5)


SECTION = Section("db", run, options=options, figures=figures, targets=targets)
