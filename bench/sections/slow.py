"""Section `slow`, slow receivers: 100 endpoints answering late, one worker with a high concurrency,
against the lower of Little's law and the same worker's rate on the same 100 endpoints answering at
once; the naive design at the same latency."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Iterator
from typing import Any

from bench.common import GENEROUS_LIMITS, median_of
from bench.drain import drain, drain_summary
from bench.section import MEDIAN_RUNS, Context, Figures, Section, Target, get, log, target, three
from bench.sections.naive import run_naive

ENDPOINTS = 100
CONCURRENCIES = (1000, 5000)
# Connections of the naive design (bench/naive.py: one per coroutine), each held over its POST.
NAIVE_CONNECTIONS = 10
# Share of min(Little's law, the same worker's rate on fast receivers) the worker reaches.
SHARE_OF_BOUND_MIN = 0.90
# The worker at slow receivers ÷ the naive design there (its ceiling: connections ÷ latency).
OVER_NAIVE_MIN = 25.0
# The worker rate the naive design is compared with: the lower of the two in-flight settings.
OVER_NAIVE_CONCURRENCY = 1000


def options(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--slow-ms", type=int, default=250, help="the slow receivers' answer time (250 ms)")
    group.add_argument("--slow-rows", type=int, default=30_000,
                       help="rows for each slow-receiver drain, and for each drain of the same endpoints "
                            "answering at once (30,000)")
    group.add_argument("--slow-naive-rows", type=int, default=400, help="naive rows at that latency")


def bound(concurrency: int, latency_seconds: float, fast_per_second: float) -> dict[str, float]:
    """What a worker can do at slow receivers: in flight ÷ latency (Little's law), but no more than the
    same worker does when the same endpoints answer at once."""
    little = concurrency / latency_seconds
    return {"littles_law_per_second": round(little, 1), "fast_per_second": fast_per_second,
            "bound_per_second": round(min(little, fast_per_second), 1)}


def run(ctx: Context) -> dict[str, Any]:
    """MEDIAN_RUNS rounds of: for 1,000 and then 5,000 in flight, one worker (per-endpoint caps that
    allow it) draining --slow-rows over the 100 endpoints answering at once, then the same over the
    same endpoints answering after --slow-ms; then the naive design at that latency. Each round's
    share of min(Little's law, that round's fast rate), and the worker ÷ naive, medians of three."""
    latency = ctx.args.slow_ms / 1000
    out: dict[str, Any] = {"receiver_latency_ms": ctx.args.slow_ms, "endpoints": ENDPOINTS}
    rounds: dict[int, list[dict[str, Any]]] = {conc: [] for conc in CONCURRENCIES}
    naive_runs: list[dict[str, Any]] = []
    limits = {**GENEROUS_LIMITS, "max_in_flight": 1000}
    for i in range(MEDIAN_RUNS):
        for conc in CONCURRENCIES:
            settings = dataclasses.replace(ctx.settings, concurrency=conc)
            rows = ctx.args.slow_rows
            log(f"slow: round {i + 1} of {MEDIAN_RUNS}, concurrency {conc}: {rows:,} rows answered at once,"
                f" then {rows:,} answered after {ctx.args.slow_ms} ms")
            fast = drain(ctx, "bench_slow_fast", 1, rows, settings, endpoints=ENDPOINTS, limits=limits,
                         url_path="/ok")
            slow = drain(ctx, "bench_slow", 1, rows, settings, endpoints=ENDPOINTS, limits=limits,
                         url_path=f"/slow/{ctx.args.slow_ms}")
            b = bound(conc, latency, fast["per_second"] or 0)
            rounds[conc].append({
                **drain_summary(slow),
                **b,
                "fast": drain_summary(fast),
                "share_of_bound": round((slow["per_second"] or 0) / b["bound_per_second"], 3)
                if b["bound_per_second"] else 0.0,
                "worker_peak_rss_mb": slow["worker_peak_rss_mb"],
            })
        log(f"slow: round {i + 1} of {MEDIAN_RUNS}, the naive design, {ctx.args.slow_naive_rows:,} rows")
        naive = run_naive(ctx, "bench_slow_naive", ctx.args.slow_naive_rows,
                          ctx.sink.url(f"/slow/{ctx.args.slow_ms}/naive"))
        naive["ceiling_per_second"] = round(NAIVE_CONNECTIONS / latency, 1)
        naive_runs.append(naive)
    for conc in CONCURRENCIES:
        runs = rounds[conc]
        out[f"concurrency_{conc}"] = {
            "runs": runs,
            "per_second": median_of([r["per_second"] or 0 for r in runs]),
            "fast_per_second": median_of([r["fast_per_second"] for r in runs]),
            "littles_law_per_second": runs[0]["littles_law_per_second"],
            "share_of_bound": median_of([r["share_of_bound"] for r in runs]),
            "cpu_ms_per_delivery": median_of([r["cpu_ms_per_delivery"]["workers"] for r in runs]),
            "worker_peak_rss_mb": max(max(r["worker_peak_rss_mb"].values()) for r in runs),
            "complete": all(r["complete"] for r in runs),
        }
    out["naive"] = {
        "runs": naive_runs,
        "per_second": median_of([n["per_second_first_to_last_receipt"] or 0 for n in naive_runs]),
        "ceiling_per_second": round(NAIVE_CONNECTIONS / latency, 1),
    }
    out["over_naive"] = over_naive(rounds[OVER_NAIVE_CONCURRENCY], naive_runs)
    return out


def over_naive(worker_runs: list[dict[str, Any]], naive_runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The worker's rate at slow receivers ÷ the naive design's, round by round."""
    return median_of([(w["per_second"] or 0) / max(1e-9, n["per_second_first_to_last_receipt"] or 0)
                      for w, n in zip(worker_runs, naive_runs, strict=True)])


def figures(s: dict[str, Any]) -> Figures:
    lines: Figures = []
    for conc in CONCURRENCIES:
        c = s.get(f"concurrency_{conc}")
        if c:
            lines.append((
                f"10. slow receivers ({s['endpoints']} endpoints, {s['receiver_latency_ms']} ms), "
                f"{conc:,} in flight",
                f"{three(c['per_second'], 1, '{:,.0f}')}/s; the same endpoints answering at once "
                f"{three(c['fast_per_second'], 1, '{:,.0f}')}/s; Little's law "
                f"{c['littles_law_per_second']:,.0f}/s; worker CPU "
                f"{three(c['cpu_ms_per_delivery'], 1, '{:.3f}')} ms/delivery, peak RSS "
                f"{c['worker_peak_rss_mb']} MB; complete={c['complete']}",
            ))
    n = s.get("naive")
    if n:
        lines.append((f"10. slow receivers: naive design ({NAIVE_CONNECTIONS} connections)",
                      f"{three(n['per_second'], 1, '{:,.1f}')}/s (ceiling {n['ceiling_per_second']:,.0f}/s)"))
    return lines


def targets(results: dict[str, Any], _args: argparse.Namespace) -> Iterator[Target]:
    for conc in CONCURRENCIES:
        slow = get(results, "slow", f"concurrency_{conc}")
        if slow is not None:
            share = slow["share_of_bound"]
            yield target(f"slow receivers: 1 worker, {conc:,} in flight, vs min(Little's law, same endpoints"
                         " answering at once)",
                         f"{three(share, 100, '{:.0f}%')} ({three(slow['per_second'], 1, '{:,.0f}')}/s; at "
                         f"once {three(slow['fast_per_second'], 1, '{:,.0f}')}/s; Little "
                         f"{slow['littles_law_per_second']:,.0f}/s)",
                         f">= {SHARE_OF_BOUND_MIN:.0%}", share["median"] >= SHARE_OF_BOUND_MIN)
    ratio = get(results, "slow", "over_naive")
    if ratio is not None:
        naive = results["slow"]["naive"]
        yield target(f"slow receivers: 1 worker ({OVER_NAIVE_CONCURRENCY:,} in flight) vs the naive design",
                     f"{three(ratio, 1, '{:.1f}x')} (naive {three(naive['per_second'], 1, '{:,.1f}')}/s,"
                     f" its ceiling {naive['ceiling_per_second']:,.0f}/s)",
                     f">= {OVER_NAIVE_MIN:.0f}x", ratio["median"] >= OVER_NAIVE_MIN)


SECTION = Section("slow", run, options=options, figures=figures, targets=targets,
                  quick={"slow_ms": 50, "slow_rows": 2000, "slow_naive_rows": 40})
