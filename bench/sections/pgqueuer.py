"""Section `pgqueuer`: deliveries per CPU-second of worker + PostgreSQL, webhook-worker against a
webhook worker built on PGQueuer (bench/pgqueuer_consumer.py): the same rows, payload bytes,
signing and sink, one process each, alternating three times.

Needs the `bench` extra (pgqueuer, asyncpg); without it the section stops at once and says so.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import importlib.util
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

from bench.common import (
    machine_busy,
    machine_load,
    median_of,
    payload_sql,
    reset_statements,
    statement_counts,
)
from bench.drain import (
    DrainCpu,
    drain,
    drain_figures,
    peak_rss_kb,
    summarise_profile,
    wal_bytes_since,
    wal_lsn,
)
from bench.localworker import ROOT, proc_cpu, query
from bench.section import MEDIAN_RUNS, Context, Figures, Section, Target, get, log, target, three
from worker.rules import signing

# What the PGQueuer side imports; neither is a test tool, so CI never has them.
REQUIRED_MODULES = ("pgqueuer", "asyncpg")
INSTALL = "pip install -c scripts/constraints-dev.txt -e '.[bench]' (scripts/bench.sh does)"
DATABASE = "bench_pgqueuer"
QUEUE_TABLE = "pgqueuer"
# The process's sides, in the order each round runs them.
OURS, OURS_UVLOOP, PGQUEUER = "webhook_worker", "webhook_worker_uvloop", "pgqueuer"
SIDES = (OURS, OURS_UVLOOP, PGQUEUER)
LABELS = {
    OURS: "webhook-worker (production defaults: asyncio)",
    OURS_UVLOOP: "webhook-worker, worker.event_loop: uvloop",
    PGQUEUER: "PGQueuer (its supervisor, as pgq run: uvloop)",
}
# Client CPU is only as comparable as the batch: PGQueuer's default is 10, ours 100.
BATCH = 100
# Deliveries per CPU-second of worker + PostgreSQL, ours over PGQueuer's, at least
TARGET_RATIO = 1.3
# ... and PostgreSQL's CPU per delivery of our side, at most this (ms)
PG_CPU_TARGET_MS = 0.07
STOP_SECONDS = 60.0


def missing_modules(modules: tuple[str, ...] = REQUIRED_MODULES) -> list[str]:
    """The modules of `modules` that are not installed."""
    return [name for name in modules if importlib.util.find_spec(name) is None]


def require(modules: tuple[str, ...] = REQUIRED_MODULES) -> None:
    """Stop before anything runs when the PGQueuer side cannot: say what is missing and how to get it."""
    absent = missing_modules(modules)
    if absent:
        raise RuntimeError(f"section pgqueuer needs {' and '.join(absent)}, which the `bench` extra installs:"
                           f" {INSTALL}")


def options(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--pgqueuer-rows", type=int, default=20_000,
                       help="deliveries each side drains in each of its three runs (20,000)")
    group.add_argument("--pgqueuer-max-tasks", type=int,
                       help="PGQueuer's --max-concurrent-tasks and its HTTP connection limit (default: the"
                            " worker's concurrency, 200, at least twice the batch)")
    group.add_argument("--pgqueuer-profile", action="store_true",
                       help="after the three rounds, one more run of each side under py-spy (needs py-spy)")


def run(ctx: Context) -> dict[str, Any]:
    require()
    rows = ctx.args.pgqueuer_rows
    batch = ctx.args.claim_batch_size or BATCH
    max_tasks = max(ctx.args.pgqueuer_max_tasks or ctx.settings.in_flight, 2 * batch)
    out: dict[str, Any] = {
        "rows": rows,
        "batch": batch,
        "concurrency": {OURS: ctx.settings.in_flight, PGQUEUER: max_tasks},
        "load_average_before": machine_load(),
    }
    runs: dict[str, list[dict[str, Any]]] = {side: [] for side in SIDES}
    loads = []
    for i in range(MEDIAN_RUNS):
        log(f"pgqueuer: round {i + 1} of {MEDIAN_RUNS}: webhook-worker on asyncio, on uvloop, then PGQueuer")
        runs[OURS].append(side_figures(ours_drain(ctx, rows, None)))
        runs[OURS_UVLOOP].append(side_figures(ours_drain(ctx, rows, "uvloop")))
        runs[PGQUEUER].append(side_figures(pgqueuer_drain(ctx, rows, batch, max_tasks)))
        loads.append(machine_load())
    out["load_average_by_round"] = loads
    for side in SIDES:
        out[side] = side_medians(runs[side])
    for side in (OURS, OURS_UVLOOP):
        for prefix in ("", "steady_"):
            pairs = list(zip(runs[side], runs[PGQUEUER], strict=True))
            key = f"{prefix}deliveries_per_cpu_second"
            out[f"{prefix}{side}_over_pgqueuer"] = median_of([a[key] / b[key] for a, b in pairs]) if all(
                a[key] and b[key] for a, b in pairs) else None
    if ctx.args.pgqueuer_profile:
        log("pgqueuer: one more run of each side under py-spy")
        out["profile"] = {OURS: ours_drain(ctx, rows, None, profile=True).get("profile"),
                          PGQUEUER: pgqueuer_drain(ctx, rows, batch, max_tasks, profile=True).get("profile")}
        for profile in out["profile"].values():
            if profile and "file" in profile:
                profile["parts_pct"] = profile_parts(Path(profile["file"]))
    out["load_average_after"] = machine_load()
    return out


def ours_drain(ctx: Context, rows: int, loop: str | None, profile: bool = False) -> dict[str, Any]:
    """One webhook-worker process drains `rows` rows of one endpoint: bench.drain, as the e2e section."""
    settings = dataclasses.replace(ctx.settings, event_loop=loop) if loop else ctx.settings
    return drain(ctx, f"bench_pgq_ours_{loop or 'auto'}", 1, rows, settings, profile=profile)


def side_figures(r: dict[str, Any]) -> dict[str, Any]:
    """What the comparison reads from one drain of either side."""
    cpu = r["cpu_ms_per_delivery"]
    total = cpu["workers"] + cpu["postgres"]
    # None when the drain ended before the first sample saw a receipt (a --quick drain may)
    steady = r["cpu_ms_per_delivery_after_first_receipt"] or {"workers": None, "postgres": None}
    steady_total = (steady["workers"] + steady["postgres"]) if steady["workers"] is not None else None
    return {
        "complete": r["complete"],
        "received": r["received"],
        "per_second": r["per_second"] or 0.0,
        "wall_seconds": r["seconds_spawn_to_last_receipt"],
        "worker_cpu_ms_per_delivery": cpu["workers"],
        "pg_cpu_ms_per_delivery": cpu["postgres"],
        "cpu_ms_per_delivery": round(total, 4),
        "deliveries_per_cpu_second": round(1000 / total, 1) if total else 0.0,
        # the same without start-up: from the first sample that saw a receipt
        "steady_worker_cpu_ms_per_delivery": steady["workers"],
        "steady_pg_cpu_ms_per_delivery": steady["postgres"],
        "steady_deliveries_per_cpu_second": round(1000 / steady_total, 1) if steady_total else None,
        "round_trips_per_delivery": r["round_trips_per_delivery"],
        "wal_bytes_per_delivery": r["wal_bytes_per_delivery"],
        "cpu_seconds": r["cpu_seconds"],
        "postgres_cpu_seconds_by_process": r["postgres_cpu_seconds_by_process"],
        "statements": r["statements"][:6],
    }


def side_medians(done: list[dict[str, Any]]) -> dict[str, Any]:
    keys = ("per_second", "wall_seconds", "worker_cpu_ms_per_delivery", "pg_cpu_ms_per_delivery",
            "cpu_ms_per_delivery", "deliveries_per_cpu_second", "steady_worker_cpu_ms_per_delivery",
            "steady_pg_cpu_ms_per_delivery", "steady_deliveries_per_cpu_second", "round_trips_per_delivery",
            "wal_bytes_per_delivery")
    medians = {key: median_of([r[key] for r in done]) if all(r[key] is not None for r in done) else None
               for key in keys}
    return {"runs": done, "complete": all(r["complete"] for r in done), **medians}


def shown(m: dict[str, Any] | None, fmt: str) -> str:
    """A median with its values, or n/a where a run had no value."""
    return "n/a" if m is None else three(m, fmt=fmt)


# --- the PGQueuer side ---------------------------------------------------------------------------


def pgqueuer_drain(
    ctx: Context, rows: int, batch: int, max_tasks: int, profile: bool = False
) -> dict[str, Any]:
    """The same measurement as bench.drain, for PGQueuer: a database of its own with its schema
    (`pgq install`, then `pgq autovac`, its recommended table settings), `rows` jobs enqueued with its
    Queries.enqueue (the payload bytes ours sends), ANALYZE as after our preload; then one
    bench.pgqueuer_consumer process (PGQueuer's supervisor, as `pgq run` runs it) until the sink
    has every row. CPU of that process, PostgreSQL and the sink over the drain; complete when the
    sink counted one request per job and the queue table is empty."""
    dsn = ctx.cluster.dsn(DATABASE)
    with psycopg.connect(ctx.cluster.url, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {DATABASE}")
    query(dsn, "CREATE EXTENSION pg_stat_statements")
    env = pgqueuer_env(ctx, dsn, max_tasks)
    for command in ("install", "autovac"):
        subprocess.run([sys.executable, "-m", "pgqueuer", command], env=env, cwd=ROOT, check=True,
                       capture_output=True, timeout=120)
    log(f"{DATABASE}: enqueueing {rows:,} jobs")
    started = time.monotonic()
    bodies = [text.encode() for (text,) in query(
        dsn, f"SELECT ({payload_sql('g')})::text FROM generate_series(1, %s) g", (rows,))]
    asyncio.run(_enqueue(env, bodies))
    out: dict[str, Any] = {"rows": rows, "preload_seconds": round(time.monotonic() - started, 1),
                           "batch": batch, "max_concurrent_tasks": max_tasks}
    if not ctx.args.no_analyze:
        query(dsn, f"ANALYZE {QUEUE_TABLE}")
    wal0 = wal_lsn(dsn)
    ctx.sink.reset()
    reset_statements(dsn)
    pg0, sink0 = ctx.cluster.cpu(), ctx.sink.cpu()
    pg_by_kind = ctx.cluster.cpu_by_kind()
    busy0, own0 = machine_busy(), time.process_time()
    log_path = ctx.workdir / f"{DATABASE}.log"
    with open(log_path, "wb") as log_file:
        process = subprocess.Popen(
            [sys.executable, "-m", "bench.pgqueuer_consumer", "--batch-size", str(batch),
             "--max-concurrent-tasks", str(max_tasks)],
            stdout=log_file, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
        )
    spawned = time.time()
    profiler = _start_profiler(ctx, process.pid) if profile else None
    deadline = time.monotonic() + ctx.args.drain_timeout
    cpu_seen, rss_seen = 0.0, 0
    first_receipt: tuple[int, float, float] | None = None
    try:
        while True:
            time.sleep(0.25)
            cpu_seen = max(cpu_seen, proc_cpu(process.pid))
            rss_seen = max(rss_seen, peak_rss_kb(process.pid))
            if process.poll() is not None:
                raise RuntimeError(f"the PGQueuer worker exited with {process.returncode}; see {log_path}")
            count = ctx.sink.stats()["count"]
            if first_receipt is None and count > 0:
                first_receipt = (count, cpu_seen, ctx.cluster.cpu() - pg0)
            if count >= rows or time.monotonic() > deadline:
                break
        # as bench.drain: the last outcomes written (PGQueuer flushes its log buffer every 0.1 s)
        time.sleep(1.0)
        worker_cpu = max(cpu_seen, proc_cpu(process.pid))
        pg_cpu, sink_cpu = ctx.cluster.cpu() - pg0, ctx.sink.cpu() - sink0
        pg_seconds_by_kind = pg_by_kind.seconds()
        busy, own = machine_busy() - busy0, time.process_time() - own0
        stats = ctx.sink.stats()
        statements = [s for s in statement_counts(dsn) if "pg_stat_statements" not in s["query"]]
    finally:
        pg_by_kind.stop()
        if profiler is not None:
            out["profile"] = _finish_profiler(*profiler)
        code = _stop(process)
    [(left,)] = query(dsn, f"SELECT count(*) FROM {QUEUE_TABLE}")
    first, last, n = stats["first"], stats["last"], stats["count"]
    span = (last - first) if first and last and last > first else float("nan")
    calls = sum(s["calls"] for s in statements)
    out.update({
        "jobs_left_in_queue": left,
        "complete": n == rows and left == 0,
        **drain_figures(n, span, last, spawned, first_receipt, calls,
                        DrainCpu(worker_cpu, pg_cpu, sink_cpu, own, busy), pg_seconds_by_kind),
        "statements": statements[:8],
        "wal_bytes_per_delivery": round(wal_bytes_since(dsn, wal0) / max(1, rows)),
        "exit_code": code,
        "peak_rss_mb": round(rss_seen / 1024, 1),
    })
    if not ctx.args.keep_databases:
        ctx.cluster.drop_database(DATABASE)
    return out


def pgqueuer_env(ctx: Context, dsn: str, connections: int) -> dict[str, str]:
    """The environment of the pgq commands: libpq's PG* variables for the database (what PGQueuer's
    CLI and `asyncpg.connect()` read), the sink's URL, a signing secret like our endpoints' and the
    HTTP connection limit (`connections`: our Sender's is its concurrency); nothing PG* or BENCH_PGQ_*
    inherited from the harness's environment."""
    params = conninfo_to_dict(dsn)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PG", "BENCH_PGQ_"))}
    for key, name in (("host", "PGHOST"), ("port", "PGPORT"), ("user", "PGUSER"), ("dbname", "PGDATABASE"),
                      ("password", "PGPASSWORD")):
        if params.get(key):
            env[name] = str(params[key])
    from bench.pgqueuer_consumer import CONNECTIONS_ENV, SECRET_ENV, URL_ENV

    env.update({URL_ENV: ctx.sink.url("/ok/pgqueuer"), SECRET_ENV: signing.generate_secret(),
                CONNECTIONS_ENV: str(connections)})
    return env


async def _enqueue(env: dict[str, str], bodies: list[bytes]) -> None:
    """The jobs, through PGQueuer's own enqueue (lists: one statement per call), 1,000 a call."""
    import asyncpg
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.queries import Queries

    from bench.pgqueuer_consumer import ENTRYPOINT

    conn = await asyncpg.connect(host=env["PGHOST"], port=int(env["PGPORT"]), user=env["PGUSER"],
                                 database=env["PGDATABASE"], password=env.get("PGPASSWORD"))
    try:
        queries = Queries(AsyncpgDriver(conn))
        for start in range(0, len(bodies), 1000):
            chunk: list[bytes | None] = list(bodies[start:start + 1000])
            await queries.enqueue([ENTRYPOINT] * len(chunk), chunk, [0] * len(chunk))
    finally:
        await conn.close()


def _stop(process: subprocess.Popen[bytes]) -> int:
    """SIGTERM (PGQueuer's supervisor shuts down cleanly on it); SIGKILL after STOP_SECONDS."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        return process.wait(STOP_SECONDS)
    except subprocess.TimeoutExpired:
        process.kill()
        return process.wait(10)


def _start_profiler(ctx: Context, pid: int) -> tuple[subprocess.Popen[bytes], Path] | None:
    """py-spy on the PGQueuer process, as bench.drain samples our worker (--nonblocking, 100 Hz)."""
    py_spy = Path(sys.executable).parent / "py-spy"
    if not py_spy.exists():
        log("py-spy not installed: no profile")
        return None
    path = ctx.workdir / f"{DATABASE}.pyspy.txt"
    cmd = [str(py_spy), "record", "--nonblocking", "-r", "100", "-f", "raw", "-o", str(path), "-p", str(pid),
           "-d", str(int(ctx.args.drain_timeout))]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL), path


def _finish_profiler(process: subprocess.Popen[bytes], path: Path) -> dict[str, Any]:
    process.send_signal(signal.SIGINT)  # py-spy writes what it has
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(10)
    return summarise_profile(path) if path.exists() else {"error": "py-spy wrote nothing"}


# Where a process's samples go: py-spy stacks through each of these frames (start-up imports apart).
PROFILE_PARTS = (
    ("start-up (imports)", "importlib._bootstrap"),
    ("our POST (Sender.send)", "Sender.send (worker/daemon/sender.py"),
    ("our claims (Queue.acquire)", "Queue.acquire (worker/store/queue.py"),
    ("our finishes (Finisher.run)", "Finisher.run (worker/daemon/finisher.py"),
    ("the PGQueuer job's POST (deliver)", "deliver (bench/pgqueuer_consumer.py"),
    ("PGQueuer's dequeues (fetch_jobs)", "QueueManager.fetch_jobs (pgqueuer/"),
    ("PGQueuer's completion log (flush_items)", "JobStatusLogBuffer.flush_items (pgqueuer/"),
    ("PGQueuer's heartbeats", "Heartbeat.send_heartbeat (pgqueuer/"),
    ("signing", "signature_header (worker/rules/signing.py"),
    ("aiohttp", "aiohttp/"),
    ("psycopg", "psycopg/"),
    ("asyncpg", "asyncpg/"),
)


def profile_parts(path: Path) -> dict[str, float]:
    """Inclusive share of the samples (%) whose stack passes through each part of PROFILE_PARTS."""
    counts = dict.fromkeys((name for name, _ in PROFILE_PARTS), 0)
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack:
            continue
        total += int(count_text)
        for name, marker in PROFILE_PARTS:
            if marker in stack:
                counts[name] += int(count_text)
    return {name: round(100 * n / max(1, total), 1) for name, n in counts.items() if n}


# --- the report ----------------------------------------------------------------------------------


def figures(s: dict[str, Any]) -> Figures:
    lines: Figures = []
    for side in SIDES:
        m = s.get(side)
        if not m:
            continue
        lines.append((
            f"pgqueuer: {LABELS[side]}, {s['rows']:,} rows",
            f"{shown(m['deliveries_per_cpu_second'], fmt='{:,.0f}')} deliveries per CPU-second; CPU ms per"
            f" delivery: worker {shown(m['worker_cpu_ms_per_delivery'], fmt='{:.3f}')}, PostgreSQL"
            f" {shown(m['pg_cpu_ms_per_delivery'], fmt='{:.3f}')}, sum"
            f" {shown(m['cpu_ms_per_delivery'], fmt='{:.3f}')};"
            f" {shown(m['per_second'], fmt='{:,.0f}')} deliveries/s; wall (start to last receipt)"
            f" {shown(m['wall_seconds'], fmt='{:.1f}')} s; round trips per delivery"
            f" {shown(m['round_trips_per_delivery'], '{:.4f}')}; WAL bytes per delivery"
            f" {shown(m['wal_bytes_per_delivery'], '{:,.0f}')}; complete={m['complete']}",
        ))
        if m["steady_deliveries_per_cpu_second"] is None:
            continue
        lines.append((
            f"pgqueuer: {LABELS[side]}, from the first receipt",
            f"{shown(m['steady_deliveries_per_cpu_second'], fmt='{:,.0f}')} deliveries per CPU-second; CPU ms"
            f" per delivery: worker {shown(m['steady_worker_cpu_ms_per_delivery'], fmt='{:.3f}')}, PostgreSQL"
            f" {shown(m['steady_pg_cpu_ms_per_delivery'], fmt='{:.3f}')}",
        ))
    if "load_average_by_round" in s:
        lines.append(("pgqueuer: load average before, after each round",
                      f"{s['load_average_before']}, {s['load_average_by_round']}"))
    for side, profile in (s.get("profile") or {}).items():
        if profile and "parts_pct" in profile:
            parts = ", ".join(f"{name} {pct}%" for name, pct in profile["parts_pct"].items())
            top = ", ".join(f"{name} {pct}%" for name, pct in profile["self_pct"][:6])
            lines.append((f"pgqueuer: py-spy, {LABELS[side]}",
                          f"{profile['samples']} samples; through {parts}; most self time: {top}"))
    return lines


def targets(results: dict[str, Any], _args: argparse.Namespace) -> Iterator[Target]:
    ratio = get(results, "pgqueuer", f"{OURS}_over_pgqueuer")
    if ratio is not None:
        yield target("deliveries per CPU-second (worker + PostgreSQL), webhook-worker ÷ PGQueuer",
                     three(ratio, fmt="{:.2f}×"), f"≥ {TARGET_RATIO:g}×", ratio["median"] >= TARGET_RATIO)
    pg_cpu = get(results, "pgqueuer", OURS, "pg_cpu_ms_per_delivery")
    if pg_cpu is not None:
        yield target("PostgreSQL CPU per delivery, webhook-worker's drain", three(pg_cpu, fmt="{:.3f} ms"),
                     f"≤ {PG_CPU_TARGET_MS:g} ms", pg_cpu["median"] <= PG_CPU_TARGET_MS)
    uv = get(results, "pgqueuer", f"{OURS_UVLOOP}_over_pgqueuer")
    if uv is not None:
        yield target("the same, webhook-worker on uvloop ÷ PGQueuer (both on uvloop)",
                     three(uv, fmt="{:.2f}×"), "(no target)", None)
    for side, label in ((OURS, ""), (OURS_UVLOOP, ", webhook-worker on uvloop")):
        steady = get(results, "pgqueuer", f"steady_{side}_over_pgqueuer")
        if steady is not None:
            yield target(f"the same from the first receipt (start-up left out){label}",
                         three(steady, fmt="{:.2f}×"), "(no target)", None)


SECTION = Section("pgqueuer", run, options=options, figures=figures, targets=targets,
                  quick={"pgqueuer_rows": 300}, default=False)
