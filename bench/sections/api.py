"""Section `api`, publishing over HTTP: one real `webhook-worker api` process, concurrent aiohttp
clients publishing ~1 KB messages one at a time and in batches, beside a direct-SQL producer inserting
the same rows, in alternating rounds; the API's and PostgreSQL's CPU, statements and round trips per
message."""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import aiohttp
import psycopg
import yaml
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from bench.common import (
    machine_load,
    median_of,
    payload_json,
    register_endpoints,
    reset_statements,
    statement_counts,
)
from bench.localworker import LOGIN_PASSWORD, LOOPBACK, ROOT, eventually, proc_cpu, stored, worker_env
from bench.section import MEDIAN_RUNS, Context, Figures, Section, Target, get, log, target, three
from bench.sections.producer import insert_rate
from worker.localpg import login_role
from worker.store import tokens as token_store
from worker.store.database import API_GROUPS

API_LOGIN = "webhooks_bench_api"
EVENT_TYPE = "alert.created"
# The targets: publishing over HTTP costs little more than publishing over SQL.
API_CPU_MS_TARGET = 0.5
PG_CPU_RATIO_TARGET = 2.0
ROUND_TRIPS_TARGET = 2.0
# How long the round-trip counter watches an idle API, for its own background round trips.
IDLE_SECONDS = 3.0
# With --api-schema, the published type's catalogue entry: a schema every bench payload follows, so
# each publish is checked against it (bench.common.payload_json).
PAYLOAD_SCHEMA = {
    "type": "object", "required": ["alert_id", "title", "severity"],
    "properties": {"alert_id": {"type": "integer", "minimum": 0},
                   "title": {"type": "string", "maxLength": 200},
                   "severity": {"enum": ["info", "warning", "critical"]},
                   "source": {"type": "string", "pattern": "^[a-z]+$"}, "pad": {"type": "string"}},
}


def options(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--api-clients", type=int, default=20,
                       help="concurrent single-message publishers (20)")
    group.add_argument("--api-seconds", type=float, default=10.0, help="time cap per side and round (10 s)")
    group.add_argument("--api-publishes", type=int, default=20_000,
                       help="messages per side and round, at most (20,000)")
    group.add_argument("--api-batch-size", type=int, default=100, help="messages per batch publish (100)")
    group.add_argument("--api-batch-clients", type=int, default=4, help="concurrent batch publishers (4)")
    group.add_argument("--api-rt-publishes", type=int, default=300,
                       help="publishes through the round-trip counter, after the timed rounds (300)")
    group.add_argument("--api-schema", action="store_true",
                       help="catalogue the published type with a JSON Schema, so every publish is checked")
    group.add_argument("--api-baseline", metavar="DIR", type=Path,
                       help="a checkout of another version (e.g. `git archive` of an earlier commit): its "
                            "API runs beside this one's on the same database, the rounds alternating, for "
                            "figures side by side in one run")


class ApiProcess:
    """`python -m worker api --config FILE` (what `webhook-worker api` runs), logged in as a login of
    its own that holds only the API's group roles, as docs/security.md deploys it."""

    def __init__(self, dsn: str, workdir: Path, name: str, source: Path = ROOT) -> None:
        config = {
            "database": {"url": dsn},
            "api": {"host": "127.0.0.1", "port": 0, "metrics_port": 0},
            "logging": {"level": "info", "format": "json"},
            "security": {"allow_networks": LOOPBACK},
        }
        self.config_path = workdir / f"{name}.yaml"
        self.config_path.write_text(yaml.safe_dump(config))
        self.log_path = workdir / f"{name}.log"
        with open(self.log_path, "wb") as out:
            self.process = subprocess.Popen(
                # `-m` imports the worker package of its working directory: this checkout, or another
                [sys.executable, "-m", "worker", "api", "--config", str(self.config_path)],
                stdout=out, stderr=subprocess.STDOUT, env=worker_env(), cwd=source)
        self.port = eventually(self._port, timeout=120, message="api listening")

    def _port(self) -> int | None:
        if self.process.poll() is not None:
            raise RuntimeError(f"the api exited; see {self.log_path}")
        for line in self.log_path.read_text().splitlines():
            if '"api listening"' in line:
                return int(json.loads(line)["port"])
        return None

    def cpu(self) -> float:
        """CPU seconds of the API process and of the processes it started (its schema checks): those
        still running, and those it has reaped."""
        pid = self.process.pid
        try:
            reaped = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[13:15]
            children = [int(child) for task in Path(f"/proc/{pid}/task").iterdir()
                        for child in (task / "children").read_text().split()]
        except OSError:
            return 0.0
        return (proc_cpu(pid) + sum(proc_cpu(child) for child in children)
                + sum(int(ticks) for ticks in reaped) / os.sysconf("SC_CLK_TCK"))

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)


