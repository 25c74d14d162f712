"""The benchmark's own plumbing: the cluster, the sink process, CPU accounting, SQL it alone needs.

Endpoints, worker processes and queries come from bench/localworker.py, which the tests' helper
library re-exports, so that a change to either (an encryption key, network allow-lists, how a
worker is configured) is made once and the benchmark's workers are the tests' workers.
"""

from __future__ import annotations

import json
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from bench.localworker import (
    KEYRING,
    LOOPBACK,
    ROOT,
    WorkerProcess,
    add_endpoints,
    proc_cpu,
    query,
)
from worker import schema
from worker.config import WorkerConfig
from worker.localpg import LocalPostgres
from worker.rules.destinations import DestinationRules

BENCH_KEYRING = KEYRING
LOOPBACK_POLICY = DestinationRules.from_settings(True, LOOPBACK, False)
CLK_TCK = os.sysconf("SC_CLK_TCK")
TEMPLATE = "bench_template"
# The bench's own cluster: throwaway durability settings as in the test suite (worker.localpg), plus
# statement counting, lock-wait logging and room for a 1M-row load.
BENCH_PG_SETTINGS = {
    "shared_preload_libraries": "pg_stat_statements",
    "pg_stat_statements.track": "top",
    "pg_stat_statements.max": "1000",
    "log_lock_waits": "on",
    "deadlock_timeout": "100ms",
    "shared_buffers": "1GB",
    "max_wal_size": "8GB",
    "checkpoint_timeout": "30min",
}

# ~1 KB of JSON, the same in every section.
PAD = "x" * 900


def payload_sql(n_expr: str) -> str:
    """SQL for a ~1 KB payload whose alert_id is n_expr."""
    return (
        f"jsonb_build_object('alert_id', {n_expr}, 'title', 'Disk almost full on db-' || {n_expr},"
        f" 'severity', 'critical', 'source', 'bench', 'pad', '{PAD}')"
    )


def payload_json(n: int, extra: dict[str, Any] | None = None) -> str:
    body: dict[str, Any] = {
        "alert_id": n,
        "title": f"Disk almost full on db-{n}",
        "severity": "critical",
        "source": "bench",
        "pad": PAD,
    }
    body.update(extra or {})
    return json.dumps(body)


# --- figures ---------------------------------------------------------------------------------------


def median_of(values: list[float]) -> dict[str, Any]:
    """A timed figure as the report prints it: the median, and the values it is the median of."""
    return {"median": round(statistics.median(values), 4), "values": [round(v, 4) for v in values]}


def machine_load() -> list[float]:
    """The 1, 5 and 15 minute load averages (2 cores here: above 2, something waited for CPU)."""
    return [round(x, 2) for x in os.getloadavg()]


# --- processes and CPU -----------------------------------------------------------------------------


