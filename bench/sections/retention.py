"""Section `retention` (not in the default run): retention under a drain at full speed, does the purge
keep pace?

`--retention-rows` rows are preloaded and drained by `--retention-workers` workers with
`delivered_retention` set to `--retention-seconds`. Every SAMPLE_SECONDS the harness counts the
table's rows (waiting and delivered) and what the sink has received. A delivered row becomes
eligible once the retention has passed and leaves at a worker's next housekeeping round, so while
retention keeps pace the table never holds more delivered rows than the deliveries of the last
retention + interval + budget (the *window*); and once the drain is over, one window later, it holds
none: the steady size of a queue with nothing delivered within the retention.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from bench.common import (
    GENEROUS_LIMITS,
    preload,
    register_endpoints,
    reset_statements,
    spawn_worker,
    statement_counts,
)
from bench.localworker import WorkerProcess, query, wait_started
from bench.section import Context, Figures, Section, Target, get, target
from worker.config import HousekeepingConfig

SAMPLE_SECONDS = 2.0
# Receipt at the sink comes a little before the finish that marks the row delivered (outcomes wait
# up to finish_max_delay_seconds to be written together): the window is widened by this much.
RECEIPT_SLACK_SECONDS = 1.0


def options(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--retention-rows", type=int, default=200_000,
                       help="retention section: backlog (200,000)")
    group.add_argument("--retention-workers", type=int, default=2, help="retention section: workers (2)")
    group.add_argument("--retention-seconds", type=float, default=10.0,
                       help="retention section: delivered_retention, seconds (10)")
    group.add_argument("--retention-interval", type=float,
                       help="retention section: housekeeping.interval_seconds (default: production's, 30)")


def run(ctx: Context) -> dict[str, Any]:
    a = ctx.args
    name = "bench_retention"
    rows, retention = a.retention_rows, a.retention_seconds
    defaults = HousekeepingConfig()
    interval = a.retention_interval or defaults.interval_seconds
    budget = min(defaults.purge_budget_seconds, interval)
    settings = dataclasses.replace(ctx.settings, housekeeping_interval_seconds=interval,
                                   purge_budget_seconds=budget)
    window = retention + interval + budget + RECEIPT_SLACK_SECONDS
    dsn = ctx.cluster.new_database(name)
    ids = register_endpoints(dsn, [ctx.sink.url("/ok/retention")], prefix="retention", **GENEROUS_LIMITS)
    query(dsn, "UPDATE webhooks.delivery_config SET delivered_retention = make_interval(secs => %s)",
          (retention,))
    preload_s = preload(dsn, ids, rows)
    query(dsn, "ANALYZE webhooks.alert_delivery_queue")
    ctx.sink.reset()
    reset_statements(dsn)
    procs = [spawn_worker(dsn, ctx.workdir, f"retention-w{i + 1}", settings)
             for i in range(a.retention_workers)]
    samples: list[dict[str, Any]] = []
    drained_at: float | None = None
    try:
        wait_started(procs)
        started = time.monotonic()
        deadline = started + a.drain_timeout + window
        while True:
            received = ctx.sink.stats()["count"]
            [(table_rows, kept)] = query(
                dsn, "SELECT count(*), count(*) FILTER (WHERE status = 'delivered')"
                     " FROM webhooks.alert_delivery_queue")
            t = time.monotonic() - started
            samples.append({"t": round(t, 1), "received": received, "table_rows": table_rows,
                            "delivered_kept": kept, "waiting": table_rows - kept})
            if drained_at is None and received >= rows:
                drained_at = t
            if drained_at is not None and t >= drained_at + window:
                break
            if time.monotonic() > deadline:
                break
            for p in procs:
                if p.process.poll() is not None:
                    raise RuntimeError(f"{p.name} exited with {p.process.returncode}; see {p.log_path}")
            time.sleep(SAMPLE_SECONDS)
        purged = {p.name: _purge_metrics(p) for p in procs}
        statements = [s for s in statement_counts(dsn) if "webhooks.purge(" in s["query"]]
    finally:
        codes = [p.stop_or_kill() for p in procs]
    for s in samples:
        s["window_deliveries"] = s["received"] - _received_at(samples, s["t"] - window)
    # Until one window has passed every delivered row is inside it: the comparison starts there.
    during = [s for s in samples if s["t"] >= window and (drained_at is None or s["t"] <= drained_at)]
    during = during or samples
    worst = max(during, key=lambda s: s["delivered_kept"] / max(1, s["window_deliveries"]))
    drain_seconds = drained_at if drained_at is not None else float("nan")
    final = samples[-1]
    if not a.keep_databases:
        ctx.cluster.drop_database(name)
    return {
        "rows": rows,
        "workers": a.retention_workers,
        "retention_seconds": retention,
        "housekeeping": {"interval_seconds": interval, "purge_budget_seconds": budget,
                         "purge_batch_size": defaults.purge_batch_size},
        "window_seconds": window,
        "preload_seconds": round(preload_s, 1),
        "complete": drained_at is not None and final["table_rows"] == 0,
        "drain_seconds": round(drain_seconds, 1),
        "per_second": round(rows / drain_seconds, 1) if drained_at else None,
        "peak_table_rows_after_preload": max(s["table_rows"] for s in samples),
        "peak_delivered_kept": max(s["delivered_kept"] for s in during),
        "worst_kept_over_window": round(worst["delivered_kept"] / max(1, worst["window_deliveries"]), 3),
        "worst_sample": worst,
        "table_rows_at_drain_end": next((s["table_rows"] for s in samples if s["t"] >= drain_seconds), None),
        "table_rows_at_end": final["table_rows"],
        "seconds_after_drain_at_end": round(final["t"] - drain_seconds, 1),
        "purged_by_worker": purged,
        "purged_rows": sum(p["delivered"] for p in purged.values()),
        "purge_statements": statements,
        "samples": samples,
        "worker_exit_codes": codes,
    }


def _received_at(samples: list[dict[str, Any]], t: float) -> float:
    """The sink's count at time t, interpolated between samples (0 before the first)."""
    before = [s for s in samples if s["t"] <= t]
    after = [s for s in samples if s["t"] > t]
    if not before:
        return 0.0
    if not after:
        return float(before[-1]["received"])
    s0, s1 = before[-1], after[0]
    share = (t - s0["t"]) / max(1e-9, s1["t"] - s0["t"])
    return float(s0["received"] + share * (s1["received"] - s0["received"]))


