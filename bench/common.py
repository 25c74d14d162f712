"""Shared plumbing for the benchmark: the cluster, the sink process, endpoints, worker processes, CPU.

Two functions are deliberately the only places that know how endpoints are registered and how a
worker process is configured (`register_endpoints`, `worker_setup`), so that changes to either (an
encryption key, network allow-lists) are made once.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import yaml
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from worker import schema, signing
from worker.config import WorkerConfig
from worker.delivery import display_url
from worker.destinations import DestinationPolicy
from worker.encryption import KEYS_ENV, Keyring, generate_key
from worker.localpg import LocalPostgres, login_role
from worker.operations import EndpointSpec, register_endpoint

ROOT = Path(__file__).resolve().parent.parent
# As in production: endpoints sealed with a key every worker holds, workers logged in as a member of
# webhooks_worker, and the sink (on loopback) allowed explicitly as a destination.
BENCH_KEYS = generate_key()
BENCH_KEYRING = Keyring.parse(BENCH_KEYS, KEYS_ENV)
ALLOW_LOOPBACK = ["127.0.0.1/32"]
LOOPBACK_POLICY = DestinationPolicy.from_settings(True, ALLOW_LOOPBACK, False)
WORKER_LOGIN = "bench_worker"


def worker_dsn(dsn: str) -> str:
    """A login role in webhooks_worker only (created if missing), as workers run in production."""
    return login_role(dsn, WORKER_LOGIN, "webhooks_worker", "bench")
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


# --- processes and CPU -----------------------------------------------------------------------------


def proc_cpu(pid: int) -> float:
    """CPU seconds (user + system) of a live process; 0 when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


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
        return tree_cpu(self.postmaster_pid)

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
    """Register one endpoint per URL through the Python API (worker.operations.register_endpoint), each
    with its own signing secret; overrides are EndpointSpec fields. Returns their ids in order."""
    ids = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        for i, url in enumerate(urls):
            ids.append(
                register_endpoint(
                    conn,
                    EndpointSpec(
                        name=f"{prefix}-{i + 1}",
                        url=url,
                        url_display=display_url(url),
                        signing_secrets=(signing.generate_secret(),),
                        **overrides,
                    ),
                    BENCH_KEYRING,
                )
            )
    return ids


# --- worker processes: the one place that configures them ------------------------------------------


@dataclass(frozen=True)
class WorkerSettings:
    """The knobs the benchmark varies; None keeps the production default."""

    concurrency: int | None = None
    claim_batch_size: int | None = None
    finish_batch_size: int | None = None
    pool_max_size: int | None = None

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


def worker_setup(dsn: str, name: str, settings: WorkerSettings) -> tuple[dict[str, Any], dict[str, str]]:
    """The YAML config and the environment of one `webhook-worker` process: production defaults,
    except a unique id, probes on a free port of 127.0.0.1 and JSON logs, plus the settings."""
    config: dict[str, Any] = {
        "database": {"url": worker_dsn(dsn)},
        "worker": {"id": name},
        "http": {"host": "127.0.0.1", "port": 0},
        "logging": {"level": "info", "format": "json"},
        "security": {"allow_networks": ALLOW_LOOPBACK},
    }
    if settings.pool_max_size is not None:
        config["database"]["pool_max_size"] = settings.pool_max_size
    if settings.concurrency is not None:
        config["worker"]["concurrency"] = settings.concurrency
    delivery = {}
    if settings.claim_batch_size is not None:
        delivery["claim_batch_size"] = settings.claim_batch_size
    if settings.finish_batch_size is not None:
        delivery["finish_batch_size"] = settings.finish_batch_size
    if delivery:
        config["delivery"] = delivery
    env = {k: v for k, v in os.environ.items() if not k.startswith("WEBHOOK_WORKER_")}
    env.pop("DATABASE_URL", None)
    env[KEYS_ENV] = BENCH_KEYS
    return config, env


@dataclass
class WorkerProcess:
    name: str
    process: subprocess.Popen[bytes]
    log_path: Path
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def pid(self) -> int:
        return self.process.pid

    def cpu(self) -> float:
        return proc_cpu(self.process.pid)

    def started(self) -> bool:
        try:
            text = self.log_path.read_text()
        except OSError:
            return False
        return '"worker started"' in text

    def stop(self, timeout: float = 60.0) -> int | None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait(10)


def spawn_worker(dsn: str, workdir: Path, name: str, settings: WorkerSettings) -> WorkerProcess:
    """`python -m worker --config FILE`, exactly as it runs in production."""
    config, env = worker_setup(dsn, name, settings)
    config_path = workdir / f"{name}.yaml"
    config_path.write_text(yaml.safe_dump(config))
    log_path = workdir / f"{name}.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "worker", "--config", str(config_path)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=ROOT,
        )
    return WorkerProcess(name, process, log_path)


def wait_started(workers: list[WorkerProcess], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not all(w.started() for w in workers):
        for w in workers:
            if w.process.poll() is not None:
                raise RuntimeError(f"{w.name} exited with {w.process.returncode}; see {w.log_path}")
        if time.monotonic() > deadline:
            raise RuntimeError("workers did not start in time")
        time.sleep(0.05)


# --- SQL helpers -----------------------------------------------------------------------------------


def execute(dsn: str, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(sql, params)
        return cur.fetchall() if cur.description is not None else []


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
        [[busy]] = execute(dsn, "SELECT count(*) FROM pg_stat_activity"
                                " WHERE backend_type = 'autovacuum worker' AND datname = current_database()")
        if not busy:
            return
        time.sleep(0.5)


def preload(dsn: str, endpoint_ids: list[int], rows: int) -> float:
    """Queue `rows` rows round-robin over the endpoints with one INSERT … SELECT; returns seconds."""
    started = time.monotonic()
    execute(
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
    execute(dsn, "SELECT pg_stat_statements_reset()")


def deadlocks(dsn: str) -> int:
    row = execute(dsn, "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()")
    return int(row[0][0]) if row else 0
