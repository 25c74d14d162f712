"""Section `reclaim` (not in the default run): messages reclaimed by workers purging at once.

A producer publishes `--reclaim-rate` events a second for `--reclaim-seconds`, each fanned out to
`--reclaim-endpoints` endpoints (one message, several deliveries), while `--reclaim-workers` workers
deliver them to the sink and purge them after `--reclaim-retention` seconds, housekeeping every
`--reclaim-interval` seconds: several purges delete deliveries of the same messages at the same
moment. Every SAMPLE_SECONDS the harness counts the messages and the queue's rows. Once every event
is received and nothing is left to purge, it counts the messages no delivery points at (orphans),
the deadlocks PostgreSQL counted in the database and those the workers logged. Targets: 0 orphans,
0 deadlocks, no message left.
"""

from __future__ import annotations

import argparse
import dataclasses
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg

from bench.common import GENEROUS_LIMITS, deadlocks, payload_json, register_endpoints, spawn_worker
from bench.localworker import WorkerProcess, query, wait_started
from bench.section import Context, Figures, Section, Target, target

SAMPLE_SECONDS = 2.0
ORPHANS = ("SELECT count(*) FROM webhooks.messages m WHERE NOT EXISTS"
           " (SELECT FROM webhooks.alert_delivery_queue q WHERE q.message_id = m.message_id)")


def options(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--reclaim-rate", type=float, default=70.0,
                       help="reclaim section: events published a second (70: about 210 deliveries/s)")
    group.add_argument("--reclaim-seconds", type=float, default=120.0,
                       help="reclaim section: how long the producer publishes (120)")
    group.add_argument("--reclaim-endpoints", type=int, default=3,
                       help="reclaim section: endpoints each event goes to (3)")
    group.add_argument("--reclaim-workers", type=int, default=2, help="reclaim section: workers (2)")
    group.add_argument("--reclaim-retention", type=float, default=2.0,
                       help="reclaim section: delivered_retention, seconds (2)")
    group.add_argument("--reclaim-interval", type=float, default=2.0,
                       help="reclaim section: housekeeping.interval_seconds (2)")
    group.add_argument("--reclaim-batch", type=int,
                       help="reclaim section: housekeeping.purge_batch_size (default: production's, 1000)")


def _produce(dsn: str, rate: float, seconds: float, stop: threading.Event, published: list[int]) -> None:
    """One event per transaction at `rate` a second, paced on the clock, for `seconds` at most."""
    started = time.monotonic()
    with psycopg.connect(dsn, autocommit=True) as conn:
        n = 0
        while not stop.is_set():
            due = started + n / rate
            now = time.monotonic()
            if due - started >= seconds:
                return
            if due > now:
                time.sleep(due - now)
            conn.execute("SELECT webhooks.publish('bench.reclaim', %s::jsonb)", (payload_json(n),))
            n += 1
            published[0] = n


