"""Section `messages` (not in the default run): reading the message history over HTTP with many
messages stored. `--messages-stored` delivered messages (one delivery each, ~1 KB payloads) are
loaded, then one real `webhook-worker api` process answers `GET /v1/messages` pages of
`--messages-page` messages (the first, one deep in the history, one filtered by event type) and, for
comparison, `GET /v1/deliveries` of the same size, each `--messages-repeats` times in turn: the
median time per request as the client sees it, with the load average."""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Iterator
from typing import Any

import aiohttp

from bench.common import machine_load, payload_sql, register_endpoints
from bench.localworker import LOGIN_PASSWORD, query, stored
from bench.section import Context, Figures, Section, Target, get, log, target
from bench.sections.api import API_LOGIN, ApiProcess
from worker.localpg import login_role
from worker.store import tokens as token_store
from worker.store.database import API_GROUPS

PAGE_MS_TARGET = 50.0


def options(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--messages-stored", type=int, default=1_000_000,
                       help="messages section: delivered messages stored (1,000,000)")
    group.add_argument("--messages-page", type=int, default=1000, help="messages section: page size (1,000)")
    group.add_argument("--messages-repeats", type=int, default=7,
                       help="messages section: requests of each kind, in turn (7)")


def load(dsn: str, endpoint_id: int, count: int) -> float:
    """`count` delivered rows, each its own message (the queue's insert trigger makes the messages);
    every tenth of another event type, for the filtered page."""
    started = time.monotonic()
    query(
        dsn,
        "INSERT INTO webhooks.alert_delivery_queue (webhook_id, event_type, payload, status, attempts,"
        " delivered_at, last_http_status)"
        " SELECT %s, CASE WHEN g %% 10 = 0 THEN 'alert.resolved' ELSE 'alert.created' END,"
        f" {payload_sql('g')}, 'delivered', 1, now(), 200 FROM generate_series(1, %s) g",
        (endpoint_id, count),
    )
    query(dsn, "ANALYZE webhooks.alert_delivery_queue")
    query(dsn, "ANALYZE webhooks.messages")
    return time.monotonic() - started


async def _timed(port: int, token: str, paths: dict[str, str], repeats: int) -> dict[str, list[float]]:
    took: dict[str, list[float]] = {name: [] for name in paths}
    headers = {"Authorization": f"Bearer {token}"}
    async with aiohttp.ClientSession(headers=headers) as session:
        for _ in range(repeats):
            for name, path in paths.items():
                started = time.perf_counter()
                async with session.get(f"http://127.0.0.1:{port}{path}") as response:
                    body = await response.json()
                    if response.status != 200:
                        raise RuntimeError(f"GET {path}: {response.status} {body}")
                took[name].append((time.perf_counter() - started) * 1000)
    return took


def run(ctx: Context) -> dict[str, Any]:
    a = ctx.args
    name = "bench_messages"
    dsn = ctx.cluster.new_database(name)
    (endpoint_id,) = register_endpoints(dsn, [ctx.sink.url("/ok/messages")])
    log(f"{name}: loading {a.messages_stored:,} delivered messages")
    load_s = load(dsn, endpoint_id, a.messages_stored)
    token = stored(dsn, token_store.create, "bench-reader", "reader", None)
    [[middle]] = query(dsn, "SELECT message_id FROM webhooks.messages ORDER BY message_id"
                            " OFFSET %s LIMIT 1", (a.messages_stored // 2,))
    page = a.messages_page
    paths = {
        "messages, first page": f"/v1/messages?limit={page}",
        "messages, a page half way back": f"/v1/messages?limit={page}&cursor={middle}",
        "messages, first page of one event type": f"/v1/messages?limit={page}&event_type=alert.resolved",
        "deliveries, first page": f"/v1/deliveries?limit={page}",
    }
    api_dsn = login_role(dsn, API_LOGIN, API_GROUPS, LOGIN_PASSWORD, inherit=False)
    out: dict[str, Any] = {"stored": a.messages_stored, "page": page, "load_seconds": round(load_s, 1),
                           "load_average_before": machine_load()}
    api = ApiProcess(api_dsn, ctx.workdir, "api-messages")
    try:
        asyncio.run(_timed(api.port, token, paths, 1))  # warm: connections, plans
        took = asyncio.run(_timed(api.port, token, paths, a.messages_repeats))
    finally:
        api.stop()
    out["load_average_after"] = machine_load()
    out["ms"] = {name: {"median": round(statistics.median(values), 1),
                        "values": [round(v, 1) for v in values]} for name, values in took.items()}
    if not a.keep_databases:
        ctx.cluster.drop_database(name)
    return out


def figures(r: dict[str, Any]) -> Figures:
    lines: Figures = [(f"messages: {r['stored']:,} stored, pages of {r['page']:,}",
                       f"load average {r['load_average_before']} -> {r['load_average_after']}")]
    for kind, m in r["ms"].items():
        lines.append((f"   {kind}", f"median {m['median']} ms of {', '.join(str(v) for v in m['values'])}"))
    return lines


def targets(results: dict[str, Any], _args: argparse.Namespace) -> Iterator[Target]:
    first = get(results, "messages", "ms", "messages, first page")
    if first is not None:
        stored, page = get(results, "messages", "stored"), get(results, "messages", "page")
        yield target(f"GET /v1/messages, a page of {page:,} with {stored:,} stored", f"{first['median']} ms",
                     f"<= {PAGE_MS_TARGET:.0f} ms", first["median"] <= PAGE_MS_TARGET)


SECTION = Section("messages", run, options=options, figures=figures, targets=targets,
                  quick={"messages_stored": 3000, "messages_page": 100, "messages_repeats": 2}, default=False)
