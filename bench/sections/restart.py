"""Section `restart` (not in the default run): a drain that loses its database in the middle. A
backlog drained by several workers; when half of it has arrived at the sink the cluster is crashed
and started again (`pg_ctl restart -m immediate`), and the harness counts receipts every quarter
second: how soon the rate before the crash is back, and what the state tables hold then (dead row
versions, HOT updates). Nothing waits for autovacuum: the rate must come back by itself."""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterator
from typing import Any

from bench.common import GENEROUS_LIMITS, machine_load, preload, register_endpoints, spawn_worker
from bench.localworker import query
from bench.section import Context, Figures, Section, Target, get, log, target

SAMPLE_SECONDS = 0.25
# The rate before the crash: receipts over this many seconds just before it.
BEFORE_SECONDS = 10.0
# The rate is back when a window this long after the crash reaches RECOVERED_SHARE of the rate before.
WINDOW_SECONDS = 1.0
RECOVERED_SHARE = 0.9
RECOVERY_GOAL_SECONDS = 10.0
STATE_TABLES = ("webhook_health_metrics", "alert_delivery_queue")


def options(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--restart-rows", type=int, default=300_000,
                       help="restart section: backlog, crashed when half has arrived (300,000)")
    group.add_argument("--restart-workers", type=int, default=2, help="restart section: workers (2)")


def table_state(dsn: str) -> dict[str, Any]:
    """The state tables' row versions (pgstattuple: exact, whatever the statistics lost in the crash)
    and their updates since the statistics were last reset (a crash resets them)."""
    out: dict[str, Any] = {}
    for table in STATE_TABLES:
        [(live, dead, pages)] = query(
            dsn,
            f"SELECT tuple_count, dead_tuple_count, table_len / 8192 FROM pgstattuple('webhooks.{table}')")
        [(updates, hot)] = query(
            dsn, "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relid = %s::regclass",
            (f"webhooks.{table}",))
        out[table] = {"live": live, "dead": dead, "pages": pages, "updates": updates, "hot": hot,
                      "hot_share": round(hot / updates, 3) if updates else None}
    return out


def rate_between(samples: list[tuple[float, int]], start: float, end: float) -> float | None:
    """Receipts per second between two instants, from the samples nearest inside them."""
    inside = [s for s in samples if start <= s[0] <= end]
    if len(inside) < 2 or inside[-1][0] <= inside[0][0]:
        return None
    return (inside[-1][1] - inside[0][1]) / (inside[-1][0] - inside[0][0])


