"""Section `naive`, the naive baseline: the seed design (bench/naive.py) on its own table, with its own
claim query and an index that serves it, draining the same backlog."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from typing import Any

import psycopg

from bench import naive
from bench.common import payload_sql
from bench.localworker import ROOT, query
from bench.section import Context, Figures, Section


def options(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--naive-max-seconds", type=float, default=120.0, help="time cap for the naive drain")


def run(ctx: Context) -> dict[str, Any]:
    """The seed design on its own table, with its own query and an index that serves it."""
    return run_naive(ctx, "bench_naive", ctx.args.rows, ctx.sink.url())


def run_naive(ctx: Context, dbname: str, rows: int, url: str) -> dict[str, Any]:
    dsn = ctx.cluster.new_database(dbname)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(naive.SCHEMA)
        conn.execute(naive.preload_sql(payload_sql("g")), (url, rows))
        conn.execute("ANALYZE naive.webhook_deliveries")
        plan = "\n".join(r[0] for r in conn.execute("EXPLAIN " + naive.CLAIM).fetchall())
    ctx.sink.reset()
    pg0, sink0 = ctx.cluster.cpu(), ctx.sink.cpu()
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.naive",
            "--dsn",
            dsn,
            "--expect",
            str(rows),
            "--max-seconds",
            str(ctx.args.naive_max_seconds),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=ctx.args.naive_max_seconds + 60,
        check=False,
    )
    pg_cpu, sink_cpu = ctx.cluster.cpu() - pg0, ctx.sink.cpu() - sink0
    if result.returncode != 0:
        raise RuntimeError(f"naive baseline failed: {result.stderr[-2000:]}")
    out = json.loads(result.stdout.strip().splitlines()[-1])
    stats = ctx.sink.stats()
    span = stats["last"] - stats["first"] if stats["first"] else float("nan")
    final = dict(query(dsn, "SELECT delivery_status, count(*) FROM naive.webhook_deliveries GROUP BY 1"))
    ctx.cluster.drop_database(dbname)
    out.update(
        {
            "coroutines": 10,
            "loop": "asyncio (default)",
            "design": "the seed's own table, claim query verbatim, a partial index on created_at serving it",
            "claim_plan": plan,
            "received": stats["count"],
            "per_second_first_to_last_receipt": round(stats["count"] / span, 1) if span == span else None,
            "final_status": final,
            "pg_cpu_ms_per_delivery": round(pg_cpu * 1000 / max(1, stats["count"]), 4),
            "sink_cpu_seconds": round(sink_cpu, 2),
        }
    )
    return out


def figures(n: dict[str, Any]) -> Figures:
    return [
        (
            "8. naive baseline (seed table + index, 10 coroutines, lock held over POST)",
            f"{n['per_second_first_to_last_receipt']:,.0f} deliveries/s ({n['processed']:,} rows, "
            f"PG CPU {n['pg_cpu_ms_per_delivery']} ms/delivery)",
        )
    ]


SECTION = Section("naive", run, options=options, figures=figures, quick={"naive_max_seconds": 30.0})