def run(ctx: Context) -> dict[str, Any]:
    a = ctx.args
    name = "bench_reclaim"
    settings = dataclasses.replace(ctx.settings, housekeeping_interval_seconds=a.reclaim_interval,
                                   purge_batch_size=a.reclaim_batch)
    dsn = ctx.cluster.new_database(name)
    register_endpoints(dsn, [ctx.sink.url(f"/ok/reclaim-{i}") for i in range(a.reclaim_endpoints)],
                       prefix="reclaim", **GENEROUS_LIMITS)
    query(dsn, "UPDATE webhooks.delivery_config SET delivered_retention = make_interval(secs => %s)",
          (a.reclaim_retention,))
    ctx.sink.reset()
    deadlocks_before = deadlocks(dsn)
    procs: list[WorkerProcess] = [spawn_worker(dsn, ctx.workdir, f"reclaim-w{i + 1}", settings)
                                  for i in range(a.reclaim_workers)]
    samples: list[dict[str, Any]] = []
    published = [0]
    stop = threading.Event()
    producer = threading.Thread(target=_produce,
                                args=(dsn, a.reclaim_rate, a.reclaim_seconds, stop, published))
    # after the producer: every delivery received, then retention, a round and its budget to purge it
    settle = a.reclaim_retention + 2 * a.reclaim_interval + 5.0
    emptied_at: float | None = None
    try:
        wait_started(procs)
        started = time.monotonic()
        producer.start()
        deadline = started + a.reclaim_seconds + a.drain_timeout
        while True:
            t = time.monotonic() - started
            [(messages, rows, delivered)] = query(
                dsn, "SELECT (SELECT count(*) FROM webhooks.messages), count(*),"
                     " count(*) FILTER (WHERE status = 'delivered') FROM webhooks.alert_delivery_queue")
            received = ctx.sink.stats()["count"]
            samples.append({"t": round(t, 1), "published": published[0], "received": received,
                            "messages": messages, "queue_rows": rows, "delivered_kept": delivered})
            done = not producer.is_alive() and received >= published[0] * a.reclaim_endpoints
            if done and rows == 0 and emptied_at is None:
                emptied_at = t
            if emptied_at is not None and (messages == 0 or t >= emptied_at + settle):
                break
            if time.monotonic() > deadline:
                break
            for p in procs:
                if p.process.poll() is not None:
                    raise RuntimeError(f"{p.name} exited with {p.process.returncode}; see {p.log_path}")
            time.sleep(SAMPLE_SECONDS)
        [(orphans,)] = query(dsn, ORPHANS)
        counted = deadlocks(dsn) - deadlocks_before
        logged = sum(sum(1 for line in p.log_lines() if "Deadlock" in str(line)) for p in procs)
    finally:
        stop.set()
        producer.join(30)
        codes = [p.stop_or_kill() for p in procs]
    elapsed = samples[-1]["t"] if samples else 0.0
    events = published[0]
    final = samples[-1]
    if not a.keep_databases:
        ctx.cluster.drop_database(name)
    return {
        "rate_events_per_second": a.reclaim_rate,
        "endpoints": a.reclaim_endpoints,
        "workers": a.reclaim_workers,
        "retention_seconds": a.reclaim_retention,
        "housekeeping_interval_seconds": a.reclaim_interval,
        "purge_batch_size": a.reclaim_batch,
        "events": events,
        "deliveries": events * a.reclaim_endpoints,
        "deliveries_per_second": round(events * a.reclaim_endpoints / max(1e-9, a.reclaim_seconds), 1),
        "complete": emptied_at is not None,
        "orphans": orphans,
        "deadlocks": counted,
        "deadlocks_logged_by_workers": logged,
        "messages_peak": max(s["messages"] for s in samples),
        "messages_at_end": final["messages"],
        "queue_rows_at_end": final["queue_rows"],
        "seconds": elapsed,
        "samples": samples,
        "worker_exit_codes": codes,
    }


def figures(r: dict[str, Any]) -> Figures:
    step = max(1, len(r["samples"]) // 12)
    over_time = ", ".join(f"{s['t']:g} s: {s['messages']:,}" for s in r["samples"][::step])
    return [
        (f"reclaim: {r['events']:,} events to {r['endpoints']} endpoints each ({r['deliveries_per_second']}"
         f" deliveries/s), {r['workers']} workers purging after {r['retention_seconds']:g} s",
         f"orphans {r['orphans']}, deadlocks {r['deadlocks']} (logged by workers "
         f"{r['deadlocks_logged_by_workers']}), messages at most {r['messages_peak']:,}, "
         f"{r['messages_at_end']} at the end"),
        ("    reclaim: messages over time", over_time),
    ]


def targets(results: dict[str, Any], _args: argparse.Namespace) -> Iterator[Target]:
    r = results.get("reclaim")
    if not isinstance(r, dict):
        return
    yield target("reclaim: messages no delivery points at", str(r["orphans"]), "0", r["orphans"] == 0)
    yield target("reclaim: deadlocks while purging", str(r["deadlocks"]), "0", r["deadlocks"] == 0)
    yield target("reclaim: messages left once everything is purged", str(r["messages_at_end"]), "0",
                 r["messages_at_end"] == 0)


SECTION = Section("reclaim", run, options=options, figures=figures, targets=targets,
                  quick={"reclaim_rate": 20.0, "reclaim_seconds": 5.0}, default=False)