def machine_busy() -> float:
    """CPU-seconds the whole machine has been busy (all cores, /proc/stat), to tell how much of a
    section's CPU went to processes outside the benchmark."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = values[3] + values[4]
    return (sum(values[:8]) - idle) / CLK_TCK


def _children(ppid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == ppid:
            found.append(int(entry))
    return found


# Server processes other than client backends, by the title PostgreSQL gives them.
SERVER_PROCESS_KINDS = (
    "autovacuum worker",
    "autovacuum launcher",
    "walwriter",
    "checkpointer",
    "background writer",
    "logical replication launcher",
)


def _server_process_kind(pid: int) -> str:
    try:
        title = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "gone"
    body = title.strip().removeprefix("postgres: ")
    return next((kind for kind in SERVER_PROCESS_KINDS if body.startswith(kind)), "backends")


class ServerCpuByKind:
    """Where the cluster's CPU goes from now until `seconds()`: client backends, autovacuum, the WAL
    writer, and so on. A thread samples the processes every quarter second, so one that exits in
    between (autovacuum workers do, and a client's backend when it disconnects) counts up to its last
    sample. CPU no sample saw, and the postmaster's own, is reported as `not attributed`."""

    def __init__(self, postmaster_pid: int, every_seconds: float = 0.25) -> None:
        self.postmaster_pid = postmaster_pid
        self.total_at_start = tree_cpu(postmaster_pid)
        self.at_start = self._read()
        self.last_seen: dict[int, tuple[str, float]] = dict(self.at_start)
        self._every = every_seconds
        self._done = threading.Event()
        self._sampler = threading.Thread(target=self._sample_until_done, name="pg-cpu-sampler", daemon=True)
        self._sampler.start()

    def _read(self) -> dict[int, tuple[str, float]]:
        return {pid: (_server_process_kind(pid), proc_cpu(pid)) for pid in _children(self.postmaster_pid)}

    def _sample(self) -> None:
        for pid, (kind, cpu) in self._read().items():
            if kind != "gone":
                self.last_seen[pid] = (kind, cpu)

    def _sample_until_done(self) -> None:
        while not self._done.wait(self._every):
            self._sample()

    def stop(self) -> None:
        """Stop sampling (also when a drain fails before its figures are read)."""
        self._done.set()
        self._sampler.join()

    def seconds(self) -> dict[str, float]:
        """CPU seconds per kind of process since this object was made; stops the sampling."""
        self.stop()
        self._sample()
        by_kind: dict[str, float] = {}
        for pid, (kind, cpu) in self.last_seen.items():
            by_kind[kind] = by_kind.get(kind, 0.0) + cpu - self.at_start.get(pid, (kind, 0.0))[1]
        total = tree_cpu(self.postmaster_pid) - self.total_at_start
        by_kind["not attributed"] = max(0.0, total - sum(by_kind.values()))
        return {kind: round(spent, 2) for kind, spent in sorted(by_kind.items()) if spent >= 0.005}


def tree_cpu(root_pid: int) -> float:
    """CPU seconds of a process, its live children, and its children already reaped (cutime/cstime):
    for the postmaster, every server process since start-up, including backends that have exited."""
    try:
        fields = Path(f"/proc/{root_pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    total = sum(int(fields[i]) for i in (11, 12, 13, 14)) / CLK_TCK
    return total + sum(proc_cpu(child) for child in _children(root_pid))


# --- the cluster -----------------------------------------------------------------------------------


class Cluster:
    """A throwaway PostgreSQL for the whole run, with one migrated template database to copy."""

    def __init__(self, track_nested: bool = False) -> None:
        settings = dict(BENCH_PG_SETTINGS)
        if track_nested:
            settings["pg_stat_statements.track"] = "all"
        self.local = LocalPostgres(settings)
        self.url = ""

    def start(self) -> None:
        self.url = self.local.start()
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {TEMPLATE}")
        template = self.dsn(TEMPLATE)
        schema.migrate(template)
        with psycopg.connect(template, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            conn.execute("CREATE EXTENSION IF NOT EXISTS pgstattuple")

    def stop(self) -> None:
        self.local.stop()

    def dsn(self, dbname: str) -> str:
        params = conninfo_to_dict(self.url)
        params["dbname"] = dbname
        return make_conninfo(**params)

    def new_database(self, name: str) -> str:
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
            conn.execute(f"CREATE DATABASE {name} TEMPLATE {TEMPLATE}")
        return self.dsn(name)

    def drop_database(self, name: str) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")

    @property
    def postmaster_pid(self) -> int:
        return int((self.local.data / "postmaster.pid").read_text().split()[0])

    def cpu(self) -> float:
        """CPU seconds of every server process since start-up, read while no server process exits: a
        backend that exits and is reaped between the reading of the postmaster's reaped-children time
        and of its live children counts in neither (a drain whose connection had just closed once
        read as 10 of its 300 ms)."""
        pid = self.postmaster_pid
        for _ in range(100):
            before = set(_children(pid))
            total = tree_cpu(pid)
            if set(_children(pid)) == before:
                break
        return total

    def cpu_by_kind(self) -> ServerCpuByKind:
        return ServerCpuByKind(self.postmaster_pid)

    @property
    def log_path(self) -> Path:
        return self.local.log

    def log_size(self) -> int:
        try:
            return self.log_path.stat().st_size
        except OSError:
            return 0

    def log_since(self, offset: int) -> str:
        with open(self.log_path, "rb") as fh:
            fh.seek(offset)
            return fh.read().decode(errors="replace")

    def version(self) -> str:
        with psycopg.connect(self.url) as conn:
            row = conn.execute("SHOW server_version").fetchone()
        return str(row[0]) if row else "?"


# --- the sink --------------------------------------------------------------------------------------


class Sink:
    """bench/sink.py in a process of its own."""

    def __init__(self, workdir: Path) -> None:
        self.port_file = workdir / "sink.port"
        self.port_file.unlink(missing_ok=True)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "bench.sink", "--port", "0", "--port-file", str(self.port_file)],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=open(workdir / "sink.log", "wb"),  # noqa: SIM115
        )
        deadline = time.monotonic() + 30
        while not self.port_file.exists():
            if time.monotonic() > deadline or self.process.poll() is not None:
                raise RuntimeError("the sink did not start; see sink.log")
            time.sleep(0.05)
        info = json.loads(self.port_file.read_text())
        self.port: int = info["port"]
        self.loop: str = info["loop"]

    def url(self, path: str = "/ok/hook") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def _ctl(self, path: str, method: str = "GET") -> Any:
        request = urllib.request.Request(
            self.url(path), method=method, data=b"" if method == "POST" else None
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())

    def reset(self) -> None:
        self._ctl("/_ctl/reset", "POST")

    def stats(self, fractions: tuple[float, ...] = ()) -> dict[str, Any]:
        query = ("?q=" + ",".join(str(f) for f in fractions)) if fractions else ""
        return dict(self._ctl("/_ctl/stats" + query))

    def latency(self) -> list[list[float]]:
        return list(self._ctl("/_ctl/latency"))

    def cpu(self) -> float:
        return proc_cpu(self.process.pid)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)


