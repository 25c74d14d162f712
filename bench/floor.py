"""The latency floor: what a notification-driven delivery costs with no claim at all.

A LISTEN client on the queue's channel that, on each notification, reads the rows inserted since the
last one (by primary key: no lease, no limits, no audit) and POSTs each to the sink with a bare
aiohttp session. The producer's INSERT and its NOTIFY are the product's own.

Run: python -m bench.floor --dsn DSN --url URL --ready-file FILE   (until SIGTERM)
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from pathlib import Path

import aiohttp
import psycopg

# (the payload is the row's message's: webhooks.deliveries shows it)
NEWER = ("SELECT delivery_id, payload::text FROM webhooks.deliveries WHERE delivery_id > %s"
         " ORDER BY delivery_id")


async def run(dsn: str, url: str, ready_file: Path) -> None:
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    headers = {"Content-Type": "application/json"}
    async with (
        await psycopg.AsyncConnection.connect(dsn, autocommit=True) as listener,
        await psycopg.AsyncConnection.connect(dsn, autocommit=True) as reader,
        aiohttp.ClientSession() as session,
    ):
        cur = await reader.execute("SELECT coalesce(max(delivery_id), 0) FROM webhooks.alert_delivery_queue")
        row = await cur.fetchone()
        last = row[0] if row else 0
        await listener.execute("LISTEN webhooks_queue")
        await asyncio.to_thread(ready_file.write_text, "ready")
        sending: set[asyncio.Task[None]] = set()

        async def post(body: str) -> None:
            async with session.post(url, data=body.encode(), headers=headers) as response:
                await response.read()

        async def follow() -> None:
            nonlocal last
            async for _ in listener.notifies():
                rows = await (await reader.execute(NEWER, (last,))).fetchall()
                if rows:
                    last = rows[-1][0]
                    for _, body in rows:
                        task = asyncio.ensure_future(post(body))
                        sending.add(task)
                        task.add_done_callback(sending.discard)

        follower = asyncio.ensure_future(follow())
        await stop.wait()
        follower.cancel()


def main() -> None:
    parser = argparse.ArgumentParser(description="the latency floor: LISTEN, read, POST; no claim")
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--url", required=True)
    parser.add_argument("--ready-file", type=Path, required=True)
    args = parser.parse_args()
    asyncio.run(run(args.dsn, args.url, args.ready_file))


if __name__ == "__main__":
    main()