# PostgreSQL's protocol: a client's first messages carry no type byte (an SSL or GSS encryption
# request, then the startup message, protocol 3.0); every later one does.
_STARTUP_CODE = 196608
# The messages with which a client asks for the answers to what it sent so far, and waits for them:
# Sync (the end of an extended-protocol exchange, or of a pipeline's batch) and Flush (a pipeline's
# results so far); a simple-protocol Query is a statement and its wait at once.
_ASKS = frozenset(b"SH")
_QUERY = ord("Q")


class RoundTripCounter:
    """A TCP relay on 127.0.0.1 in front of PostgreSQL that counts round trips: each time a client
    asks for the answers to what it sent (Sync or Flush, after statements; a Sync and a Flush in a
    row are one wait) and each simple-protocol Query. Statements pipelined between two waits are one
    round trip; a statement sent and waited for alone is one. Used only in an untimed pass: it adds
    its own hop."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.round_trips = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._relay, "127.0.0.1", 0), self._loop).result(10)
        self.port: int = self._server.sockets[0].getsockname()[1]

    def _count(self, buffer: bytearray, state: dict[str, bool]) -> None:
        """Consume the whole messages in `buffer`, counting the waits. `state`: whether the startup is
        over (typed), whether statements were sent since the last wait (sent)."""
        while True:
            if not state["typed"]:
                if len(buffer) < 8:
                    return
                length = int.from_bytes(buffer[:4], "big")
                if len(buffer) < length:
                    return
                state["typed"] = int.from_bytes(buffer[4:8], "big") == _STARTUP_CODE
            else:
                if len(buffer) < 5:
                    return
                length = 1 + int.from_bytes(buffer[1:5], "big")
                if len(buffer) < length:
                    return
                kind = buffer[0]
                if kind == _QUERY or (kind in _ASKS and state["sent"]):
                    self.round_trips += 1
                state["sent"] = kind not in _ASKS and kind != _QUERY
            del buffer[:length]

    async def _relay(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        server_r, server_w = await asyncio.open_connection(*self.target)
        pending = bytearray()
        state = {"typed": False, "sent": False}

        async def pump(r: asyncio.StreamReader, w: asyncio.StreamWriter, from_client: bool) -> None:
            try:
                while data := await r.read(65536):
                    if from_client:
                        pending.extend(data)
                        self._count(pending, state)
                    w.write(data)
                    await w.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                w.close()

        await asyncio.gather(pump(client_r, server_w, True), pump(server_r, client_w, False))

    def stop(self) -> None:
        async def close() -> None:
            self._server.close()
        asyncio.run_coroutine_threadsafe(close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


def _message(i: int, label: str) -> dict[str, Any]:
    # the same row as the direct-SQL producer's: one subscriber, ~1 KB of payload; a key of its own
    return {"event_type": EVENT_TYPE, "payload": json.loads(payload_json(i)),
            "idempotency_key": f"bench-{label}-{i}"}


async def _publishers(port: int, token: str, clients: int, batch_size: int, messages: int, seconds: float,
                      label: str) -> dict[str, Any]:
    """`clients` concurrent publishers, each posting one message (batch_size 0) or a batch at a time
    until `messages` are sent or `seconds` have passed; every answer must be 202."""
    url = f"http://127.0.0.1:{port}/v1/messages" + ("/batch" if batch_size else "")
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    per_request = batch_size or 1
    latencies: list[float] = []
    sent = 0
    failures: dict[int, int] = {}
    started = time.monotonic()
    deadline = started + seconds

    async def client(session: aiohttp.ClientSession) -> None:
        nonlocal sent
        while sent + per_request <= messages and time.monotonic() < deadline:
            first = sent
            sent += per_request
            if batch_size:
                body = json.dumps({"messages": [_message(first + k, label) for k in range(batch_size)]})
            else:
                body = json.dumps(_message(first, label))
            t0 = time.perf_counter()
            async with session.post(url, data=body, headers=headers) as response:
                await response.read()
                if response.status != 202:
                    failures[response.status] = failures.get(response.status, 0) + 1
            latencies.append(time.perf_counter() - t0)

    connector = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(connector=connector) as session:
        await asyncio.gather(*(client(session) for _ in range(clients)))
    elapsed = time.monotonic() - started
    requests = len(latencies)
    quantiles = statistics.quantiles(latencies, n=100) if requests >= 2 else [float("nan")] * 99
    return {"requests": requests, "messages": requests * per_request, "seconds": round(elapsed, 2),
            "failures": failures, "p50_ms": round(quantiles[49] * 1000, 2),
            "p99_ms": round(quantiles[98] * 1000, 2)}


def _api_side(ctx: Context, dsn: str, api: ApiProcess, token: str, batch_size: int,
              label: str) -> dict[str, Any]:
    """One timed side: the API's CPU (its /proc), the cluster's CPU and the statements clients sent,
    per message published."""
    args = ctx.args
    clients = args.api_batch_clients if batch_size else args.api_clients
    reset_statements(dsn)
    api0, pg0, own0 = api.cpu(), ctx.cluster.cpu(), time.process_time()
    out = asyncio.run(_publishers(api.port, token, clients, batch_size, args.api_publishes, args.api_seconds,
                                  label))
    api_cpu, pg_cpu, own = api.cpu() - api0, ctx.cluster.cpu() - pg0, time.process_time() - own0
    statements = [s for s in statement_counts(dsn) if "pg_stat_statements" not in s["query"]]
    n = max(1, out["messages"])
    out.update({
        "clients": clients,
        "batch_size": batch_size or 1,
        "per_second": round(out["messages"] / out["seconds"], 1),
        "api_cpu_ms_per_message": round(api_cpu * 1000 / n, 4),
        "postgres_cpu_ms_per_message": round(pg_cpu * 1000 / n, 4),
        "client_cpu_ms_per_message": round(own * 1000 / n, 4),
        "statements_per_message": round(sum(s["calls"] for s in statements) / n, 3),
        "statements": statements[:8],
    })
    return out


def _sql_side(ctx: Context, dsn: str, endpoint_id: int, label: str) -> dict[str, Any]:
    """The `producer` section's direct insert of the same row (one per transaction, one connection),
    with the cluster's CPU per insert."""
    sql = ("INSERT INTO webhooks.alert_delivery_queue (webhook_id, event_type, payload, idempotency_key)"
           " VALUES (%s, %s, %s::jsonb, %s)")
    keys = itertools.count()  # the warm-up's inserts too
    pg0 = ctx.cluster.cpu()
    out = insert_rate(dsn, sql,
                      lambda i: (endpoint_id, EVENT_TYPE, payload_json(i), f"sql-{label}-{next(keys)}"),
                      ctx.args.api_publishes, ctx.args.api_seconds)
    out["postgres_cpu_ms_per_message"] = round((ctx.cluster.cpu() - pg0) * 1000 / max(1, out["inserts"]), 4)
    return out


