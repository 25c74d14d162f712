"""One drain, the measurement most sections share: preload a backlog, start webhook-worker
processes, wait until the sink has every row, and the figures of that (throughput, CPU by process,
round trips, HOT updates, WAL, memory, optionally a py-spy profile)."""

from __future__ import annotations

import contextlib
import re
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import (
    GENEROUS_LIMITS,
    WorkerSettings,
    deadlocks,
    machine_busy,
    preload,
    register_endpoints,
    reset_statements,
    spawn_worker,
    statement_counts,
)
from bench.localworker import WorkerProcess, query
from bench.section import Context, log


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
    health0 = table_updates(dsn, "webhooks.webhook_health_metrics")
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
    first_receipt: tuple[int, float, float] | None = None
    try:
        while True:
            time.sleep(0.25)
            for p in procs:
                cpu_seen[p.name] = max(cpu_seen[p.name], p.cpu())
                rss_seen[p.name] = max(rss_seen[p.name], peak_rss_kb(p.pid))
                if p.process.poll() is not None:
                    raise RuntimeError(f"{p.name} exited with {p.process.returncode}; see {p.log_path}")
            count = ctx.sink.stats()["count"]
            if first_receipt is None and count > 0:
                first_receipt = (count, sum(cpu_seen.values()), ctx.cluster.cpu() - pg0)
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
    health = {k: v - health0[k] for k, v in table_updates(dsn, "webhooks.webhook_health_metrics").items()}
    out["health_row_updates"] = {**health, "hot_share": round(health["hot"] / max(1, health["updates"]), 3)}
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
            "delivered": delivered,
            "final_status": final,
            "complete": delivered == rows,
            **drain_figures(n, span, last, spawned, first_receipt, calls,
                            DrainCpu(worker_cpu, pg_cpu, sink_cpu, own, busy), pg_seconds_by_kind),
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


@dataclass(frozen=True)
class DrainCpu:
    """CPU seconds a drain's processes used: workers, PostgreSQL, the sink, this harness, and the
    whole machine's busy time."""

    workers: float
    postgres: float
    sink: float
    harness: float
    machine_busy: float


def drain_figures(n: int, span: float, last: float | None, spawned: float,
                  first_receipt: tuple[int, float, float] | None, calls: int, cpu: DrainCpu,
                  pg_seconds_by_kind: dict[str, float]) -> dict[str, Any]:
    """What every drain reports, ours or another queue's: receipts, rate, CPU in all and per
    delivery (also from the first receipt), round trips."""
    return {
        "received": n,
        "seconds_first_to_last_receipt": round(span, 2),
        "seconds_spawn_to_last_receipt": round(last - spawned, 2) if last else None,
        "per_second": round(n / span, 1) if span == span else None,
        "cpu_seconds": {
            "workers": round(cpu.workers, 2),
            "postgres": round(cpu.postgres, 2),
            "sink": round(cpu.sink, 2),
            "harness": round(cpu.harness, 2),
            # busy CPU of the whole machine not accounted above: other work on the machine
            "other_processes": round(max(0.0, cpu.machine_busy - cpu.workers - cpu.postgres - cpu.sink
                                         - cpu.harness), 2),
        },
        "postgres_cpu_seconds_by_process": pg_seconds_by_kind,
        "cpu_ms_per_delivery": {
            "workers": round(cpu.workers * 1000 / max(1, n), 4),
            "postgres": round(cpu.postgres * 1000 / max(1, n), 4),
            "sink": round(cpu.sink * 1000 / max(1, n), 4),
        },
        "cpu_ms_per_delivery_after_first_receipt": steady_cpu(first_receipt, n, cpu.workers, cpu.postgres),
        "round_trips": calls,
        "round_trips_per_delivery": round(calls / max(1, n), 4),
    }


def steady_cpu(
    first_receipt: tuple[int, float, float] | None, n: int, worker_cpu: float, pg_cpu: float
) -> dict[str, float] | None:
    """CPU ms per delivery from the first sample that saw a receipt (receipts, worker and PostgreSQL
    CPU then) to the end of the drain: without the processes' start-up (imports, connections, the
    first claim), which a short drain otherwise spreads over its rows."""
    if first_receipt is None or n <= first_receipt[0]:
        return None
    count, workers, postgres = first_receipt
    return {"workers": round((worker_cpu - workers) * 1000 / (n - count), 4),
            "postgres": round((pg_cpu - postgres) * 1000 / (n - count), 4)}


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


def peak_rss_kb(pid: int) -> int:
    """The process's peak resident set (VmHWM), in kB; 0 when it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def drain_summary(r: dict[str, Any]) -> dict[str, Any]:
    return {k: r[k] for k in ("per_second", "cpu_ms_per_delivery", "complete", "cpu_seconds") if k in r}


def by_process(drained: dict[str, Any]) -> str:
    seconds = drained.get("postgres_cpu_seconds_by_process", {})
    return ", ".join(f"{kind} {spent}" for kind, spent in seconds.items())


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


def table_updates(dsn: str, table: str = "webhooks.alert_delivery_queue") -> dict[str, int]:
    """Row updates of a table (the queue unless named), and how many were HOT (heap-only: no index
    entries)."""
    [[upd, hot]] = query(
        dsn,
        "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relid = %s::regclass",
        (table,),
    )
    return {"updates": int(upd), "hot": int(hot)}