def _purge_metrics(worker: WorkerProcess) -> dict[str, Any]:
    """What this worker's retention did, from its /metrics."""
    status, body = worker.get("/metrics")
    found: dict[str, Any] = {"delivered": 0, "batches": 0, "behind": None}
    if status != 200:
        return found
    for family in text_string_to_metric_families(body):
        for sample in family.samples:
            if sample.name == "webhook_worker_purged_rows_total" and sample.labels.get("kind") == "delivered":
                found["delivered"] = int(sample.value)
            elif sample.name == "webhook_worker_purge_batches_total":
                found["batches"] = int(sample.value)
            elif sample.name == "webhook_worker_purge_behind":
                found["behind"] = int(sample.value)
    return found


def figures(r: dict[str, Any]) -> Figures:
    """The section's lines in the printed table."""
    split = ", ".join(f"{name} {p['delivered']:,} in {p['batches']:,} batches"
                      for name, p in r["purged_by_worker"].items())
    mean_ms = [round(s["ms"] / max(1, s["calls"]), 1) for s in r["purge_statements"]]
    return [
        (f"13. retention: {r['rows']:,} rows, {r['workers']} workers, delivered_retention "
         f"{r['retention_seconds']:g} s, housekeeping every {r['housekeeping']['interval_seconds']:g} s",
         f"drained in {r['drain_seconds']} s ({r['per_second']}/s); delivered rows kept at most "
         f"{r['peak_delivered_kept']:,} (worst {r['worst_kept_over_window']}× the last "
         f"{r['window_seconds']:g} s of deliveries); table {r['table_rows_at_drain_end']} rows when "
         f"drained, {r['table_rows_at_end']} after {r['seconds_after_drain_at_end']} s more"),
        ("    retention: purged by each worker",
         f"{split}; purge() mean {mean_ms} ms per batch of {r['housekeeping']['purge_batch_size']:,}"),
    ]


def targets(results: dict[str, Any], _args: argparse.Namespace) -> Iterator[Target]:
    kept = get(results, "retention", "worst_kept_over_window")
    if kept is not None:
        r = results["retention"]
        yield target(f"retention keeps pace: delivered rows kept vs the last {r['window_seconds']:g} s of "
                     "deliveries",
                     f"at most {kept}× ({r['peak_delivered_kept']:,} rows at worst), {r['per_second']}/s",
                     "<= 1", kept <= 1)
        yield target("retention: table rows one window after the drain (its steady size: 0)",
                     str(r["table_rows_at_end"]), "0", r["table_rows_at_end"] == 0)


SECTION = Section("retention", run, options=options, figures=figures, targets=targets,
                  quick={"retention_rows": 3000, "retention_seconds": 2.0, "retention_interval": 5.0},
                  default=False)