def _round_trips(ctx: Context, dsn: str, token: str, batch_size: int) -> dict[str, Any]:
    """Round trips between the API and PostgreSQL per message, counted by a relay (RoundTripCounter) in
    front of the cluster, over a second API process that connects through it; after a warm-up, so
    that connecting is not counted."""
    params = conninfo_to_dict(dsn)
    relay = RoundTripCounter(str(params.get("host", "127.0.0.1")), int(params.get("port", 5432)))
    api = ApiProcess(make_conninfo(dsn, host="127.0.0.1", port=str(relay.port)), ctx.workdir,
                     f"api-rt-{batch_size}")
    try:
        n = ctx.args.api_rt_publishes
        asyncio.run(_publishers(api.port, token, 4, batch_size, 40 * (batch_size or 1), 60,
                                f"rtw{batch_size}"))
        # the API's own round trips while no one publishes (the bulk replay runner looks for work
        # every second): subtracted, at the same rate, from those of the publishes
        idle0, idle_started = relay.round_trips, time.monotonic()
        time.sleep(IDLE_SECONDS)
        idle_rate = (relay.round_trips - idle0) / (time.monotonic() - idle_started)
        trips0, started = relay.round_trips, time.monotonic()
        out = asyncio.run(_publishers(api.port, token, 4, batch_size, n * (batch_size or 1), 120,
                                      f"rt{batch_size}"))
        raw = relay.round_trips - trips0
        background = idle_rate * (time.monotonic() - started)
    finally:
        api.stop()
        relay.stop()
    trips = max(0.0, raw - background)
    return {"messages": out["messages"], "requests": out["requests"], "round_trips_counted": raw,
            "background_round_trips": round(background, 1), "round_trips": round(trips, 1),
            "per_message": round(trips / max(1, out["messages"]), 3),
            "per_request": round(trips / max(1, out["requests"]), 3)}


