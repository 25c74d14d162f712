"""Section `latency`: insert-to-receipt latency of one idle worker at a steady insert rate, against the
floor (bench/floor.py: the same INSERT and NOTIFY, a LISTEN client that POSTs the new rows, no claim)."""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import psycopg

from bench.common import GENEROUS_LIMITS, median_of, payload_json, register_endpoints, spawn_worker
from bench.localworker import ROOT, WorkerProcess, wait_started
from bench.section import Context, Figures, Section, Target, get, log, target, three


def options(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--latency-rate", type=float, default=200.0,
                       help="latency test inserts per second (200)")
    group.add_argument("--latency-seconds", type=float, default=10.0, help="latency test duration (10 s)")


LATENCY_ROUNDS = 5
# Worker ÷ floor, the median of the rounds' ratios: p50 and p99.
OVER_FLOOR_MAX = {"p50": 1.5, "p99": 3.0}


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    k = min(len(ordered) - 1, max(0, round(p / 100 * (len(ordered) - 1))))
    return ordered[k]


def run(ctx: Context) -> dict[str, Any]:
    """Insert-to-receipt latency of one idle worker, and the floor (bench/floor.py: the same INSERT
    and NOTIFY, a LISTEN client that reads the new rows and POSTs them, no claim), alternating,
    LATENCY_ROUNDS rounds of each (medians of 5)."""
    out: dict[str, Any] = {
        "rate_per_second": ctx.args.latency_rate,
        "seconds": ctx.args.latency_seconds,
        "workers": 1,
        "notify": True,
        "worker_loop": "worker.event_loop auto",
    }
    rounds: dict[str, list[dict[str, Any]]] = {"worker": [], "floor": []}
    for i in range(LATENCY_ROUNDS):
        for kind in ("worker", "floor"):
            log(f"latency: round {i + 1} of {LATENCY_ROUNDS}, {kind}")
            rounds[kind].append(_latency_round(ctx, kind))
    worker, floor = rounds["worker"], rounds["floor"]
    for key in ("p50_ms", "p95_ms", "p99_ms", "max_ms", "mean_ms"):
        out[key] = statistics.median(r[key] for r in worker)
        out[f"floor_{key}"] = statistics.median(r[key] for r in floor)
    out["inserted"] = sum(r["inserted"] for r in worker)
    out["received"] = sum(r["received"] for r in worker)
    out["rounds"] = rounds
    out["p50_over_floor"] = median_of([w["p50_ms"] / max(1e-9, f["p50_ms"]) for w, f in zip(worker, floor,
                                                                                          strict=True)])
    out["p99_over_floor"] = median_of([w["p99_ms"] / max(1e-9, f["p99_ms"]) for w, f in zip(worker, floor,
                                                                                          strict=True)])
    return out


def _latency_round(ctx: Context, kind: str) -> dict[str, Any]:
    dsn = ctx.cluster.new_database("bench_latency")
    [endpoint] = register_endpoints(dsn, [ctx.sink.url()], **GENEROUS_LIMITS)
    ctx.sink.reset()
    proc: WorkerProcess | subprocess.Popen[bytes]
    if kind == "worker":
        proc = spawn_worker(dsn, ctx.workdir, "latency-w1", ctx.settings)
    else:
        ready = ctx.workdir / "floor.ready"
        ready.unlink(missing_ok=True)
        proc = subprocess.Popen([sys.executable, "-m", "bench.floor", "--dsn", dsn, "--url", ctx.sink.url(),
                                 "--ready-file", str(ready)], cwd=ROOT)
    try:
        if isinstance(proc, WorkerProcess):
            wait_started([proc])
        else:
            deadline = time.monotonic() + 30
            while not ready.exists():
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("the latency floor client did not start")
                time.sleep(0.05)
        time.sleep(1.5)  # idle: listening, nothing queued
        total = int(ctx.args.latency_rate * ctx.args.latency_seconds)
        insert = (
            "INSERT INTO webhooks.alert_delivery_queue (webhook_id, event_type, payload)"
            " VALUES (%s, 'alert.created', %s::jsonb)"
        )
        late = 0
        with psycopg.connect(dsn, autocommit=True) as conn:
            start = time.monotonic() + 0.1
            for i in range(total):
                due = start + i / ctx.args.latency_rate
                wait = due - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                elif wait < -0.005:
                    late += 1
                conn.execute(insert, (endpoint, payload_json(i, {"bench_t": time.time()})))
            produce_s = time.monotonic() - start
        deadline = time.monotonic() + 30
        while ctx.sink.stats()["count"] < total and time.monotonic() < deadline:
            time.sleep(0.1)
        samples = [(recv - sent) * 1000 for sent, recv in ctx.sink.latency()]
    finally:
        if isinstance(proc, WorkerProcess):
            proc.stop_or_kill()
        else:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
    ctx.cluster.drop_database("bench_latency")
    return {
        "inserted": total,
        "received": len(samples),
        "producer_seconds": round(produce_s, 2),
        "producer_late_inserts": late,
        "p50_ms": round(percentile(samples, 50), 2),
        "p95_ms": round(percentile(samples, 95), 2),
        "p99_ms": round(percentile(samples, 99), 2),
        "max_ms": round(max(samples), 2) if samples else None,
        "mean_ms": round(statistics.fmean(samples), 2) if samples else None,
    }


def figures(lat: dict[str, Any]) -> Figures:
    return [
        (
            f"4. latency at {lat['rate_per_second']}/s for {lat['seconds']} s (1 idle worker)",
            f"p50 {lat['p50_ms']} ms, p95 {lat['p95_ms']} ms, p99 {lat['p99_ms']} ms, "
            f"max {lat['max_ms']} ms ({lat['received']}/{lat['inserted']} received)",
        )
    ]


def targets(results: dict[str, Any], _args: argparse.Namespace) -> Iterator[Target]:
    p50, p99 = get(results, "latency", "p50_ms"), get(results, "latency", "p99_ms")
    for pct, limit in OVER_FLOOR_MAX.items():
        ratio = get(results, "latency", f"{pct}_over_floor")
        if ratio is not None:
            yield target(f"latency {pct} vs the bare floor (INSERT, LISTEN, POST; alternating)",
                         three(ratio, 1, "{:.2f}x") + f" ({results['latency'][pct + '_ms']} vs "
                         f"{results['latency']['floor_' + pct + '_ms']} ms, medians of {LATENCY_ROUNDS})",
                         f"<= {limit}x", ratio["median"] <= limit)
    if p50 is not None:
        yield target("latency p50 at 200/s (NOTIFY)", f"{p50:.1f} ms", "<= 5 ms", p50 <= 5)
    if p99 is not None:
        yield target("latency p99 at 200/s (NOTIFY)", f"{p99:.1f} ms", "<= 20 ms", p99 <= 20)


SECTION = Section("latency", run, options=options, figures=figures, targets=targets,
                  quick={"latency_seconds": 1.0})