# --- endpoints: the one place that registers them --------------------------------------------------


# Limits that never bind in the benchmark but are still checked on every claim.
GENEROUS_LIMITS: dict[str, Any] = {
    "rate_limit_per_second": 1_000_000,
    "rate_limit_burst": 1_000_000,
    "max_in_flight": 10_000,
}


def register_endpoints(dsn: str, urls: list[str], prefix: str = "bench", **overrides: Any) -> list[int]:
    """One endpoint per URL, each with its own signing secret (bench.localworker.add_endpoints)."""
    return add_endpoints(dsn, urls, prefix, **overrides)


# --- worker processes ------------------------------------------------------------------------------


@dataclass(frozen=True)
class WorkerSettings:
    """The knobs the benchmark varies; None keeps the production default."""

    concurrency: int | None = None
    claim_batch_size: int | None = None
    finish_batch_size: int | None = None
    pool_max_size: int | None = None
    event_loop: str | None = None
    housekeeping_interval_seconds: float | None = None
    purge_budget_seconds: float | None = None
    purge_batch_size: int | None = None

    @property
    def in_flight(self) -> int:
        """Requests in flight per worker: the setting, or the worker's own default."""
        return self.concurrency or WorkerConfig().concurrency

    def describe(self) -> dict[str, Any]:
        return {
            "concurrency": self.in_flight,
            "claim_batch_size": self.claim_batch_size or "database default (100)",
            "finish_batch_size": self.finish_batch_size or "database default (100)",
            "pool_max_size": self.pool_max_size or 4,
        }

    def sections(self) -> dict[str, dict[str, Any]]:
        """The worker config's sections that these settings change."""
        sections: dict[str, dict[str, Any]] = {}
        if self.pool_max_size is not None:
            sections.setdefault("database", {})["pool_max_size"] = self.pool_max_size
        if self.concurrency is not None:
            sections.setdefault("worker", {})["concurrency"] = self.concurrency
        if self.claim_batch_size is not None:
            sections.setdefault("delivery", {})["claim_batch_size"] = self.claim_batch_size
        if self.finish_batch_size is not None:
            sections.setdefault("delivery", {})["finish_batch_size"] = self.finish_batch_size
        if self.event_loop is not None:
            sections.setdefault("worker", {})["event_loop"] = self.event_loop
        if self.housekeeping_interval_seconds is not None:
            sections.setdefault("housekeeping", {})["interval_seconds"] = self.housekeeping_interval_seconds
        if self.purge_budget_seconds is not None:
            sections.setdefault("housekeeping", {})["purge_budget_seconds"] = self.purge_budget_seconds
        if self.purge_batch_size is not None:
            sections.setdefault("housekeeping", {})["purge_batch_size"] = self.purge_batch_size
        return sections