def run(ctx: Context) -> dict[str, Any]:
    dsn = ctx.cluster.new_database("bench_api")
    (endpoint_id,) = register_endpoints(dsn, [ctx.sink.url("/ok/api")])
    token = stored(dsn, token_store.create, "bench-producer", "producer", None)
    with psycopg.connect(dsn, autocommit=True) as conn:
        if ctx.args.api_schema:
            conn.execute("SELECT webhooks.upsert_event_type(%s, '', %s::jsonb)",
                         (EVENT_TYPE, json.dumps(PAYLOAD_SCHEMA)))
    api_dsn = login_role(dsn, API_LOGIN, API_GROUPS, LOGIN_PASSWORD, inherit=False)
    baseline_dir: Path | None = ctx.args.api_baseline
    out: dict[str, Any] = {"load_average_before": machine_load(), "clients": ctx.args.api_clients,
                           "batch_size": ctx.args.api_batch_size, "batch_clients": ctx.args.api_batch_clients,
                           "schema": PAYLOAD_SCHEMA if ctx.args.api_schema else None,
                           "baseline": None if baseline_dir is None else str(baseline_dir)}
    apis = {"": ApiProcess(api_dsn, ctx.workdir, "api-bench")}
    if baseline_dir is not None:
        apis["baseline_"] = ApiProcess(api_dsn, ctx.workdir, "api-bench-baseline", source=baseline_dir)
    runs: dict[str, list[dict[str, Any]]] = {"sql": [], **{f"{which}{side}": [] for which in apis
                                                           for side in ("single", "batch")}}
    try:
        for which, api in apis.items():
            asyncio.run(_publishers(api.port, token, ctx.args.api_clients, 0, 200, 30, f"warm{which}"))
        for i in range(MEDIAN_RUNS):
            log(f"api: round {i + 1} of {MEDIAN_RUNS}: direct SQL insert, API publish, API batch publish"
                + (" (this checkout's API, then the baseline's)" if baseline_dir is not None else ""))
            runs["sql"].append(_sql_side(ctx, dsn, endpoint_id, f"r{i}"))
            for which, api in apis.items():
                runs[f"{which}single"].append(_api_side(ctx, dsn, api, token, 0, f"{which}s{i}"))
                runs[f"{which}batch"].append(_api_side(ctx, dsn, api, token, ctx.args.api_batch_size,
                                                       f"{which}b{i}"))
    finally:
        for api in apis.values():
            api.stop()
    out["runs"] = runs
    out["api_process_log"] = str(apis[""].log_path)
    sql_cpu = [r["postgres_cpu_ms_per_message"] for r in runs["sql"]]
    out["sql"] = {"per_second": median_of([r["per_second"] for r in runs["sql"]]),
                  "postgres_cpu_ms_per_message": median_of(sql_cpu)}
    for side in [f"{which}{side}" for which in apis for side in ("single", "batch")]:
        rs = runs[side]
        out[side] = {key: median_of([r[key] for r in rs])
                     for key in ("per_second", "p50_ms", "p99_ms", "api_cpu_ms_per_message",
                                 "postgres_cpu_ms_per_message", "statements_per_message")}
        out[side]["postgres_cpu_over_sql"] = median_of(
            [r["postgres_cpu_ms_per_message"] / max(1e-9, s) for r, s in zip(rs, sql_cpu, strict=True)])
        out[side]["failures"] = [r["failures"] for r in rs]
    log("api: round trips per publish, through a counting relay")
    out["round_trips"] = {"single": _round_trips(ctx, dsn, token, 0),
                          "batch": _round_trips(ctx, dsn, token, ctx.args.api_batch_size)}
    out["load_average_after"] = machine_load()
    if not ctx.args.keep_databases:
        ctx.cluster.drop_database("bench_api")
    return out


