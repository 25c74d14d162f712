"""The demo: one command that shows a delivery's whole life on a local database and receiver."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import psycopg
from aiohttp import web

from worker import schema, signing
from worker.config import Config, DatabaseConfig, HttpConfig, LoggingConfig, SecurityConfig, WorkerConfig
from worker.daemon import Worker, sender_for
from worker.encryption import KEYS_ENV, Keyring, generate_key
from worker.localpg import LocalPostgres
from worker.observability import configure_logging
from worker.queue import EndpointSpec, Queue, register_endpoint

SEVERITIES = ("critical", "warning", "info")


def run_demo(alerts: int = 5) -> int:
    local = None
    url = os.environ.get("DATABASE_URL")
    if not url:
        local = LocalPostgres()
        url = local.start()
        print(f"started a throwaway PostgreSQL on 127.0.0.1:{local.port} (removed afterwards)")
    try:
        applied = schema.migrate(url)
        print(f"migrated: {len(applied)} migrations applied, schema version {schema.latest_version()}")
        return asyncio.run(_demo(url, alerts))
    finally:
        if local is not None:
            local.stop()


async def _demo(url: str, alerts: int) -> int:
    configure_logging("warning", "console")
    secret = signing.generate_secret()
    received: list[dict[str, Any]] = []
    flaky_left = {"count": 1}

    async def receive(request: web.Request) -> web.Response:
        body = await request.read()
        signing.verify(secret, dict(request.headers), body)  # raises if the signature is wrong
        if flaky_left["count"] > 0 and request.headers["webhook-attempt"] == "1":
            flaky_left["count"] -= 1
            print(f"  receiver: answering 503 to delivery {request.headers['webhook-delivery-id']}"
                  " to show a retry")
            return web.Response(status=503)
        received.append(dict(request.headers))
        print(f"  receiver: got {request.headers['webhook-event-type']} "
              f"delivery {request.headers['webhook-delivery-id']} "
              f"attempt {request.headers['webhook-attempt']}, signature verified")
        return web.Response(status=204)

    app = web.Application()
    app.router.add_post("/hooks/demo", receive)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    receiver_url = f"http://127.0.0.1:{port}/hooks/demo"

    # The demo's own key unless one is set: the URL and secret are stored sealed with it.
    keyring = Keyring.parse(os.environ.get(KEYS_ENV) or generate_key(), KEYS_ENV)
    with psycopg.connect(url, autocommit=True) as conn:
        name = f"demo-receiver-{int(time.time())}"
        endpoint_id = register_endpoint(
            conn, EndpointSpec(name=name, url=receiver_url, url_display=f"http://127.0.0.1:{port}",
                               signing_secrets=(secret,)),
            keyring,
        )
        print(f"registered endpoint {endpoint_id} ({name}) → {receiver_url}")
        ids = [
            row[0]
            for row in conn.execute(
                "INSERT INTO webhooks.alert_delivery_queue (webhook_id, event_type, payload, source_ref)"
                " SELECT %s, 'alert.created',"
                "        jsonb_build_object('alert_id', n, 'title', 'Disk almost full on db-' || n,"
                "                           'severity', (%s::text[])[1 + n %% 3]),"
                "        'alerts:' || n"
                " FROM generate_series(1, %s) AS n RETURNING delivery_id",
                (endpoint_id, list(SEVERITIES), alerts),
            ).fetchall()
        ]
    print(f"enqueued {len(ids)} alerts with a plain INSERT; starting a worker\n")

    config = Config(
        database=DatabaseConfig(url=url),
        worker=WorkerConfig(id="demo-worker", poll_interval_seconds=0.2),
        logging=LoggingConfig(level="warning", format="console"),
        http=HttpConfig(enabled=False),
        # the receiver is on loopback, which workers refuse unless it is allowed explicitly
        security=SecurityConfig(allow_networks=["127.0.0.1/32"]),
    )
    worker = Worker(config, Queue.create(url, 1, 2, 10.0, "demo-worker", keyring), sender_for(config))
    task = asyncio.create_task(worker.run())
    deadline = time.monotonic() + 60
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as aconn:
        while time.monotonic() < deadline:
            cur = await aconn.execute(
                "SELECT count(*) FROM webhooks.alert_delivery_queue"
                " WHERE delivery_id = ANY(%s) AND status IN ('delivered', 'dead_letter')",
                (ids,),
            )
            row = await cur.fetchone()
            if row is not None and row[0] == len(ids):
                break
            await asyncio.sleep(0.2)
        worker.stop()
        await task
        await runner.cleanup()
        print()
        await _print(aconn, "webhooks.alert_delivery_queue",
                     "SELECT delivery_id, status, attempts, event_type, idempotency_key, delivered_at"
                     " FROM webhooks.alert_delivery_queue WHERE delivery_id = ANY(%s) ORDER BY 1", ids)
        await _print(aconn, "webhooks.alert_delivery_log (the audit log)",
                     "SELECT delivery_id, attempt, outcome, failure_category, http_status, latency_ms,"
                     " worker_id FROM webhooks.alert_delivery_log WHERE delivery_id = ANY(%s)"
                     " ORDER BY log_id", ids)
        await _print(aconn, "webhooks.webhook_health_metrics",
                     "SELECT webhook_id, total_attempts, successes, failures, health_status,"
                     " round(avg_latency_ms::numeric, 1) AS avg_latency_ms"
                     " FROM webhooks.webhook_health_metrics WHERE webhook_id = %s", endpoint_id)
        cur = await aconn.execute(
            "SELECT count(*) FROM webhooks.alert_delivery_queue WHERE delivery_id = ANY(%s)"
            " AND status = 'delivered'", (ids,))
        delivered = (await cur.fetchone() or [0])[0]
    print(f"\n{delivered} of {len(ids)} alerts delivered")
    return 0 if delivered == len(ids) else 1


async def _print(conn: psycopg.AsyncConnection[Any], title: str, query: str, param: Any) -> None:
    from worker.cli import print_table

    cur = await conn.execute(query, (param,))
    rows = await cur.fetchall()
    columns = [d.name for d in cur.description or []]
    print(f"-- {title}")
    print_table(columns, [["-" if v is None else str(v) for v in r] for r in rows])
    print()


