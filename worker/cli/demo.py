"""The demo: one command that shows a delivery's whole life on a local database and receiver."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from aiohttp import web

from worker import schema
from worker.config import Config, DatabaseConfig, HttpConfig, LoggingConfig, SecurityConfig, WorkerConfig
from worker.daemon.worker import Worker, sender_for
from worker.encryption import KEYS_ENV, Keyring, generate_key
from worker.localpg import LocalPostgres
from worker.observability import configure_logging
from worker.rules import signing
from worker.store import database
from worker.store import deliveries as delivery_store
from worker.store import endpoints as endpoint_store
from worker.store.queue import Queue
from worker.tables import cell, print_table

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
    config = Config(
        database=DatabaseConfig(url=url),
        worker=WorkerConfig(id="demo-worker", poll_interval_seconds=0.2),
        logging=LoggingConfig(level="warning", format="console"),
        http=HttpConfig(enabled=False),
        # the receiver is on loopback, which workers refuse unless it is allowed explicitly
        security=SecurityConfig(allow_networks=["127.0.0.1/32"]),
    )
    async with database.connect(url) as conn:
        name = f"demo-receiver-{int(time.time())}"
        endpoint_id = await endpoint_store.register_endpoint(
            conn, endpoint_store.EndpointSpec(name=name, url=receiver_url, url_display=f"http://127.0.0.1:{port}",
                                          signing_secrets=(secret,)),
            keyring,
        )
        print(f"registered endpoint {endpoint_id} ({name}) → {receiver_url}")
        ids = await delivery_store.insert_sample_alerts(conn, endpoint_id, alerts, SEVERITIES)
        print(f"enqueued {len(ids)} alerts with a plain INSERT; starting a worker\n")

        worker = Worker(config, Queue.create(url, 1, 2, 10.0, "demo-worker", keyring), sender_for(config))
        task = asyncio.create_task(worker.run())
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            counts = await delivery_store.final_counts(conn, ids)
            if counts["final"] == len(ids):
                break
            await asyncio.sleep(0.2)
        worker.stop()
        await task
        await runner.cleanup()
        print()
        for title, columns, rows in await delivery_store.demo_report(conn, ids, endpoint_id):
            print(f"-- {title}")
            print_table(columns, [[cell(v) for v in r] for r in rows])
            print()
        delivered = (await delivery_store.final_counts(conn, ids))["delivered"]
    print(f"\n{delivered} of {len(ids)} alerts delivered")
    return 0 if delivered == len(ids) else 1
