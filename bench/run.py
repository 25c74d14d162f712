"""The webhook-worker benchmark (issue 7): every figure in one run on one machine.

    .venv/bin/python -m bench.run            # full run (about 20-30 minutes on 2 cores)
    .venv/bin/python -m bench.run --quick    # small sizes: checks the harness itself in about 2 minutes

Prints a table with each target next to its figure (PASS/MISS) and writes the JSON next to the
worker and sink logs under bench/results/<timestamp>/. See bench/README.md for what each section
measures and how.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import time
import traceback
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg

from bench import naive
from bench.common import (
    GENEROUS_LIMITS,
    LOOPBACK_POLICY,
    ROOT,
    Cluster,
    Sink,
    WorkerProcess,
    WorkerSettings,
    deadlocks,
    machine_busy,
    machine_load,
    median_of,
    payload_json,
    payload_sql,
    preload,
    register_endpoints,
    reset_statements,
    spawn_worker,
    statement_counts,
    vacuum,
    vacuum_held_back,
    wait_for_autovacuum,
)
from bench.features import (
    BARE_CLAIM,
    BARE_FINISH,
    acquire_finish_drain,
    end_state,
    one_endpoint_backlog,
    section_features,
    table_lines,
)
from bench.retention import figure_lines as retention_lines
from bench.retention import section_retention
from tests.support import query, wait_started

# Timed ratios with a target are the median of this many alternating runs of their sides.
MEDIAN_RUNS = 3
SECTIONS = ("http", "db", "e2e", "latency", "backlog", "producer", "many", "naive", "endpoint", "slow",
            "features", "sweep", "storm", "tenants", "retention")
DEFAULT_SECTIONS = ("http", "db", "e2e", "latency", "backlog", "producer", "many", "naive", "endpoint",
                    "slow", "features")


def log(message: str) -> None:
    print(f"[{datetime.now().strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def loop_name() -> str:
    return type(asyncio.get_event_loop_policy()).__module__


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    k = min(len(ordered) - 1, max(0, round(p / 100 * (len(ordered) - 1))))
    return ordered[k]


# --- 1. HTTP ceiling ---------------------------------------------------------------------------------


async def _http_ceiling(url: str, concurrency: int, seconds: float) -> dict[str, Any]:
    from worker.delivery import Sender
    from worker.model import Claimed
    from worker.policy import RetrySchedule

    sender = Sender(concurrency, LOOPBACK_POLICY)
    await sender.start()
    body = payload_json(1).encode()
    rows = [
        Claimed(
            delivery_id=i,
            webhook_id=1,
            event_id=f"evt_{i}",
            idempotency_key=f"evt_{i}",
            event_type="alert.created",
            body=body,
            attempt=1,
            max_attempts=10,
            lease_token=uuid.uuid4(),
            locked_until=datetime.now(UTC) + timedelta(minutes=5),
            url=url,
            signing_secrets=("whsec_" + "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",),
            headers={},
            timeout_seconds=None,
            schedule=RetrySchedule(),
            # as claimed rows carry it: the URL's check is then asked once, as in the worker
            url_version="bench",
        )
        for i in range(concurrency)
    ]
    counts = {"ok": 0, "failed": 0}
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds

    async def one(row: Claimed) -> None:
        while loop.time() < deadline:
            sent = await sender.send(row, body, 10.0)
            counts["ok" if sent.result.status == 200 else "failed"] += 1

    cpu0, started = time.process_time(), loop.time()
    await asyncio.gather(*(one(r) for r in rows))
    elapsed, cpu = loop.time() - started, time.process_time() - cpu0
    await sender.close()
    return _client_figures(counts, elapsed, cpu)


def _client_figures(counts: dict[str, int], elapsed: float, cpu: float) -> dict[str, Any]:
    """One HTTP client loop's figures, the same for the Sender and the bare ceiling."""
    return {
        "requests": counts["ok"],
        "failed": counts["failed"],
        "seconds": round(elapsed, 2),
        "per_second": round(counts["ok"] / elapsed, 1),
        "client_cpu_ms_per_request": round(cpu * 1000 / max(1, counts["ok"]), 4),
    }


async def _bare_ceiling(url: str, concurrency: int, seconds: float) -> dict[str, Any]:
    """The library's own ceiling: a bare aiohttp ClientSession with the Sender's connector limit, the
    same payload and sink, no signing, no custom resolver or socket factory (issue 22)."""
    import aiohttp

    body = payload_json(1).encode()
    headers = {"Content-Type": "application/json"}
    counts = {"ok": 0, "failed": 0}
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as session:

        async def one() -> None:
            while loop.time() < deadline:
                async with session.post(url, data=body, headers=headers) as response:
                    await response.read()
                    counts["ok" if response.status == 200 else "failed"] += 1

        cpu0, started = time.process_time(), loop.time()
        await asyncio.gather(*(one() for _ in range(concurrency)))
        elapsed, cpu = loop.time() - started, time.process_time() - cpu0
    return {**_client_figures(counts, elapsed, cpu), "loop": "asyncio (default)"}


def bare_ceiling(ctx: Context) -> dict[str, Any]:
    return asyncio.run(_bare_ceiling(ctx.sink.url(), ctx.settings.in_flight, ctx.args.http_seconds))


