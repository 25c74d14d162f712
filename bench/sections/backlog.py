"""Section `backlog`, backlog scale: a large preloaded backlog drained by several workers; throughput of
its first and last tenth, the table's and indexes' sizes through drain, VACUUM and retention, and the
claim's plans before and after ANALYZE."""

from __future__ import annotations

import argparse
import re
import time
from collections.abc import Iterator
from typing import Any

import psycopg

from bench.common import vacuum, vacuum_held_back, wait_for_autovacuum
from bench.drain import drain
from bench.localworker import query
from bench.section import Context, Figures, Section, Target, get, target


def options(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--backlog-rows", type=int, default=1_000_000, help="rows for the backlog-scale drain")
    group.add_argument("--backlog-workers", type=int, default=2,
                       help="workers for the backlog-scale drain (2)")


SIZES_SQL = """
SELECT c.relname, pg_relation_size(c.oid) AS bytes,
       CASE WHEN c.relkind = 'i' THEN (SELECT leaf_pages FROM pgstatindex(c.oid::regclass)) END AS leaf_pages,
       CASE WHEN c.relkind = 'i' THEN (SELECT deleted_pages + empty_pages FROM pgstatindex(c.oid::regclass))
       END AS free_leaf_pages
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = 'webhooks'
  AND (c.relname = 'alert_delivery_queue' OR c.oid IN (
       SELECT indexrelid FROM pg_index WHERE indrelid = 'webhooks.alert_delivery_queue'::regclass))
ORDER BY c.relname
"""


def sizes(dsn: str) -> dict[str, Any]:
    out = {}
    for name, size, leaf, free in query(dsn, SIZES_SQL):
        entry: dict[str, Any] = {"bytes": size}
        if leaf is not None:
            entry["leaf_pages"] = leaf
            entry["live_leaf_pages"] = max(0, leaf - (free or 0))
        out[name] = entry
    tuples = query(
        dsn,
        "SELECT n_live_tup, n_dead_tup FROM pg_stat_user_tables"
        " WHERE relid = 'webhooks.alert_delivery_queue'::regclass",
    )
    if tuples:
        out["_tuples"] = {"live": tuples[0][0], "dead": tuples[0][1]}
    return out


def claim_plan(ctx: Context, dsn: str, label: str = "claim") -> dict[str, Any]:
    """The claim's plans, as auto_explain logs the statements inside webhooks.acquire() (nested
    statements included), for one real claim that is rolled back."""
    offset = ctx.cluster.log_size()
    with psycopg.connect(dsn) as conn:
        conn.execute("LOAD 'auto_explain'")
        # 1 ms: the claim's statements, not the thousands of tiny per-row function calls inside them
        conn.execute("SET auto_explain.log_min_duration = 1")
        conn.execute("SET auto_explain.log_nested_statements = on")
        conn.execute("SET auto_explain.log_analyze = on")
        started = time.monotonic()
        rows = conn.execute("SELECT count(*) FROM webhooks.acquire('bench-explain', 100, 60)").fetchone()
        took_ms = (time.monotonic() - started) * 1000
        conn.rollback()
    time.sleep(0.5)
    text = ctx.cluster.log_since(offset)
    plan_lines = [line for line in text.splitlines() if "->" in line or "Scan" in line or "duration:" in line]
    scans = (line.strip() for line in plan_lines if "alert_delivery_queue" in line and "Scan" in line)
    queue_scans = list(dict.fromkeys(scans))
    seq = [line for line in queue_scans if "Seq Scan" in line]
    seq_run = [line for line in seq if "never executed" not in line]
    (ctx.workdir / f"claim_plan_{label}.txt").write_text(text)
    return {
        "claimed_rows_in_explain": rows[0] if rows else 0,
        "claim_ms_with_explain": round(took_ms, 1),
        "queue_scans": queue_scans,
        "seq_scans_on_queue": len(seq),
        "seq_scans_on_queue_executed": len(seq_run),
        "uses_claimable_index": any("alert_delivery_queue_claimable" in line for line in queue_scans),
        "plan_file": str(ctx.workdir / f"claim_plan_{label}.txt"),
    }


def run(ctx: Context) -> dict[str, Any]:
    def unanalyzed(dsn: str) -> dict[str, Any]:
        return {"sizes_before": sizes(dsn), "claim_plan_before_analyze": claim_plan(ctx, dsn, "unanalyzed")}

    def analyzed(dsn: str) -> dict[str, Any]:
        return {"claim_plan": claim_plan(ctx, dsn, "analyzed")}

    def after(dsn: str) -> dict[str, Any]:
        result: dict[str, Any] = {"sizes_after_drain": sizes(dsn)}
        started = time.monotonic()
        query(dsn, "VACUUM webhooks.alert_delivery_queue")
        result["vacuum_seconds"] = round(time.monotonic() - started, 1)
        result["sizes_after_vacuum"] = sizes(dsn)
        # Retention (7 days by default) keeps delivered rows; apply it now with the production purge.
        query(dsn, "UPDATE webhooks.delivery_config SET delivered_retention = interval '1 second'")
        time.sleep(1.1)
        started = time.monotonic()
        purged = 0
        while True:
            [[n, _, _]] = query(dsn, "SELECT * FROM webhooks.purge(50000)")
            purged += n
            if n == 0 or time.monotonic() - started > 300:
                break
        # Another session can keep this VACUUM from emptying the file: an autovacuum worker the
        # purge started, analysing the table under a snapshot that still sees rows the purge
        # deleted, or asking for a lock (VACUUM then stops giving back the empty pages at the end).
        # Neither is the table's doing: when VACUUM says so, wait for autovacuum and VACUUM again
        # (at most 3 times in all).
        result["vacuum_reports"] = []
        for _ in range(3):
            said = vacuum(dsn)
            result["vacuum_reports"].append(said)
            if not vacuum_held_back(said):
                break
            wait_for_autovacuum(dsn, 60)
        result["purged_rows"] = purged
        result["purge_and_vacuum_seconds"] = round(time.monotonic() - started, 1)
        result["sizes_after_purge_and_vacuum"] = sizes(dsn)
        return result

    return drain(
        ctx,
        "bench_backlog",
        ctx.args.backlog_workers,
        ctx.args.backlog_rows,
        ctx.settings,
        endpoints=ctx.args.endpoints,
        on_preloaded=unanalyzed,
        on_analyzed=analyzed,
        after=after,
    )


def figures(b: dict[str, Any]) -> Figures:
    lines: Figures = []
    c = b["cpu_ms_per_delivery"]
    lines.append(
        (
            f"5. backlog {b['rows']:,} rows, {b['workers']} worker(s)",
            f"{b['per_second']:,.0f}/s overall; first 10% {b.get('first_10pct_per_second')}/s, "
            f"last 10% {b.get('last_10pct_per_second')}/s; PG CPU {c['postgres']} ms/delivery; "
            f"preload {b['preload_seconds']} s; other processes on the machine "
            f"{b['cpu_seconds'].get('other_processes', '?')} CPU-s",
        )
    )
    for label, key in (
        ("before", "sizes_before"),
        ("after drain", "sizes_after_drain"),
        ("after VACUUM", "sizes_after_vacuum"),
        ("after purge+VACUUM", "sizes_after_purge_and_vacuum"),
    ):
        s = b.get(key)
        if s:
            heap = s["alert_delivery_queue"]["bytes"] / 1e6
            idx = ", ".join(
                f"{n.removeprefix('alert_delivery_queue_')} {v['bytes'] / 1e6:.1f}MB"
                f"/{v.get('live_leaf_pages')}p"
                for n, v in s.items()
                if n.startswith("alert_delivery_queue_")
            )
            lines.append((f"   sizes {label}", f"heap {heap:,.1f} MB; {idx}"))
    for attempt, said in enumerate(b.get("vacuum_reports") or [], 1):
        lines.append((f"   VACUUM after purge, #{attempt}", "; ".join(said) or "(said nothing)"))
    for label, key in (("before ANALYZE", "claim_plan_before_analyze"), ("analyzed", "claim_plan")):
        p = b.get(key) or {}
        if p:
            took = f"one claim of 100 rows took {p['claim_ms_with_explain']} ms (EXPLAIN ANALYZE)"
            lines.append((f"   claim plan {label}", took))
        for scan in p.get("queue_scans", [])[:8]:
            lines.append((f"   claim plan {label}", re.sub(r"  \(cost=[^)]*\)", "", scan)))
    hot = b.get("queue_updates")
    if hot:
        lines.append(("   queue row updates", f"{hot['updates']:,}, HOT {100 * hot['hot_share']:.0f}%"))
    health = b.get("health_row_updates")
    if health:
        lines.append(("   endpoint state row updates",
                      f"{health['updates']:,}, HOT {100 * health['hot_share']:.0f}%"))
    return lines


def targets(results: dict[str, Any], _args: argparse.Namespace) -> Iterator[Target]:
    first, last = (
        get(results, "backlog", "first_10pct_per_second"),
        get(results, "backlog", "last_10pct_per_second"),
    )
    rows = get(results, "backlog", "rows") or 0
    if first and last:
        yield target(
            f"backlog of {rows:,}: last 10% vs first 10%",
            f"{last:,.0f}/s vs {first:,.0f}/s ({100 * last / first:.0f}%)",
            ">= 90%",
            last >= 0.9 * first,
        )
    health = get(results, "backlog", "health_row_updates")
    if health is not None and health["updates"]:
        yield target(
            f"backlog of {rows:,}: endpoint state row updates heap-only (HOT)",
            f"{100 * health['hot_share']:.0f}% of {health['updates']:,}",
            ">= 90%",
            health["hot_share"] >= 0.9,
        )
    plan = get(results, "backlog", "claim_plan")
    if plan is not None:
        yield target(
            f"backlog of {rows:,}: claim uses the partial index, no seq scan",
            f"{plan['seq_scans_on_queue_executed']} seq scans run ({plan['seq_scans_on_queue']} in plans);"
            f" claimable index used: {plan['uses_claimable_index']};"
            f" claim {plan['claim_ms_with_explain']} ms",
            "0 seq scans run, index scan",
            plan["seq_scans_on_queue_executed"] == 0 and plan["uses_claimable_index"],
        )
    hot = get(results, "backlog", "sizes_after_vacuum")
    if hot is not None:
        names = ("alert_delivery_queue_claimable", "alert_delivery_queue_due", "alert_delivery_queue_leased")
        live = {n.removeprefix("alert_delivery_queue_"): hot.get(n, {}).get("live_leaf_pages") for n in names}
        ok = all(v is not None and v <= 10 for v in live.values())
        yield target(
            f"backlog of {rows:,}: hot indexes near empty after drain + VACUUM",
            f"live leaf pages {live}",
            "<= 10 pages each",
            ok,
        )
    purged = get(results, "backlog", "sizes_after_purge_and_vacuum")
    before = get(results, "backlog", "sizes_before")
    if purged is not None and before is not None:
        heap_after = purged["alert_delivery_queue"]["bytes"]
        heap_before = before["alert_delivery_queue"]["bytes"]
        yield target(
            f"backlog of {rows:,}: table near empty after retention purge + VACUUM",
            f"{heap_after / 1e6:,.1f} MB (was {heap_before / 1e6:,.1f} MB loaded)",
            "<= 5% of loaded",
            heap_after <= 0.05 * heap_before,
        )


SECTION = Section("backlog", run, options=options, figures=figures, targets=targets,
                  quick={"backlog_rows": 3000})