def spawn_worker(dsn: str, workdir: Path, name: str, settings: WorkerSettings) -> WorkerProcess:
    """`python -m worker --config FILE`, exactly as it runs in production: the tests' worker process
    with production's timings (no shortened polls) and the settings."""
    return WorkerProcess(dsn, workdir, name, timings={}, **settings.sections())


# --- SQL helpers -----------------------------------------------------------------------------------


VACUUM_WORDS = ("truncat", "not yet removable", "removable cutoff")


def vacuum(dsn: str, table: str = "webhooks.alert_delivery_queue") -> list[str]:
    """VACUUM (VERBOSE) a table; returns what it said about the rows it could not remove yet (another
    session's snapshot still sees them) and about truncating the file (where it says whether a
    lock request from another session made it stop early)."""
    said: list[str] = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.add_notice_handler(lambda notice: said.extend((notice.message_primary or "").splitlines()))
        conn.execute(f"VACUUM (VERBOSE) {table}")
    return [line.strip() for line in said if any(word in line for word in VACUUM_WORDS)]


def vacuum_held_back(said: list[str]) -> bool:
    """Whether another session kept VACUUM from removing rows or from truncating the file."""
    for line in said:
        if "due to conflicting lock request" in line:
            return True
        found = re.search(r"(\d+) are dead but not yet removable", line)
        if found and int(found.group(1)) > 0:
            return True
    return False


def wait_for_autovacuum(dsn: str, limit_seconds: float) -> None:
    """Wait (at most the limit) until no autovacuum worker is busy in this database."""
    deadline = time.monotonic() + limit_seconds
    while time.monotonic() < deadline:
        [[busy]] = query(dsn, "SELECT count(*) FROM pg_stat_activity"
                                " WHERE backend_type = 'autovacuum worker' AND datname = current_database()")
        if not busy:
            return
        time.sleep(0.5)


def preload(dsn: str, endpoint_ids: list[int], rows: int) -> float:
    """Queue `rows` rows round-robin over the endpoints with one INSERT … SELECT; returns seconds."""
    started = time.monotonic()
    query(
        dsn,
        "INSERT INTO webhooks.alert_delivery_queue (webhook_id, event_type, payload)"
        f" SELECT (%s::bigint[])[1 + g %% %s], 'alert.created', {payload_sql('g')}"
        " FROM generate_series(1, %s) g",
        (endpoint_ids, len(endpoint_ids), rows),
    )
    return time.monotonic() - started


def statement_counts(dsn: str, nested: bool = False) -> list[dict[str, Any]]:
    """pg_stat_statements rows of this database since the reset: the statements clients sent (round
    trips), or with nested=True those run inside functions (only with --track-nested), by time."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(
            "SELECT query, calls, rows, total_exec_time FROM pg_stat_statements"
            " WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())"
            " AND toplevel = %s ORDER BY " + ("total_exec_time" if nested else "calls") + " DESC",
            (not nested,),
        )
        return [
            {"query": " ".join(q.split())[:120], "calls": c, "rows": r, "ms": round(t, 1)}
            for q, c, r, t in cur.fetchall()
        ]


def reset_statements(dsn: str) -> None:
    query(dsn, "SELECT pg_stat_statements_reset()")


def deadlocks(dsn: str) -> int:
    row = query(dsn, "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()")
    return int(row[0][0]) if row else 0