def section_http(ctx: Context) -> dict[str, Any]:
    # the same number in flight as the workers: same client, same load
    conc = ctx.settings.in_flight
    out: dict[str, Any] = {"concurrency": conc, "payload_bytes": len(payload_json(1))}
    # bare, Sender, bare, Sender, …: the Sender's cost of our own request building (signing, headers,
    # the destination checks) as the median of alternating runs
    bare_runs, sender_runs = [], []
    for _ in range(MEDIAN_RUNS):
        bare_runs.append(bare_ceiling(ctx))
        ctx.sink.reset()
        sink_cpu0 = ctx.sink.cpu()
        run = asyncio.run(_http_ceiling(ctx.sink.url(), conc, ctx.args.http_seconds))
        run["loop"] = "asyncio (default; what `webhook-worker` runs)"
        run["sink_cpu_share"] = round((ctx.sink.cpu() - sink_cpu0) / run["seconds"], 3)
        sender_runs.append(run)
    out["bare"] = {"runs": bare_runs, "per_second": median_of([r["per_second"] for r in bare_runs]),
                   "client_cpu_ms_per_request": median_of(
                       [r["client_cpu_ms_per_request"] for r in bare_runs])}
    out["sender"] = {"runs": sender_runs, "per_second": median_of([r["per_second"] for r in sender_runs]),
                     "client_cpu_ms_per_request": median_of(
                         [r["client_cpu_ms_per_request"] for r in sender_runs])}
    out["sender_over_bare"] = median_of(
        [s["per_second"] / b["per_second"] for b, s in zip(bare_runs, sender_runs, strict=True)])
    # the run whose rate is the median, for the figures that read one run
    out["default_loop"] = sorted(sender_runs, key=lambda r: r["per_second"])[len(sender_runs) // 2]
    out["load_average"] = machine_load()
    try:
        import uvloop

        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            out["uvloop"] = runner.run(_http_ceiling(ctx.sink.url(), conc, ctx.args.http_seconds))
        out["uvloop"]["loop"] = "uvloop (not what the worker runs today; for comparison)"
    except ImportError:
        out["uvloop"] = None
    return out


# --- 2. database ceiling -----------------------------------------------------------------------------


def _db_full(ctx: Context, rows: int) -> dict[str, Any]:
    """acquire() + finish() over `rows` rows on one connection, no HTTP; PostgreSQL CPU per row."""
    dsn, preload_s = one_endpoint_backlog(ctx, "bench_db", rows)
    batch = ctx.settings.claim_batch_size or 100
    reset_statements(dsn)
    pg0 = ctx.cluster.cpu()
    out = asyncio.run(acquire_finish_drain(dsn, rows, batch))
    pg_cpu = ctx.cluster.cpu() - pg0
    statements = [s for s in statement_counts(dsn) if "pg_stat_statements" not in s["query"]]
    nested = statement_counts(dsn, nested=True)[:12] if ctx.args.track_nested else None
    calls = sum(s["calls"] for s in statements)
    state = end_state(dsn)
    ctx.cluster.drop_database("bench_db")
    out.update(
        {
            "batch_size": batch,
            "preload_seconds": round(preload_s, 1),
            "loop": "asyncio (default)",
            "pg_cpu_seconds": round(pg_cpu, 2),
            "pg_cpu_ms_per_row": round(pg_cpu * 1000 / max(1, out["rows"]), 4),
            "round_trips": calls,
            "round_trips_per_row": round(calls / max(1, out["rows"]), 4),
            "statements": statements[:6],
            "nested_statements": nested,
            **state,
        }
    )
    return out


def _db_bare(ctx: Context, rows: int) -> dict[str, Any]:
    dsn, _ = one_endpoint_backlog(ctx, "bench_db_bare", rows)
    batch = ctx.settings.claim_batch_size or 100
    done = 0
    with psycopg.connect(dsn, autocommit=True) as conn:
        pg0, started = ctx.cluster.cpu(), time.monotonic()
        while done < rows:
            claimed = conn.execute(BARE_CLAIM, (batch,)).fetchall()
            if not claimed:
                break
            conn.execute(BARE_FINISH, ([r[0] for r in claimed],))
            done += len(claimed)
        elapsed, pg_cpu = time.monotonic() - started, ctx.cluster.cpu() - pg0
    logged = query(dsn, "SELECT count(*) FROM webhooks.alert_delivery_log")[0][0]
    ctx.cluster.drop_database("bench_db_bare")
    return {"rows": done, "per_second": round(done / elapsed, 1), "audit_rows": logged,
            "pg_cpu_ms_per_row": round(pg_cpu * 1000 / max(1, done), 4)}


def section_db(ctx: Context) -> dict[str, Any]:
    """The SQL cost of a delivery, and the cost of the features: acquire() + finish() against a
    features-free claim and finish on the same table shape, alternating, median of three."""
    rows = min(ctx.args.rows, ctx.args.db_rows)
    full_runs, bare_runs = [], []
    for _ in range(MEDIAN_RUNS):
        full_runs.append(_db_full(ctx, rows))
        bare_runs.append(_db_bare(ctx, rows))
    out = dict(sorted(full_runs, key=lambda r: r["pg_cpu_ms_per_row"])[len(full_runs) // 2])
    out["full_pg_cpu_ms_per_row"] = median_of([r["pg_cpu_ms_per_row"] for r in full_runs])
    out["features_free"] = {"runs": bare_runs,
                            "pg_cpu_ms_per_row": median_of([r["pg_cpu_ms_per_row"] for r in bare_runs])}
    out["features_cost_ratio"] = median_of(
        [f["pg_cpu_ms_per_row"] / max(1e-9, b["pg_cpu_ms_per_row"]) for f, b in zip(full_runs, bare_runs,
                                                                                     strict=True)])
    return out


# --- 3. end to end (and the sweep, and the 1M backlog) -----------------------------------------------


def drain(
    ctx: Context,
    name: str,
    workers: int,
    rows: int,
    settings: WorkerSettings,
    endpoints: int = 1,
    profile: bool = False,
    on_preloaded: Callable[[str], dict[str, Any]] | None = None,
    on_analyzed: Callable[[str], dict[str, Any]] | None = None,
    after: Callable[[str], dict[str, Any]] | None = None,
    limits: dict[str, Any] | None = None,
    url_path: str = "/ok",
) -> dict[str, Any]:
    """Preload `rows` rows, start `workers` webhook-worker processes, wait until the sink has them
    all and every row is delivered; CPU of workers, PostgreSQL and sink over the drain. Endpoints
    get `limits` (GENEROUS_LIMITS unless given) and URLs under `url_path` (/slow/<ms> for slow)."""
    dsn = ctx.cluster.new_database(name)
    urls = [ctx.sink.url(f"{url_path}/{i}") for i in range(endpoints)]
    ids = register_endpoints(dsn, urls, **(GENEROUS_LIMITS if limits is None else limits))
    log(f"{name}: preloading {rows:,} rows")
    preload_s = preload(dsn, ids, rows)
    out: dict[str, Any] = {
        "workers": workers,
        "rows": rows,
        "endpoints": endpoints,
        "settings": settings.describe(),
        "preload_seconds": round(preload_s, 1),
        "worker_loop": "asyncio (default)",
    }
    if on_preloaded is not None:
        out.update(on_preloaded(dsn))
    if not ctx.args.no_analyze:
        # What autovacuum does within a minute of a bulk load (see bench/README.md: without it the
        # claim walks the whole backlog until then).
        query(dsn, "ANALYZE webhooks.alert_delivery_queue")
        out["analyzed_after_preload"] = True
    if on_analyzed is not None:
        out.update(on_analyzed(dsn))
    updates0 = table_updates(dsn)
    wal0, audit0 = wal_lsn(dsn), audit_log_bytes(dsn)
    ctx.sink.reset()
    reset_statements(dsn)
    deadlocks0 = deadlocks(dsn)
    pg0, sink0 = ctx.cluster.cpu(), ctx.sink.cpu()
    pg_by_kind = ctx.cluster.cpu_by_kind()
    busy0, own0 = machine_busy(), time.process_time()
    procs = [spawn_worker(dsn, ctx.workdir, f"{name}-w{i + 1}", settings) for i in range(workers)]
    spawned = time.time()
    profiler = _start_profiler(ctx, procs[0], name) if profile else None
    deadline = time.monotonic() + ctx.args.drain_timeout
    cpu_seen = {p.name: 0.0 for p in procs}
    rss_seen = {p.name: 0 for p in procs}
    count = 0
    try:
        while True:
            time.sleep(0.25)
            for p in procs:
                cpu_seen[p.name] = max(cpu_seen[p.name], p.cpu())
                rss_seen[p.name] = max(rss_seen[p.name], _peak_rss_kb(p.pid))
                if p.process.poll() is not None:
                    raise RuntimeError(f"{p.name} exited with {p.process.returncode}; see {p.log_path}")
            count = ctx.sink.stats()["count"]
            if count >= rows or time.monotonic() > deadline:
                break
        # let the last outcomes be written (finish_max_delay_seconds is 0.05 s)
        time.sleep(1.0)
        worker_cpu = sum(max(cpu_seen[p.name], p.cpu()) for p in procs)
        pg_cpu, sink_cpu = ctx.cluster.cpu() - pg0, ctx.sink.cpu() - sink0
        pg_seconds_by_kind = pg_by_kind.seconds()
        busy, own = machine_busy() - busy0, time.process_time() - own0
        stats = ctx.sink.stats((0.1, 0.9))
        statements = [s for s in statement_counts(dsn) if "pg_stat_statements" not in s["query"]]
        nested = statement_counts(dsn, nested=True)[:12] if ctx.args.track_nested else None
    finally:
        pg_by_kind.stop()
        if profiler is not None:
            out["profile"] = _finish_profiler(profiler)
        codes = [p.stop_or_kill() for p in procs]
    final = dict(query(dsn, "SELECT status, count(*) FROM webhooks.alert_delivery_queue GROUP BY 1"))
    updates = {k: v - updates0[k] for k, v in table_updates(dsn).items()}
    out["queue_updates"] = {**updates, "hot_share": round(updates["hot"] / max(1, updates["updates"]), 3)}
    # for docs/capacity.md: what a delivery writes (WAL of the whole cluster: the drain is alone on it)
    out["wal_bytes_per_delivery"] = round(wal_bytes_since(dsn, wal0) / max(1, rows))
    out["audit_log_bytes_per_delivery"] = round((audit_log_bytes(dsn) - audit0) / max(1, rows))
    first, last = stats["first"], stats["last"]
    n = stats["count"]
    span = (last - first) if first and last and last > first else float("nan")
    calls = sum(s["calls"] for s in statements)
    by_name = {"acquire": 0, "finish": 0}
    rows_by = {"acquire": 0, "finish": 0}
    for s in statements:
        for key in by_name:
            if f"webhooks.{key}(" in s["query"]:
                by_name[key] += s["calls"]
                rows_by[key] += s["rows"]
    delivered = final.get("delivered", 0)
    out.update(
        {
            "received": n,
            "delivered": delivered,
            "final_status": final,
            "complete": delivered == rows,
            "seconds_first_to_last_receipt": round(span, 2),
            "seconds_spawn_to_last_receipt": round(last - spawned, 2) if last else None,
            "per_second": round(n / span, 1) if span == span else None,
            "cpu_seconds": {
                "workers": round(worker_cpu, 2),
                "postgres": round(pg_cpu, 2),
                "sink": round(sink_cpu, 2),
                "harness": round(own, 2),
                # busy CPU of the whole machine not accounted above: other work on the machine
                "other_processes": round(max(0.0, busy - worker_cpu - pg_cpu - sink_cpu - own), 2),
            },
            "postgres_cpu_seconds_by_process": pg_seconds_by_kind,
            "cpu_ms_per_delivery": {
                "workers": round(worker_cpu * 1000 / max(1, n), 4),
                "postgres": round(pg_cpu * 1000 / max(1, n), 4),
                "sink": round(sink_cpu * 1000 / max(1, n), 4),
            },
            "round_trips": calls,
            "round_trips_per_delivery": round(calls / max(1, n), 4),
            "acquire_calls": by_name["acquire"],
            "finish_calls": by_name["finish"],
            "rows_per_acquire": round(rows_by["acquire"] / max(1, by_name["acquire"]), 1),
            "rows_per_finish": round(rows_by["finish"] / max(1, by_name["finish"]), 1),
            "statements": statements[:8],
            "nested_statements": nested,
            "deadlocks": deadlocks(dsn) - deadlocks0,
            "worker_exit_codes": codes,
            "worker_peak_rss_mb": {name: round(kb / 1024, 1) for name, kb in rss_seen.items()},
        }
    )
    if n >= 10 and stats["at_fraction"]:
        t10, t90 = stats["at_fraction"].get("0.1"), stats["at_fraction"].get("0.9")
        tenth = n * 0.1
        out["first_10pct_per_second"] = round(tenth / (t10 - first), 1) if t10 and t10 > first else None
        out["last_10pct_per_second"] = round(tenth / (last - t90), 1) if t90 and last > t90 else None
    if after is not None:
        out.update(after(dsn))
    if not ctx.args.keep_databases:
        ctx.cluster.drop_database(name)
    return out


def _start_profiler(
    ctx: Context, proc: WorkerProcess, name: str
) -> tuple[subprocess.Popen[bytes], Path] | None:
    py_spy = Path(sys.executable).parent / "py-spy"
    if not py_spy.exists():
        log("py-spy not installed: no profile")
        return None
    out = ctx.workdir / f"{name}.pyspy.txt"
    cmd = [
        str(py_spy),
        "record",
        "--nonblocking",
        "-r",
        "100",
        "-f",
        "raw",
        "-o",
        str(out),
        "-p",
        str(proc.pid),
        "-d",
        str(int(ctx.args.drain_timeout)),
    ]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL), out


def _finish_profiler(profiler: tuple[subprocess.Popen[bytes], Path] | None) -> dict[str, Any] | None:
    if profiler is None:
        return None
    process, path = profiler
    process.send_signal(2)  # SIGINT: py-spy writes what it has
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(30)
    if not path.exists():
        return {"error": "py-spy wrote nothing"}
    return summarise_profile(path)


def summarise_profile(path: Path, top: int = 20) -> dict[str, Any]:
    """Self and inclusive sample shares per function, and inclusive shares per package."""
    self_counts: dict[str, int] = {}
    incl: dict[str, int] = {}
    packages: dict[str, int] = {}
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack:
            continue
        count = int(count_text)
        # py-spy frames read "function (path/file.py:LINE)": aggregate per function, not per line
        frames = [re.sub(r":\d+\)$", ")", f) for f in stack.split(";")]
        total += count
        leaf = frames[-1]
        self_counts[leaf] = self_counts.get(leaf, 0) + count
        for frame in set(frames):
            incl[frame] = incl.get(frame, 0) + count
        seen = set()
        for frame in frames:
            pkg = _package(frame)
            if pkg not in seen:
                seen.add(pkg)
                packages[pkg] = packages.get(pkg, 0) + count

    def share(d: dict[str, int]) -> list[tuple[str, float]]:
        return [
            (k, round(100 * v / max(1, total), 1)) for k, v in sorted(d.items(), key=lambda kv: -kv[1])[:top]
        ]

    return {
        "samples": total,
        "file": str(path),
        "self_pct": share(self_counts),
        "inclusive_pct": share(incl),
        "package_inclusive_pct": share(packages),
    }


def _by_process(drained: dict[str, Any]) -> str:
    seconds = drained.get("postgres_cpu_seconds_by_process", {})
    return ", ".join(f"{kind} {spent}" for kind, spent in seconds.items())


def _package(frame: str) -> str:
    # py-spy frames look like "function (path/to/file.py:123)"
    where = frame.rpartition("(")[2]
    for name in (
        "worker/",
        "aiohttp/",
        "psycopg_pool/",
        "psycopg/",
        "structlog/",
        "prometheus_client/",
        "asyncio/",
        "yarl/",
        "multidict/",
        "pydantic",
    ):
        if name in where:
            return name.rstrip("/")
    return "other"


def section_e2e(ctx: Context) -> dict[str, Any]:
    out: dict[str, Any] = {"load_average_before": machine_load()}
    # bare ceiling, 1 worker on asyncio, 1 worker on uvloop; three times (A B C A B C A B C): the
    # worker's share of the library's ceiling and uvloop's gain, each the median of three pairs
    bare_runs: list[dict[str, Any]] = []
    loops = {"asyncio": [], "uvloop": []} if _uvloop_installed() else {"asyncio": []}
    runs: dict[str, list[dict[str, Any]]] = loops
    for i in range(MEDIAN_RUNS):
        log(f"e2e: round {i + 1} of {MEDIAN_RUNS}: bare ceiling, then 1 worker on {', '.join(loops)}")
        bare_runs.append(bare_ceiling(ctx))
        for loop in loops:
            settings = dataclasses.replace(ctx.settings, event_loop=loop)
            runs[loop].append(drain(
                ctx, f"bench_e2e1_{loop}", 1, ctx.args.rows, settings, endpoints=ctx.args.endpoints,
                profile=ctx.args.profile and loop == "asyncio" and i == 0,
            ))
    asyncio_runs = runs["asyncio"]
    out["bare_ceiling"] = {"runs": bare_runs, "per_second": median_of([r["per_second"] for r in bare_runs])}
    out["workers_1_runs"] = asyncio_runs
    out["workers_1"] = sorted(asyncio_runs, key=lambda r: r["per_second"] or 0)[len(asyncio_runs) // 2]
    out["workers_1_per_second"] = median_of([r["per_second"] or 0 for r in asyncio_runs])
    out["workers_1_over_bare"] = median_of(
        [(r["per_second"] or 0) / b["per_second"] for b, r in zip(bare_runs, asyncio_runs, strict=True)])
    out["workers_1_cpu_ms_per_delivery"] = median_of(
        [r["cpu_ms_per_delivery"]["workers"] for r in asyncio_runs])
    out["bare_cpu_ms_per_request"] = median_of([r["client_cpu_ms_per_request"] for r in bare_runs])
    if "uvloop" in runs:
        out["uvloop_runs"] = [_drain_summary(r) for r in runs["uvloop"]]
        out["uvloop_over_asyncio"] = median_of(
            [(u["per_second"] or 0) / (a["per_second"] or 1) for a, u in zip(asyncio_runs, runs["uvloop"],
                                                                              strict=True)])
        out["uvloop_cpu_ms_per_delivery"] = median_of(
            [r["cpu_ms_per_delivery"]["workers"] for r in runs["uvloop"]])
    log("e2e: 2 workers")
    out["workers_2"] = drain(ctx, "bench_e2e2", 2, ctx.args.rows, ctx.settings, endpoints=ctx.args.endpoints)
    out["load_average_after"] = machine_load()
    return out


def _peak_rss_kb(pid: int) -> int:
    """The process's peak resident set (VmHWM), in kB; 0 when it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def section_endpoint(ctx: Context) -> dict[str, Any]:
    """One endpoint's ceiling (issue 22): a fast receiver, one worker, production limits except
    `max_in_flight`, which this varies: the production default 10, then 100 and 1,000."""
    out: dict[str, Any] = {"rows": ctx.args.endpoint_rows}
    for cap in (10, 100, 1000):
        log(f"endpoint: max_in_flight {cap}")
        r = drain(ctx, "bench_endpoint", 1, ctx.args.endpoint_rows, ctx.settings,
                  limits={"max_in_flight": cap})
        out[f"max_in_flight_{cap}"] = _drain_summary(r)
    return out


def section_slow(ctx: Context) -> dict[str, Any]:
    """Slow receivers (issue 22): 100 endpoints answering after --slow-ms, one worker with
    concurrency 1,000 and then 5,000, per-endpoint caps that allow it. Throughput against the lower
    of Little's law (in flight / latency) and the fast-receiver rate; the naive design at the same
    latency for comparison (its ceiling: its 10 connections / latency)."""
    latency = ctx.args.slow_ms / 1000
    fast = _get(ctx.results, "e2e", "workers_1_per_second", "median")
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
            **_drain_summary(r),
            "littles_law_per_second": round(little, 1),
            "bound_per_second": round(bound, 1),
            "share_of_bound": round((r["per_second"] or 0) / bound, 3),
            "worker_peak_rss_mb": r["worker_peak_rss_mb"],
        }
    out["naive"] = run_naive(ctx, "bench_slow_naive", ctx.args.slow_naive_rows,
                             ctx.sink.url(f"/slow/{ctx.args.slow_ms}/naive"))
    out["naive"]["ceiling_per_second"] = round(10 / latency, 1)
    return out


def _uvloop_installed() -> bool:
    from worker.runtime import uvloop_installed

    return uvloop_installed()


def _drain_summary(r: dict[str, Any]) -> dict[str, Any]:
    return {k: r[k] for k in ("per_second", "cpu_ms_per_delivery", "complete", "cpu_seconds") if k in r}


def section_sweep(ctx: Context) -> dict[str, Any]:
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


# --- 4. latency --------------------------------------------------------------------------------------


LATENCY_ROUNDS = 5


def section_latency(ctx: Context) -> dict[str, Any]:
    """Insert-to-receipt latency of one idle worker, and the floor (bench/floor.py: the same INSERT
    and NOTIFY, a LISTEN client that reads the new rows and POSTs them, no claim), alternating,
    LATENCY_ROUNDS rounds of each (issue 22: medians of 5)."""
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


# --- 5. backlog scale --------------------------------------------------------------------------------

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


def wal_lsn(dsn: str) -> str:
    return str(query(dsn, "SELECT pg_current_wal_lsn()")[0][0])


def wal_bytes_since(dsn: str, lsn: str) -> int:
    return int(query(dsn, "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s::pg_lsn)", (lsn,))[0][0])


def audit_log_bytes(dsn: str) -> int:
    """The audit log's size on disk, its partitions and their indexes included."""
    return int(query(
        dsn,
        "SELECT coalesce(sum(pg_total_relation_size(i.inhrelid)), 0) FROM pg_inherits i"
        " WHERE i.inhparent = 'webhooks.alert_delivery_log'::regclass",
    )[0][0])


def table_updates(dsn: str) -> dict[str, int]:
    """Row updates of the queue table, and how many were HOT (heap-only: no index entries)."""
    [[upd, hot]] = query(
        dsn,
        "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables"
        " WHERE relid = 'webhooks.alert_delivery_queue'::regclass",
    )
    return {"updates": int(upd), "hot": int(hot)}


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


def section_backlog(ctx: Context) -> dict[str, Any]:
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


# --- 6. producer cost --------------------------------------------------------------------------------


def _insert_rate(
    dsn: str, sql: str, params: Callable[[int], tuple[Any, ...]], count: int, seconds: float
) -> dict[str, Any]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for i in range(50):  # warm up
            conn.execute(sql, params(-i))
        done = 0
        started = time.monotonic()
        deadline = started + seconds
        while done < count and time.monotonic() < deadline:
            conn.execute(sql, params(done))
            done += 1
        elapsed = time.monotonic() - started
    return {
        "inserts": done,
        "per_second": round(done / elapsed, 1),
        "us_per_insert": round(elapsed * 1e6 / done, 1),
    }


def section_producer(ctx: Context) -> dict[str, Any]:
    dsn = ctx.cluster.new_database("bench_producer")
    ids = register_endpoints(dsn, [ctx.sink.url(f"/ok/{i}") for i in range(ctx.args.fanout)])
    query(
        dsn,
        "CREATE TABLE public.bench_alerts (id bigserial PRIMARY KEY, title text, severity text, pad text)",
    )
    n, secs = ctx.args.producer_inserts, ctx.args.producer_seconds
    queue_insert = (
        "INSERT INTO webhooks.alert_delivery_queue (webhook_id, event_type, payload)"
        " VALUES (%s, 'alert.created', %s::jsonb)"
    )
    app_insert = "INSERT INTO public.bench_alerts (title, severity, pad) VALUES (%s, 'critical', %s)"
    pad = "x" * 900
    out: dict[str, Any] = {"one_insert_per_transaction": True, "fanout_endpoints": len(ids)}
    log("producer: queue insert, NOTIFY on")
    out["queue_notify_on"] = _insert_rate(dsn, queue_insert, lambda i: (ids[0], payload_json(i)), n, secs)
    query(dsn, "UPDATE webhooks.delivery_config SET notify_enabled = false")
    log("producer: queue insert, NOTIFY off")
    out["queue_notify_off"] = _insert_rate(dsn, queue_insert, lambda i: (ids[0], payload_json(i)), n, secs)
    query(dsn, "UPDATE webhooks.delivery_config SET notify_enabled = true")
    log("producer: application table, no trigger")
    out["app_table_no_trigger"] = _insert_rate(dsn, app_insert, lambda i: (f"alert {i}", pad), n, secs)
    query(
        dsn,
        "CREATE TRIGGER bench_alerts_webhooks AFTER INSERT ON public.bench_alerts FOR EACH ROW"
        " EXECUTE FUNCTION webhooks.observer_queue_alert('alert.created', 'id')",
    )
    log("producer: application table with the fan-out trigger")
    out["app_table_fanout_trigger"] = _insert_rate(dsn, app_insert, lambda i: (f"alert {i}", pad), n, secs)
    out["app_table_fanout_trigger"]["queue_rows_per_insert"] = len(ids)
    ctx.cluster.drop_database("bench_producer")
    return out


# --- 7. many endpoints -------------------------------------------------------------------------------


def section_many(ctx: Context) -> dict[str, Any]:
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


# --- 8. the naive baseline ---------------------------------------------------------------------------


def section_naive(ctx: Context) -> dict[str, Any]:
    """The seed design on its own table, with its own query and an index that serves it."""
    return run_naive(ctx, "bench_naive", ctx.args.rows, ctx.sink.url())


def run_naive(ctx: Context, dbname: str, rows: int, url: str) -> dict[str, Any]:
    dsn = ctx.cluster.new_database(dbname)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(naive.SCHEMA)
        conn.execute(naive.preload_sql(payload_sql("g")), (url, rows))
        conn.execute("ANALYZE naive.webhook_deliveries")
        plan = "\n".join(r[0] for r in conn.execute("EXPLAIN " + naive.CLAIM).fetchall())
    ctx.sink.reset()
    pg0, sink0 = ctx.cluster.cpu(), ctx.sink.cpu()
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.naive",
            "--dsn",
            dsn,
            "--expect",
            str(rows),
            "--max-seconds",
            str(ctx.args.naive_max_seconds),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=ctx.args.naive_max_seconds + 60,
        check=False,
    )
    pg_cpu, sink_cpu = ctx.cluster.cpu() - pg0, ctx.sink.cpu() - sink0
    if result.returncode != 0:
        raise RuntimeError(f"naive baseline failed: {result.stderr[-2000:]}")
    out = json.loads(result.stdout.strip().splitlines()[-1])
    stats = ctx.sink.stats()
    span = stats["last"] - stats["first"] if stats["first"] else float("nan")
    final = dict(query(dsn, "SELECT delivery_status, count(*) FROM naive.webhook_deliveries GROUP BY 1"))
    ctx.cluster.drop_database(dbname)
    out.update(
        {
            "coroutines": 10,
            "loop": "asyncio (default)",
            "design": "the seed's own table, claim query verbatim, a partial index on created_at serving it",
            "claim_plan": plan,
            "received": stats["count"],
            "per_second_first_to_last_receipt": round(stats["count"] / span, 1) if span == span else None,
            "final_status": final,
            "pg_cpu_ms_per_delivery": round(pg_cpu * 1000 / max(1, stats["count"]), 4),
            "sink_cpu_seconds": round(sink_cpu, 2),
        }
    )
    return out


# --- targets and the table ---------------------------------------------------------------------------


# --- 9. alert storm (issue 23) ----------------------------------------------------------------------


def section_storm(ctx: Context) -> dict[str, Any]:
    """--storm-alerts alerts in --storm-seconds to a Slack-format endpoint limited to --storm-rate
    requests/s (burst 1), once without coalescing and once with --coalesce-max --storm-coalesce;
    then one alert on the idle endpoint, with the same policy, to time a lone alert."""
    a = ctx.args
    out: dict[str, Any] = {"alerts": a.storm_alerts, "seconds": a.storm_seconds,
                           "rate_per_second": a.storm_rate, "coalesce_max": a.storm_coalesce}
    for label, coalesce_max in (("off", None), ("on", a.storm_coalesce)):
        out[label] = _storm_run(ctx, label, coalesce_max)
    return out


def _storm_run(ctx: Context, label: str, coalesce_max: int | None) -> dict[str, Any]:
    a = ctx.args
    name = f"bench_storm_{label}"
    dsn = ctx.cluster.new_database(name)
    [endpoint] = register_endpoints(dsn, [ctx.sink.url(f"/ok/storm-{label}")], prefix=f"storm-{label}",
                                    body_format="slack", rate_limit_per_second=a.storm_rate,
                                    rate_limit_burst=1, max_in_flight=10)
    if coalesce_max:
        query(dsn, "SELECT webhooks.update_endpoint(%s, %s)",
                (endpoint, json.dumps({"coalesce_max": coalesce_max})))
    ctx.sink.reset()
    [proc] = [spawn_worker(dsn, ctx.workdir, f"storm-{label}", ctx.settings)]
    insert = ("INSERT INTO webhooks.alert_delivery_queue (webhook_id, event_type, payload)"
              " SELECT %s, 'alert.created', %s::jsonb FROM generate_series(1, %s)")
    ticks = max(1, int(a.storm_seconds * 10))  # ten inserts a second, the storm spread evenly
    try:
        wait_started([proc])
        time.sleep(1.0)
        with psycopg.connect(dsn, autocommit=True) as conn:
            storm_start = time.time()
            for tick in range(ticks):
                due = storm_start + tick * a.storm_seconds / ticks
                time.sleep(max(0.0, due - time.time()))
                count = a.storm_alerts * (tick + 1) // ticks - a.storm_alerts * tick // ticks
                conn.query(insert, (endpoint, payload_json(tick), count))
        deadline = time.monotonic() + a.drain_timeout
        delivered = 0
        while time.monotonic() < deadline:
            [(delivered,)] = query(dsn, "SELECT count(*) FROM webhooks.alert_delivery_queue"
                                          " WHERE status = 'delivered'")
            if delivered >= a.storm_alerts:
                break
            time.sleep(0.25)
        storm = ctx.sink.stats()
        sizes = [n for (n,) in query(
            dsn, "SELECT count(*) FROM webhooks.alert_delivery_log WHERE outcome = 'delivered'"
                 " GROUP BY coalesce('d' || digest_id, 'r' || delivery_id)")]
        # lone alerts, one at a time: the endpoint idle, its token back
        lone_ms = []
        for n in range(a.storm_lone_alerts):
            time.sleep(2.0 / a.storm_rate + 0.5)
            ctx.sink.reset()
            sent_at = time.time()
            query(dsn, insert, (endpoint, payload_json(n), 1))
            lone_deadline = time.monotonic() + 30
            while ctx.sink.stats()["count"] < 1 and time.monotonic() < lone_deadline:
                time.sleep(0.002)
            first = ctx.sink.stats()["first"]
            if first:
                lone_ms.append(round((first - sent_at) * 1000, 1))
    finally:
        proc.stop()
    ctx.cluster.drop_database(name)
    return {
        "complete": delivered >= a.storm_alerts,
        "messages": storm["count"],
        "last_alert_received_s": round(storm["last"] - storm_start, 1) if storm["last"] else None,
        "rows_per_message_mean": round(statistics.fmean(sizes), 1) if sizes else None,
        "rows_per_message_max": max(sizes) if sizes else None,
        "lone_alert_ms": lone_ms,
        "lone_alert_ms_median": round(statistics.median(lone_ms), 1) if lone_ms else None,
    }


def section_tenants(ctx: Context) -> dict[str, Any]:
    """Fairness between tenants (issue 21): a big tenant with 50 endpoints and 50,000 rows queued, a
    small one with 1 endpoint and 500 rows queued after them; how long the small one's rows take to be
    delivered, alone, under the big one's load, and under that load with all 51 endpoints in one
    tenant (what a deployment without tenants gives an endpoint: 1/51 of each claim)."""
    big_endpoints, big_rows, small_rows = (10, 2000, 50) if ctx.args.quick else (50, 50_000, 500)
    out: dict[str, Any] = {"big_endpoints": big_endpoints, "big_rows": big_rows, "small_rows": small_rows}
    for label, load, separate in (("alone", False, True), ("loaded", True, True),
                                  ("loaded_one_tenant", True, False)):
        name = f"bench_tenants_{label}"
        dsn = ctx.cluster.new_database(name)
        big = register_endpoints(dsn, [ctx.sink.url(f"/ok/big-{i}") for i in range(big_endpoints)],
                                 prefix="big", max_in_flight=100)
        [small] = register_endpoints(dsn, [ctx.sink.url("/ok/small")], prefix="small", max_in_flight=100)
        if separate:
            query(dsn, "SELECT webhooks.register_tenant('big'), webhooks.register_tenant('small')")
            query(dsn, "UPDATE webhooks.endpoints SET tenant_id = webhooks.tenant_id('big')"
                         " WHERE id = ANY(%s)", (big,))
            query(dsn, "UPDATE webhooks.endpoints SET tenant_id = webhooks.tenant_id('small')"
                         " WHERE id = %s", (small,))
        if load:
            preload(dsn, big, big_rows)
        ctx.sink.reset()
        [proc] = [spawn_worker(dsn, ctx.workdir, f"tenants-{label}", ctx.settings)]
        try:
            wait_started([proc])
            if load:  # the big tenant's backlog is being drained when the small one's rows arrive
                deadline = time.monotonic() + 60
                while ctx.sink.stats()["count"] < 1000 and time.monotonic() < deadline:
                    time.sleep(0.05)
            started = time.monotonic()
            query(dsn, "INSERT INTO webhooks.alert_delivery_queue (webhook_id, event_type, payload)"
                         " SELECT %s, 'alert.created', %s::jsonb FROM generate_series(1, %s)",
                    (small, payload_json(0), small_rows))
            done, big_done = 0, 0
            deadline = time.monotonic() + ctx.args.drain_timeout
            while time.monotonic() < deadline:
                [(done, big_done)] = query(
                    dsn, "SELECT count(*) FILTER (WHERE webhook_id = %s),"
                         " count(*) FILTER (WHERE webhook_id <> %s)"
                         " FROM webhooks.alert_delivery_queue WHERE status = 'delivered'", (small, small))
                if done >= small_rows:
                    break
                time.sleep(0.05)
            elapsed = time.monotonic() - started
        finally:
            proc.stop()
        out[label] = {"complete": done >= small_rows, "small_rows_delivered_s": round(elapsed, 2),
                      "big_rows_delivered_by_then": big_done}
        ctx.cluster.drop_database(name)
    return out


def _get(results: dict[str, Any], *path: str) -> Any:
    node: Any = results
    for key in path:
        if not isinstance(node, dict) or key not in node or node[key] is None:
            return None
        node = node[key]
    return node


def targets(results: dict[str, Any], batch: int) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []

    def add(name: str, figure: Any, goal: str, ok: bool | None) -> None:
        rows.append(
            {
                "target": name,
                "figure": figure,
                "goal": goal,
                "result": "n/a" if ok is None else ("PASS" if ok else "MISS"),
            }
        )

    def three(m: dict[str, Any], scale: float = 1.0, fmt: str = "{:.2f}") -> str:
        return "median " + fmt.format(m["median"] * scale) + " of " + ", ".join(
            fmt.format(v * scale) for v in m["values"])

    one = _get(results, "e2e", "workers_1_per_second", "median")
    two = _get(results, "e2e", "workers_2", "per_second")
    naive_rate = _get(results, "naive", "per_second_first_to_last_receipt")
    over_bare = _get(results, "e2e", "workers_1_over_bare")
    if over_bare is not None:
        bare = results["e2e"]["bare_ceiling"]["per_second"]
        worker = results["e2e"]["workers_1_per_second"]
        add(
            "e2e 1 worker vs bare aiohttp ceiling (alternating pairs)",
            f"{three(over_bare, 100, '{:.0f}%')} (worker {three(worker, 1, '{:,.0f}')}/s;"
            f" bare {three(bare, 1, '{:,.0f}')}/s)",
            ">= 85%",
            over_bare["median"] >= 0.85,
        )
    sender = _get(results, "http", "sender_over_bare")
    if sender is not None:
        add("HTTP: our Sender vs bare aiohttp (cost of our request building)",
            three(sender, 100, "{:.0f}%"), "(no target)", None)
    uv = _get(results, "e2e", "uvloop_over_asyncio")
    if uv is not None:
        add("e2e 1 worker: uvloop vs asyncio (alternating pairs)", three(uv, 100, "{:.0f}%"),
            ">= 110% to adopt uvloop under `auto`", uv["median"] >= 1.10)
    if one is not None and naive_rate:
        add(
            "e2e 1 worker vs naive (fair: own table and index)",
            f"{one / naive_rate:.1f}x ({naive_rate:,.0f}/s naive)",
            ">= 5x",
            one >= 5 * naive_rate,
        )
    if one is not None and two is not None:
        add("e2e 2 workers vs 1", f"{two:,.0f}/s vs {one:,.0f}/s", "2 > 1", two > one)
    p50, p99 = _get(results, "latency", "p50_ms"), _get(results, "latency", "p99_ms")
    for pct, limit in (("p50", 1.5), ("p99", 2.0)):
        ratio = _get(results, "latency", f"{pct}_over_floor")
        if ratio is not None:
            add(f"latency {pct} vs the bare floor (INSERT, LISTEN, POST; alternating)",
                three(ratio, 1, "{:.2f}x") + f" ({results['latency'][pct + '_ms']} vs "
                f"{results['latency']['floor_' + pct + '_ms']} ms, medians of {LATENCY_ROUNDS})",
                f"<= {limit}x", ratio["median"] <= limit)
    if p50 is not None:
        add("latency p50 at 200/s (NOTIFY)", f"{p50:.1f} ms", "<= 5 ms", p50 <= 5)
    if p99 is not None:
        add("latency p99 at 200/s (NOTIFY)", f"{p99:.1f} ms", "<= 20 ms", p99 <= 20)
    first, last = (
        _get(results, "backlog", "first_10pct_per_second"),
        _get(results, "backlog", "last_10pct_per_second"),
    )
    if first and last:
        add(
            "1M backlog: last 10% vs first 10%",
            f"{last:,.0f}/s vs {first:,.0f}/s ({100 * last / first:.0f}%)",
            ">= 80%",
            last >= 0.8 * first,
        )
    plan = _get(results, "backlog", "claim_plan")
    if plan is not None:
        add(
            "1M backlog: claim uses the partial index, no seq scan",
            f"{plan['seq_scans_on_queue_executed']} seq scans run ({plan['seq_scans_on_queue']} in plans);"
            f" claimable index used: {plan['uses_claimable_index']};"
            f" claim {plan['claim_ms_with_explain']} ms",
            "0 seq scans run, index scan",
            plan["seq_scans_on_queue_executed"] == 0 and plan["uses_claimable_index"],
        )
    hot = _get(results, "backlog", "sizes_after_vacuum")
    if hot is not None:
        names = ("alert_delivery_queue_claimable", "alert_delivery_queue_due", "alert_delivery_queue_leased")
        live = {n.removeprefix("alert_delivery_queue_"): hot.get(n, {}).get("live_leaf_pages") for n in names}
        ok = all(v is not None and v <= 10 for v in live.values())
        add(
            "1M backlog: hot indexes near empty after drain + VACUUM",
            f"live leaf pages {live}",
            "<= 10 pages each",
            ok,
        )
    purged = _get(results, "backlog", "sizes_after_purge_and_vacuum")
    before = _get(results, "backlog", "sizes_before")
    if purged is not None and before is not None:
        heap_after = purged["alert_delivery_queue"]["bytes"]
        heap_before = before["alert_delivery_queue"]["bytes"]
        add(
            "1M backlog: table near empty after retention purge + VACUUM",
            f"{heap_after / 1e6:,.1f} MB (was {heap_before / 1e6:,.1f} MB loaded)",
            "<= 5% of loaded",
            heap_after <= 0.05 * heap_before,
        )
    rt = _get(results, "e2e", "workers_1", "round_trips_per_delivery")
    if rt is not None:
        e = results["e2e"]["workers_1"]
        add(
            "round trips per delivery (1 worker)",
            f"{rt:.3f} ({e['rows_per_acquire']} rows/acquire, {e['rows_per_finish']} rows/finish)",
            f"about 2 per batch: <= {4 / batch:.3f}",
            rt <= 4 / batch,
        )
    features = _get(results, "db", "features_cost_ratio")
    if features is not None:
        add("PostgreSQL CPU: acquire+finish vs features-free claim/finish (alternating)",
            three(features, 1, "{:.2f}x") + f" ({results['db']['full_pg_cpu_ms_per_row']['median']} vs "
            f"{results['db']['features_free']['pg_cpu_ms_per_row']['median']} ms/row)",
            "<= 1.5x", features["median"] <= 1.5)
    # The absolute 0.1 ms target is withdrawn (issue 22): capacity per PostgreSQL core, printed.
    for key, label in (("workers_1", "1 worker"), ("workers_2", "2 workers")):
        pg = _get(results, "e2e", key, "cpu_ms_per_delivery", "postgres")
        if pg:
            add(f"capacity: deliveries/s per PostgreSQL core ({label})",
                f"{1000 / pg:,.0f}/s ({pg:.3f} ms PG CPU/delivery)", "(no target)", None)
    for conc in (1000, 5000):
        slow = _get(results, "slow", f"concurrency_{conc}")
        if slow is not None:
            add(f"slow receivers: 1 worker, {conc:,} in flight, vs min(Little's law, fast rate)",
                f"{slow['per_second'] or 0:,.0f}/s = {100 * slow['share_of_bound']:.0f}% of "
                f"{slow['bound_per_second']:,.0f}/s; worker RSS {slow['worker_peak_rss_mb']} MB, "
                f"CPU {slow['cpu_ms_per_delivery']['workers']} ms/delivery",
                ">= 90%", slow["share_of_bound"] >= 0.9)
    slow_naive = _get(results, "slow", "naive")
    if slow_naive is not None:
        add("slow receivers: naive design at the same latency",
            f"{slow_naive['per_second_first_to_last_receipt'] or 0:,.0f}/s (ceiling "
            f"{slow_naive['ceiling_per_second']:,.0f}/s)", "(no target)", None)
    for cap in (10, 100, 1000):
        one_endpoint = _get(results, "endpoint", f"max_in_flight_{cap}")
        if one_endpoint is not None:
            add(f"one endpoint, fast receiver, max_in_flight {cap}",
                f"{one_endpoint['per_second'] or 0:,.0f}/s", "(no target)", None)
    dl = _get(results, "many", "deadlocks")
    if dl is not None:
        add("many endpoints: deadlocks", str(dl), "0", dl == 0)
    kept = _get(results, "retention", "worst_kept_over_window")
    if kept is not None:
        r = results["retention"]
        add(f"retention keeps pace: delivered rows kept vs the last {r['window_seconds']:g} s of deliveries",
            f"at most {kept}× ({r['peak_delivered_kept']:,} rows at worst), {r['per_second']}/s", "<= 1",
            kept <= 1)
        add("retention: table rows one window after the drain (its steady size: 0)",
            str(r["table_rows_at_end"]), "0", r["table_rows_at_end"] == 0)
    return rows


def figures_table(results: dict[str, Any]) -> list[tuple[str, str]]:
    lines: list[tuple[str, str]] = []
    h = results.get("http")
    if isinstance(h, dict):
        for key, label in (("bare", "bare aiohttp ClientSession"), ("sender", "the worker's Sender")):
            m = h[key]
            lines.append(
                (
                    f"1. HTTP ceiling, {label}, asyncio (median of {len(m['runs'])}, alternating)",
                    f"{m['per_second']['median']:,.0f} req/s of {m['per_second']['values']}; client CPU "
                    f"{m['client_cpu_ms_per_request']['median']} ms/req of "
                    f"{m['client_cpu_ms_per_request']['values']}",
                )
            )
        if h.get("uvloop"):
            lines.append(("   the Sender on uvloop (one run)", f"{h['uvloop']['per_second']:,.0f} req/s"))
        lines.append(("   load average (1, 5, 15 min) after", str(h["load_average"])))
    e = results.get("e2e")
    if isinstance(e, dict) and "bare_ceiling" in e:
        lines.append(
            (
                "3. bare ceiling in the e2e rounds; worker CPU vs bare client CPU",
                f"{e['bare_ceiling']['per_second']['values']} req/s; worker "
                f"{e['workers_1_cpu_ms_per_delivery']} ms/delivery, "
                f"bare {e['bare_cpu_ms_per_request']} ms/req"
                + (f"; on uvloop {e['uvloop_cpu_ms_per_delivery']} ms/delivery"
                   if "uvloop_cpu_ms_per_delivery" in e else "")
                + f"; load average before {e['load_average_before']}, after {e['load_average_after']}",
            )
        )
    d = results.get("db")
    if isinstance(d, dict):
        lines.append(
            (
                "2. database ceiling, acquire+finish, no HTTP",
                f"{d['per_second']:,.0f} rows/s (batch {d['batch_size']}, {d['pg_cpu_ms_per_row']} ms PG "
                f"CPU/row, {d['round_trips_per_row']} round trips/row)",
            )
        )
    e = results.get("e2e")
    if isinstance(e, dict):
        for k in ("workers_1", "workers_2"):
            r = e.get(k)
            if r:
                c = r["cpu_ms_per_delivery"]
                lines.append(
                    (
                        f"3. end to end, {r['workers']} worker(s), {r['rows']:,} rows",
                        f"{r['per_second']:,.0f} deliveries/s; CPU ms/delivery worker {c['workers']}, "
                        f"PG {c['postgres']}, sink {c['sink']}; {r['round_trips_per_delivery']} round "
                        f"trips/delivery; HOT updates {100 * r['queue_updates']['hot_share']:.0f}%; "
                        f"complete={r['complete']}; other processes on the machine "
                        f"{r['cpu_seconds'].get('other_processes', '?')} CPU-s; PG CPU-s by process "
                        + _by_process(r),
                    )
                )
    lat = results.get("latency")
    if isinstance(lat, dict):
        lines.append(
            (
                f"4. latency at {lat['rate_per_second']}/s for {lat['seconds']} s (1 idle worker)",
                f"p50 {lat['p50_ms']} ms, p95 {lat['p95_ms']} ms, p99 {lat['p99_ms']} ms, "
                f"max {lat['max_ms']} ms ({lat['received']}/{lat['inserted']} received)",
            )
        )
    b = results.get("backlog")
    if isinstance(b, dict):
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
    pr = results.get("producer")
    if isinstance(pr, dict):
        for k in ("queue_notify_on", "queue_notify_off", "app_table_no_trigger", "app_table_fanout_trigger"):
            r = pr[k]
            lines.append(
                (
                    f"6. producer: {k.replace('_', ' ')}",
                    f"{r['per_second']:,.0f} inserts/s ({r['us_per_insert']} µs each)",
                )
            )
    m = results.get("many")
    if isinstance(m, dict):
        lines.append(
            (
                f"7. many endpoints ({sum(m['endpoints'][k] for k in ('healthy', 'slow', 'failing'))}"
                f", {m['workers']} workers)",
                f"{m['requests_per_second']:,.0f} req/s, {m['good_deliveries_per_second']:,.0f} good/s; "
                f"deadlocks {m['deadlocks']}; lock waits >100 ms {m['lock_wait_log_lines']}; "
                f"samples with waiters {m['pg_locks_samples_with_waiters']}/{m['pg_locks_samples']}",
            )
        )
    n = results.get("naive")
    if isinstance(n, dict):
        lines.append(
            (
                "8. naive baseline (seed table + index, 10 coroutines, lock held over POST)",
                f"{n['per_second_first_to_last_receipt']:,.0f} deliveries/s ({n['processed']:,} rows, "
                f"PG CPU {n['pg_cpu_ms_per_delivery']} ms/delivery)",
            )
        )
    st = results.get("storm")
    if isinstance(st, dict):
        for label in ("off", "on"):
            r = st[label]
            policy = f"--coalesce-max {st['coalesce_max']}" if label == "on" else "no coalescing"
            lines.append(
                (
                    f"9. storm: {st['alerts']:,} alerts in {st['seconds']:g} s, "
                    f"{st['rate_per_second']:g} req/s, {policy}",
                    f"{r['messages']:,} messages, last alert received after {r['last_alert_received_s']} s, "
                    f"{r['rows_per_message_mean']} rows/message (max {r['rows_per_message_max']}); "
                    f"a lone alert on the idle endpoint: median {r['lone_alert_ms_median']} ms of "
                    f"{r['lone_alert_ms']}",
                )
            )
    f = results.get("features")
    if isinstance(f, dict):
        lines.extend(table_lines(f))
    r = results.get("retention")
    if isinstance(r, dict):
        lines.extend(retention_lines(r))
    s = results.get("sweep")
    if isinstance(s, dict):
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


def print_report(results: dict[str, Any], json_path: Path) -> None:
    print()
    print(
        f"webhook-worker benchmark — {results['machine']['cpu']} × {results['machine']['nproc']}, "
        f"PostgreSQL {results['machine']['postgres']}, Python {results['machine']['python']}"
    )
    print(f"loops: worker and HTTP ceiling {results['loops']['worker']}; sink {results['loops']['sink']}")
    print(f"settings: {results['settings']}")
    print()
    lines = figures_table(results)
    width = max((len(a) for a, _ in lines), default=10)
    for a, b in lines:
        print(f"{a:<{width}}  {b}")
    print()
    rows = results["targets"]
    if rows:
        w1 = max(len(r["target"]) for r in rows)
        w2 = max(len(str(r["figure"])) for r in rows)
        for r in rows:
            print(f"{r['result']:<5} {r['target']:<{w1}}  {r['figure']!s:<{w2}}  (target {r['goal']})")
    for name, error in results.get("errors", {}).items():
        print(f"ERROR in {name}: {error.splitlines()[-1] if error else ''}")
    print()
    print(f"JSON: {json_path}")


# --- main --------------------------------------------------------------------------------------------


class Context:
    def __init__(
        self, args: argparse.Namespace, cluster: Cluster, sink: Sink, workdir: Path, settings: WorkerSettings,
        results: dict[str, Any] | None = None,
    ) -> None:
        # the figures of the sections already run (the slow section reads the fast-receiver rate)
        self.results: dict[str, Any] = results if results is not None else {}
        self.args, self.cluster, self.sink, self.workdir, self.settings = (
            args,
            cluster,
            sink,
            workdir,
            settings,
        )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.run", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="small sizes, to check the harness (about 2 minutes)")
    p.add_argument(
        "--only",
        default=",".join(DEFAULT_SECTIONS),
        help=f"comma-separated sections, of {', '.join(SECTIONS)} (default: all but sweep, storm, tenants"
             " and retention)",
    )
    p.add_argument("--rows", type=int, default=50_000, help="backlog for e2e, db ceiling and naive (50,000)")
    p.add_argument("--backlog-rows", type=int, default=1_000_000, help="rows for the backlog-scale drain")
    p.add_argument("--backlog-workers", type=int, default=2, help="workers for the backlog-scale drain (2)")
    p.add_argument(
        "--endpoints", type=int, default=1, help="endpoints the e2e/backlog rows are spread over (1)"
    )
    p.add_argument("--http-seconds", type=float, default=10.0, help="HTTP ceiling duration (10 s)")
    p.add_argument("--latency-rate", type=float, default=200.0, help="latency test inserts per second (200)")
    p.add_argument("--latency-seconds", type=float, default=10.0, help="latency test duration (10 s)")
    p.add_argument("--producer-inserts", type=int, default=5000, help="inserts per producer variant (5000)")
    p.add_argument(
        "--producer-seconds", type=float, default=10.0, help="time cap per producer variant (10 s)"
    )
    p.add_argument("--fanout", type=int, default=3, help="endpoints subscribed for the fan-out trigger (3)")
    p.add_argument("--many-healthy", type=int, default=70)
    p.add_argument("--many-slow", type=int, default=20)
    p.add_argument("--many-slow-ms", type=int, default=200)
    p.add_argument("--many-failing", type=int, default=10)
    p.add_argument("--many-workers", type=int, default=4)
    p.add_argument("--many-rows-per-endpoint", type=int, default=200)
    p.add_argument("--db-rows", type=int, default=20_000, help="rows for each database-ceiling run (20,000)")
    p.add_argument("--features-index-rows", type=int, default=20_000,
                   help="rows for each drain of the features section's index prices, at most --db-rows"
                        " (20,000)")
    p.add_argument("--endpoint-rows", type=int, default=3000, help="rows for each one-endpoint drain (3,000)")
    p.add_argument("--slow-ms", type=int, default=250, help="the slow receivers' answer time (250 ms)")
    p.add_argument("--slow-rows", type=int, default=30_000, help="rows for each slow-receiver drain (30,000)")
    p.add_argument("--slow-naive-rows", type=int, default=400, help="naive rows at that latency")
    p.add_argument("--naive-max-seconds", type=float, default=120.0, help="time cap for the naive drain")
    p.add_argument("--drain-timeout", type=float, default=1200.0, help="time cap for any one drain (1200 s)")
    p.add_argument("--concurrency", type=int, help="worker.concurrency (production default 100)")
    p.add_argument(
        "--claim-batch-size", type=int, help="delivery.claim_batch_size (default from database: 100)"
    )
    p.add_argument(
        "--finish-batch-size", type=int, help="delivery.finish_batch_size (default from database: 100)"
    )
    p.add_argument("--pool-max-size", type=int, help="database.pool_max_size (production default 4)")
    p.add_argument(
        "--sweep",
        default="100:100:4,200:200:4,50:100:2,200:400:8",
        help="settings for the sweep section, batch:concurrency:pool,…",
    )
    p.add_argument("--sweep-rows", type=int, default=30_000)
    p.add_argument("--storm-alerts", type=int, default=1000, help="storm section: alerts (1,000)")
    p.add_argument("--storm-seconds", type=float, default=10.0, help="storm section: over this long (10 s)")
    p.add_argument("--storm-rate", type=float, default=1.0, help="storm section: endpoint's requests/s (1)")
    p.add_argument("--storm-coalesce", type=int, default=50, help="storm section: --coalesce-max (50)")
    p.add_argument("--storm-lone-alerts", type=int, default=5,
                   help="storm section: lone alerts timed on the idle endpoint after each storm (5)")
    p.add_argument("--retention-rows", type=int, default=200_000, help="retention section: backlog (200,000)")
    p.add_argument("--retention-workers", type=int, default=2, help="retention section: workers (2)")
    p.add_argument("--retention-seconds", type=float, default=10.0,
                   help="retention section: delivered_retention, seconds (10)")
    p.add_argument("--retention-interval", type=float,
                   help="retention section: housekeeping.interval_seconds (default: production's, 30)")
    p.add_argument("--profile", action="store_true", help="py-spy the 1-worker e2e drain (needs py-spy)")
    p.add_argument("--keep-databases", action="store_true")
    p.add_argument(
        "--no-analyze",
        action="store_true",
        help="do not ANALYZE the queue after a bulk preload (leave it to autovacuum)",
    )
    p.add_argument(
        "--track-nested",
        action="store_true",
        help="pg_stat_statements.track=all: also report statements inside the SQL functions (adds overhead)",
    )
    p.add_argument("--out", type=Path, help="results directory (default bench/results/<timestamp>)")
    args = p.parse_args(argv)
    if args.quick:
        args.rows, args.backlog_rows, args.http_seconds = 1000, 3000, 1.0
        args.latency_seconds, args.producer_inserts, args.producer_seconds = 1.0, 300, 2.0
        args.many_healthy, args.many_slow, args.many_failing = 6, 2, 2
        args.many_rows_per_endpoint, args.many_workers = 20, 2
        args.naive_max_seconds, args.sweep, args.sweep_rows = 30.0, "50:50:2", 1000
        args.endpoint_rows, args.slow_ms, args.slow_rows, args.slow_naive_rows = 200, 50, 2000, 40
        args.features_index_rows = 300
        args.retention_rows, args.retention_seconds, args.retention_interval = 3000, 2.0, 5.0
        args.drain_timeout = min(args.drain_timeout, 120.0)
    unknown = set(args.only.split(",")) - set(SECTIONS)
    if unknown:
        p.error(f"--only: unknown sections {sorted(unknown)}")
    return args


def machine() -> dict[str, Any]:
    model = "?"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return {
        "nproc": os.cpu_count(),
        "cpu": model,
        "python": platform.python_version(),
        "kernel": platform.release(),
    }


def _interrupted(signum: int, _frame: Any) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # SIGTERM, and SIGINT even when a background shell left it ignored, unwind through the finally
    # blocks: workers stopped, sink stopped, the throwaway cluster removed.
    signal.signal(signal.SIGTERM, _interrupted)
    signal.signal(signal.SIGINT, _interrupted)
    out_dir = args.out or ROOT / "bench" / "results" / datetime.now().strftime("%Y%m%d-%H%M%S")
    out_dir.mkdir(parents=True, exist_ok=True)
    settings = WorkerSettings(
        concurrency=args.concurrency,
        claim_batch_size=args.claim_batch_size,
        finish_batch_size=args.finish_batch_size,
        pool_max_size=args.pool_max_size,
    )
    batch = args.claim_batch_size or 100
    results: dict[str, Any] = {
        "started_at": datetime.now(UTC).isoformat(),
        "quick": args.quick,
        "machine": machine(),
        "settings": settings.describe(),
        "errors": {},
    }
    cluster = Cluster(track_nested=args.track_nested)
    log(f"starting PostgreSQL and the sink; results in {out_dir}")
    cluster.start()
    results["machine"]["postgres"] = cluster.version()
    sink = Sink(out_dir)
    results["loops"] = {
        "worker": "worker.event_loop auto (asyncio unless worker.runtime.AUTO_PREFERS_UVLOOP); the e2e"
                  " section also runs it on uvloop",
        "sink": sink.loop,
    }
    ctx = Context(args, cluster, sink, out_dir, settings, results)
    runners = {
        "http": section_http,
        "db": section_db,
        "e2e": section_e2e,
        "latency": section_latency,
        "backlog": section_backlog,
        "producer": section_producer,
        "many": section_many,
        "naive": section_naive,
        "endpoint": section_endpoint,
        "slow": section_slow,
        "features": section_features,
        "sweep": section_sweep,
        "storm": section_storm,
        "tenants": section_tenants,
        "retention": section_retention,
    }
    json_path = out_dir / "results.json"
    try:
        for name in args.only.split(","):
            log(f"section {name}")
            started = time.monotonic()
            try:
                results[name] = runners[name](ctx)
            except Exception:  # noqa: BLE001 - one failed section must not lose the others
                results["errors"][name] = traceback.format_exc()
                log(f"section {name} failed:\n{results['errors'][name]}")
            results.setdefault("section_seconds", {})[name] = round(time.monotonic() - started, 1)
            # the machine is shared: the load after each section tells whether others ran meanwhile
            results["machine"].setdefault("load_average", {})[name] = machine_load()
            json_path.write_text(json.dumps(results, indent=2, default=str))
    finally:
        sink.stop()
        cluster.stop()
    results["targets"] = targets(results, batch)
    results["finished_at"] = datetime.now(UTC).isoformat()
    json_path.write_text(json.dumps(results, indent=2, default=str))
    print_report(results, json_path)
    return 1 if results["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