def figures(a: dict[str, Any]) -> Figures:
    lines: Figures = [("api: direct SQL insert (the producer's), one connection",
                       f"{three(a['sql']['per_second'], fmt='{:,.0f}')} inserts/s; PostgreSQL "
                       f"{three(a['sql']['postgres_cpu_ms_per_message'], fmt='{:.3f}')} ms CPU/insert")]
    sides = (("single", "POST /v1/messages"), ("batch", f"POST /v1/messages/batch ×{a['batch_size']}"))
    for side, what in sides:
        s, rt = a[side], a["round_trips"][side]
        lines.append((f"api: {what}, {a['clients'] if side == 'single' else a['batch_clients']} clients",
                      f"{three(s['per_second'], fmt='{:,.0f}')} messages/s; request p50 "
                      f"{three(s['p50_ms'], fmt='{:.1f}')} ms, p99 {three(s['p99_ms'], fmt='{:.1f}')} ms"))
        lines.append((f"api: {what}, per message",
                      f"API CPU {three(s['api_cpu_ms_per_message'], fmt='{:.3f}')} ms; PostgreSQL CPU "
                      f"{three(s['postgres_cpu_ms_per_message'], fmt='{:.3f}')} ms "
                      f"({three(s['postgres_cpu_over_sql'])} × the direct insert's); "
                      f"{three(s['statements_per_message'], fmt='{:.3f}')} statements, "
                      f"{rt['per_message']} round trips ({rt['per_request']} per request)"))
        if f"baseline_{side}" in a:
            b = a[f"baseline_{side}"]
            lines.append((f"api: {what}, per message, the baseline's API ({a['baseline']})",
                          f"API CPU {three(b['api_cpu_ms_per_message'], fmt='{:.3f}')} ms; PostgreSQL CPU "
                          f"{three(b['postgres_cpu_ms_per_message'], fmt='{:.3f}')} ms; "
                          f"{three(b['per_second'], fmt='{:,.0f}')} messages/s"))
    if a.get("schema") is not None:
        lines.append(("api: every publish checked against its type's JSON Schema (--api-schema)", "yes"))
    lines.append(("api: load average before, after",
                  f"{a['load_average_before']}, {a['load_average_after']}"))
    return lines


def targets(results: dict[str, Any], _args: argparse.Namespace) -> list[Target]:
    rows: list[Target] = []
    for side in ("single", "batch"):
        cpu = get(results, "api", side, "api_cpu_ms_per_message")
        ratio = get(results, "api", side, "postgres_cpu_over_sql")
        trips = get(results, "api", "round_trips", side, "per_message")
        rows += [
            target(f"api {side}: API CPU per message", None if cpu is None else three(cpu, fmt="{:.3f}"),
                   f"≤ {API_CPU_MS_TARGET} ms", None if cpu is None else cpu["median"] <= API_CPU_MS_TARGET),
            target(f"api {side}: PostgreSQL CPU per message vs direct insert",
                   None if ratio is None else three(ratio), f"≤ {PG_CPU_RATIO_TARGET}×",
                   None if ratio is None else ratio["median"] <= PG_CPU_RATIO_TARGET),
            target(f"api {side}: round trips per message", trips, f"≤ {ROUND_TRIPS_TARGET:g}",
                   None if trips is None else trips <= ROUND_TRIPS_TARGET),
        ]
    return rows


SECTION = Section("api", run, options=options, figures=figures, targets=targets,
                  quick={"api_clients": 4, "api_seconds": 1.0, "api_publishes": 200, "api_batch_size": 20,
                         "api_batch_clients": 2, "api_rt_publishes": 20})