def run(ctx: Context) -> dict[str, Any]:
    a = ctx.args
    name = "bench_restart"
    rows = a.restart_rows
    dsn = ctx.cluster.new_database(name)
    ids = register_endpoints(dsn, [ctx.sink.url("/ok/restart")], prefix="restart", **GENEROUS_LIMITS)
    log(f"{name}: preloading {rows:,} rows")
    preload_s = preload(dsn, ids, rows)
    query(dsn, "ANALYZE webhooks.alert_delivery_queue")
    ctx.sink.reset()
    out: dict[str, Any] = {"rows": rows, "workers": a.restart_workers, "preload_seconds": round(preload_s, 1),
                           "load_average_before": machine_load()}
    procs = [spawn_worker(dsn, ctx.workdir, f"restart-w{i + 1}", ctx.settings)
             for i in range(a.restart_workers)]
    samples: list[tuple[float, int]] = []
    crashed_at = up_at = None
    started = time.monotonic()
    deadline = started + a.drain_timeout
    try:
        while True:
            time.sleep(SAMPLE_SECONDS)
            count = ctx.sink.stats()["count"]
            now = time.monotonic() - started
            samples.append((now, count))
            for p in procs:
                if p.process.poll() is not None:
                    raise RuntimeError(f"{p.name} exited with {p.process.returncode}; see {p.log_path}")
            if crashed_at is None and count >= rows // 2:
                out["state_before_crash"] = table_state(dsn)
                log(f"{name}: {count:,} received; crashing the cluster (pg_ctl restart -m immediate)")
                crashed_at = time.monotonic() - started
                samples.append((crashed_at, ctx.sink.stats()["count"]))
                ctx.cluster.local.restart("immediate")
                up_at = time.monotonic() - started
            if count >= rows or time.monotonic() > deadline:
                break
        out["state_after_drain"] = table_state(dsn)
    finally:
        out["worker_exit_codes"] = [p.stop_or_kill() for p in procs]
    out["load_average_after"] = machine_load()
    out["received"] = samples[-1][1] if samples else 0
    out["complete"] = out["received"] >= rows
    if crashed_at is None or up_at is None:
        return out
    before = rate_between(samples, crashed_at - BEFORE_SECONDS, crashed_at)
    out["crash_at_seconds"] = round(crashed_at, 2)
    out["restart_seconds"] = round(up_at - crashed_at, 2)
    out["per_second_before"] = round(before, 1) if before else None
    # receipts per second in each second after the crash, for a minute
    out["per_second_after"] = [
        round(r) if (r := rate_between(samples, crashed_at + i, crashed_at + i + 1 + SAMPLE_SECONDS / 2))
        is not None else None for i in range(60)]
    recovered = None
    if before:
        for t, _ in samples:
            if t < up_at:
                continue
            rate = rate_between(samples, t, t + WINDOW_SECONDS)
            if rate is not None and rate >= RECOVERED_SHARE * before:
                recovered = t + WINDOW_SECONDS
                break
    out["seconds_to_full_rate"] = round(recovered - crashed_at, 2) if recovered is not None else None
    out["seconds_to_full_rate_after_up"] = round(recovered - up_at, 2) if recovered is not None else None
    ten = rate_between(samples, crashed_at, crashed_at + RECOVERY_GOAL_SECONDS)
    out["per_second_first_10s_after"] = round(ten, 1) if ten is not None else None
    if not a.keep_databases:
        ctx.cluster.drop_database(name)
    return out


def figures(r: dict[str, Any]) -> Figures:
    lines: Figures = [(
        f"restart: {r['rows']:,} rows, {r['workers']} workers, crashed at half",
        f"{r.get('per_second_before')}/s before; back to {100 * RECOVERED_SHARE:.0f}% of it "
        f"{r.get('seconds_to_full_rate')} s after the crash, {r.get('seconds_to_full_rate_after_up')} s after"
        f" the server was up again (the restart took {r.get('restart_seconds')} s); "
        f"{r.get('per_second_first_10s_after')}/s over the first 10 s; load "
        f"{r['load_average_before']} -> {r['load_average_after']}",
    )]
    after = r.get("per_second_after") or []
    lines.append(("   per second after the crash", ", ".join(str(v) for v in after[:30])))
    for when in ("state_before_crash", "state_after_drain"):
        for table, s in (r.get(when) or {}).items():
            lines.append((f"   {table}, {when.replace('_', ' ')}",
                          f"{s['live']:,} live, {s['dead']:,} dead row versions, {s['pages']:,} pages; "
                          f"{s['updates']:,} updates, HOT {s['hot_share']}"))
    return lines


def targets(results: dict[str, Any], _args: argparse.Namespace) -> Iterator[Target]:
    back = get(results, "restart", "seconds_to_full_rate")
    if get(results, "restart", "per_second_before"):
        yield target(
            f"restart -m immediate mid-drain: {100 * RECOVERED_SHARE:.0f}% of the rate before, back within",
            "never" if back is None else f"{back} s",
            f"<= {RECOVERY_GOAL_SECONDS:.0f} s",
            back is not None and back <= RECOVERY_GOAL_SECONDS,
        )


SECTION = Section("restart", run, options=options, figures=figures, targets=targets,
                  quick={"restart_rows": 6000}, default=False)
