"""Section `many`, many endpoints: healthy, slow and failing endpoints with production's default limits,
drained by several workers; requests/s, good deliveries/s, deadlocks and lock waits."""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterator
from typing import Any

import psycopg

from bench.common import deadlocks, preload, register_endpoints, reset_statements, spawn_worker
from bench.localworker import query
from bench.section import Context, Figures, Section, Target, get, target


def options(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--many-healthy", type=int, default=70)
    group.add_argument("--many-slow", type=int, default=20)
    group.add_argument("--many-slow-ms", type=int, default=200)
    group.add_argument("--many-failing", type=int, default=10)
    group.add_argument("--many-workers", type=int, default=4)
    group.add_argument("--many-rows-per-endpoint", type=int, default=200)


def run(ctx: Context) -> dict[str, Any]:
    a = ctx.args
    healthy, slow, failing = a.many_healthy, a.many_slow, a.many_failing
    urls = (
        [ctx.sink.url(f"/ok/{i}") for i in range(healthy)]
        + [ctx.sink.url(f"/slow/{a.many_slow_ms}/{i}") for i in range(slow)]
        + [ctx.sink.url(f"/fail/{i}") for i in range(failing)]
    )
    dsn = ctx.cluster.new_database("bench_many")
    ids = register_endpoints(dsn, urls)  # production default limits (max_in_flight 10, circuit on)
    rows = a.many_rows_per_endpoint * len(ids)
    preload(dsn, ids, rows)
    good_target = a.many_rows_per_endpoint * (healthy + slow)
    ctx.sink.reset()
    reset_statements(dsn)
    deadlocks0 = deadlocks(dsn)
    log_offset = ctx.cluster.log_size()
    pg0 = ctx.cluster.cpu()
    procs = [spawn_worker(dsn, ctx.workdir, f"many-w{i + 1}", ctx.settings) for i in range(a.many_workers)]
    waiting_samples, max_waiting, samples = 0, 0, 0
    deadline = time.monotonic() + a.drain_timeout
    worker_cpu = {p.name: 0.0 for p in procs}
    try:
        with psycopg.connect(ctx.cluster.url, autocommit=True) as watcher:
            while time.monotonic() < deadline:
                time.sleep(0.25)
                [[waiting]] = watcher.execute("SELECT count(*) FROM pg_locks WHERE NOT granted").fetchall()
                samples += 1
                waiting_samples += 1 if waiting else 0
                max_waiting = max(max_waiting, waiting)
                for p in procs:
                    worker_cpu[p.name] = max(worker_cpu[p.name], p.cpu())
                stats = ctx.sink.stats()
                if stats["by_kind"]["ok"] + stats["by_kind"]["slow"] >= good_target:
                    break
        time.sleep(1.0)
        stats = ctx.sink.stats()
        pg_cpu = ctx.cluster.cpu() - pg0
        for p in procs:
            worker_cpu[p.name] = max(worker_cpu[p.name], p.cpu())
    finally:
        codes = [p.stop_or_kill() for p in procs]
    pg_log = ctx.cluster.log_since(log_offset)
    final = dict(query(dsn, "SELECT status, count(*) FROM webhooks.alert_delivery_queue GROUP BY 1"))
    circuits = dict(
        query(dsn, "SELECT circuit_state, count(*) FROM webhooks.webhook_health_metrics GROUP BY 1")
    )
    attempts = query(dsn, "SELECT count(*) FROM webhooks.alert_delivery_log")[0][0]
    dl = deadlocks(dsn) - deadlocks0
    ctx.cluster.drop_database("bench_many")
    span = (stats["last"] - stats["first"]) if stats["first"] else float("nan")
    good = stats["by_kind"]["ok"] + stats["by_kind"]["slow"]
    return {
        "endpoints": {"healthy": healthy, "slow": slow, "slow_ms": a.many_slow_ms, "failing": failing},
        "workers": a.many_workers,
        "rows": rows,
        "worker_loop": "asyncio (default)",
        "requests": stats["count"],
        "requests_by_kind": stats["by_kind"],
        "seconds": round(span, 2),
        "requests_per_second": round(stats["count"] / span, 1) if span == span else None,
        "good_deliveries_per_second": round(good / span, 1) if span == span else None,
        "final_status": final,
        "circuits": circuits,
        "audit_rows": attempts,
        "deadlocks": dl,
        "deadlock_log_lines": pg_log.count("deadlock detected"),
        "lock_wait_log_lines": pg_log.count("still waiting for"),
        "lock_wait_threshold_ms": 100,
        "pg_locks_samples": samples,
        "pg_locks_samples_with_waiters": waiting_samples,
        "pg_locks_max_waiting": max_waiting,
        "cpu_seconds": {"workers": round(sum(worker_cpu.values()), 2), "postgres": round(pg_cpu, 2)},
        "worker_exit_codes": codes,
    }


def figures(m: dict[str, Any]) -> Figures:
    return [
        (
            f"7. many endpoints ({sum(m['endpoints'][k] for k in ('healthy', 'slow', 'failing'))}"
            f", {m['workers']} workers)",
            f"{m['requests_per_second']:,.0f} req/s, {m['good_deliveries_per_second']:,.0f} good/s; "
            f"deadlocks {m['deadlocks']}; lock waits >100 ms {m['lock_wait_log_lines']}; "
            f"samples with waiters {m['pg_locks_samples_with_waiters']}/{m['pg_locks_samples']}",
        )
    ]


def targets(results: dict[str, Any], _args: argparse.Namespace) -> Iterator[Target]:
    dl = get(results, "many", "deadlocks")
    if dl is not None:
        yield target("many endpoints: deadlocks", str(dl), "0", dl == 0)


SECTION = Section("many", run, options=options, figures=figures, targets=targets,
                  quick={"many_healthy": 6, "many_slow": 2, "many_failing": 2, "many_rows_per_endpoint": 20,
                         "many_workers": 2})
