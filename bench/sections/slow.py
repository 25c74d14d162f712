"""Section `slow`, slow receivers: 100 endpoints answering late, one worker with a high concurrency,
against the lower of Little's law and the fast-receiver rate; the naive design at the same latency."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Iterator
from typing import Any

from bench.common import GENEROUS_LIMITS
from bench.drain import drain, drain_summary
from bench.section import Context, Section, Target, get, log, target
from bench.sections.naive import run_naive


def options(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--slow-ms", type=int, default=250, help="the slow receivers' answer time (250 ms)")
    group.add_argument("--slow-rows", type=int, default=30_000,
                       help="rows for each slow-receiver drain (30,000)")
    group.add_argument("--slow-naive-rows", type=int, default=400, help="naive rows at that latency")


def run(ctx: Context) -> dict[str, Any]:
    """Slow receivers: 100 endpoints answering after --slow-ms, one worker with
    concurrency 1,000 and then 5,000, per-endpoint caps that allow it. Throughput against the lower
    of Little's law (in flight / latency) and the fast-receiver rate; the naive design at the same
    latency for comparison (its ceiling: its 10 connections / latency)."""
    latency = ctx.args.slow_ms / 1000
    fast = get(ctx.results, "e2e", "workers_1_per_second", "median")
    out: dict[str, Any] = {"receiver_latency_ms": ctx.args.slow_ms, "endpoints": 100,
                           "fast_receiver_per_second": fast}
    for conc in (1000, 5000):
        settings = dataclasses.replace(ctx.settings, concurrency=conc)
        rows = ctx.args.slow_rows
        log(f"slow: concurrency {conc}, {rows:,} rows")
        r = drain(ctx, "bench_slow", 1, rows, settings, endpoints=100,
                  limits={**GENEROUS_LIMITS, "max_in_flight": 1000},
                  url_path=f"/slow/{ctx.args.slow_ms}")
        little = conc / latency
        bound = min(little, fast) if fast else little
        out[f"concurrency_{conc}"] = {
            **drain_summary(r),
            "littles_law_per_second": round(little, 1),
            "bound_per_second": round(bound, 1),
            "share_of_bound": round((r["per_second"] or 0) / bound, 3),
            "worker_peak_rss_mb": r["worker_peak_rss_mb"],
        }
    out["naive"] = run_naive(ctx, "bench_slow_naive", ctx.args.slow_naive_rows,
                             ctx.sink.url(f"/slow/{ctx.args.slow_ms}/naive"))
    out["naive"]["ceiling_per_second"] = round(10 / latency, 1)
    return out


def targets(results: dict[str, Any], _args: argparse.Namespace) -> Iterator[Target]:
    for conc in (1000, 5000):
        slow = get(results, "slow", f"concurrency_{conc}")
        if slow is not None:
            yield target(f"slow receivers: 1 worker, {conc:,} in flight, vs min(Little's law, fast rate)",
                         f"{slow['per_second'] or 0:,.0f}/s = {100 * slow['share_of_bound']:.0f}% of "
                         f"{slow['bound_per_second']:,.0f}/s; worker RSS {slow['worker_peak_rss_mb']} MB, "
                         f"CPU {slow['cpu_ms_per_delivery']['workers']} ms/delivery",
                         ">= 90%", slow["share_of_bound"] >= 0.9)
    slow_naive = get(results, "slow", "naive")
    if slow_naive is not None:
        yield target("slow receivers: naive design at the same latency",
                     f"{slow_naive['per_second_first_to_last_receipt'] or 0:,.0f}/s (ceiling "
                     f"{slow_naive['ceiling_per_second']:,.0f}/s)", "(no target)", None)


SECTION = Section("slow", run, options=options, targets=targets,
                  quick={"slow_ms": 50, "slow_rows": 2000, "slow_naive_rows": 40})
