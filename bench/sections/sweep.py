"""Section `sweep` (not in the default run): the 1-worker drain for each batch:concurrency:pool setting."""

from __future__ import annotations

import argparse
from typing import Any

from bench.common import WorkerSettings
from bench.drain import drain
from bench.section import Context, Figures, Section, log


def options(group: argparse._ArgumentGroup) -> None:
    group.add_argument(
        "--sweep",
        default="100:100:4,200:200:4,50:100:2,200:400:8",
        help="settings for the sweep section, batch:concurrency:pool,…",
    )
    group.add_argument("--sweep-rows", type=int, default=30_000)


def run(ctx: Context) -> dict[str, Any]:
    out = {}
    for spec in ctx.args.sweep.split(","):
        batch, conc, pool = (int(x) for x in spec.split(":"))
        settings = WorkerSettings(
            concurrency=conc, claim_batch_size=batch, finish_batch_size=batch, pool_max_size=pool
        )
        log(f"sweep: batch {batch}, concurrency {conc}, pool {pool}")
        result = drain(ctx, "bench_sweep", 1, ctx.args.sweep_rows, settings, endpoints=ctx.args.endpoints)
        out[spec] = {
            k: result[k]
            for k in (
                "settings",
                "per_second",
                "cpu_ms_per_delivery",
                "rows_per_acquire",
                "rows_per_finish",
                "round_trips_per_delivery",
                "complete",
                "cpu_seconds",
            )
        }
    return out


def figures(s: dict[str, Any]) -> Figures:
    lines: Figures = []
    for spec, r in s.items():
        lines.append(
            (
                f"sweep batch:concurrency:pool {spec}",
                f"{r['per_second']:,.0f}/s; "
                f"worker CPU {r['cpu_ms_per_delivery']['workers']} ms/delivery; "
                f"{r['rows_per_acquire']} rows/acquire, {r['rows_per_finish']} rows/finish; "
                f"other processes {r['cpu_seconds'].get('other_processes', '?')} CPU-s",
            )
        )
    return lines


SECTION = Section("sweep", run, options=options, figures=figures,
                  quick={"sweep": "50:50:2", "sweep_rows": 1000}, default=False)
