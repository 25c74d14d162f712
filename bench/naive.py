"""The seed design, for comparison: what webhook-worker replaced.

10 coroutines, each with its own database connection, each in a loop: open a transaction,
`SELECT … FOR UPDATE SKIP LOCKED LIMIT 1`, POST while holding the row lock, update the row and insert
an audit row, commit; sleep 1 s when nothing is due. No batching, no leases, no health row.

Run: python -m bench.naive --dsn DSN --url URL --expect N --max-seconds S   (prints one JSON line)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import aiohttp
import psycopg

CLAIM = (
    "SELECT delivery_id, webhook_id, attempts, payload::text FROM webhooks.alert_delivery_queue"
    " WHERE status IN ('pending', 'retrying') AND next_retry_at <= now()"
    " ORDER BY delivery_id FOR UPDATE SKIP LOCKED LIMIT 1"
)
DONE = (
    "UPDATE webhooks.alert_delivery_queue SET status = %s, attempts = attempts + 1,"
    " last_http_status = %s, delivered_at = CASE WHEN %s = 'delivered' THEN now() END,"
    " next_retry_at = now() + interval '5 seconds', updated_at = now() WHERE delivery_id = %s"
)
AUDIT = (
    "INSERT INTO webhooks.alert_delivery_log (delivery_id, webhook_id, attempt, outcome, http_status,"
    " latency_ms, worker_id) VALUES (%s, %s, %s, %s, %s, %s, 'naive')"
)


async def consumer(
    dsn: str, url: str, session: aiohttp.ClientSession, counts: dict[str, int], deadline: float, expect: int
) -> None:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        while time.monotonic() < deadline and counts["done"] < expect:
            async with conn.transaction():
                cur = await conn.execute(CLAIM)
                row = await cur.fetchone()
                if row is not None:
                    delivery_id, webhook_id, attempts, payload = row
                    started = time.monotonic()
                    try:
                        async with session.post(
                            url, data=payload.encode(), headers={"Content-Type": "application/json"}
                        ) as resp:
                            await resp.read()
                            status: int | None = resp.status
                    except aiohttp.ClientError:
                        status = None
                    latency = int((time.monotonic() - started) * 1000)
                    outcome = "delivered" if status is not None and 200 <= status < 300 else "retrying"
                    await conn.execute(DONE, (outcome, status, outcome, delivery_id))
                    await conn.execute(
                        AUDIT, (delivery_id, webhook_id, attempts + 1, outcome, status, latency)
                    )
                    counts["done"] += 1
            if row is None:
                await asyncio.sleep(1.0)


async def run(dsn: str, url: str, coroutines: int, expect: int, max_seconds: float) -> dict[str, float]:
    counts = {"done": 0}
    started = time.monotonic()
    async with aiohttp.ClientSession() as session:
        await asyncio.gather(
            *(consumer(dsn, url, session, counts, started + max_seconds, expect) for _ in range(coroutines))
        )
    elapsed = time.monotonic() - started
    return {"processed": counts["done"], "seconds": elapsed, "per_second": counts["done"] / elapsed}


def main() -> None:
    parser = argparse.ArgumentParser(description="the naive seed design, draining the queue")
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--url", required=True)
    parser.add_argument("--coroutines", type=int, default=10)
    parser.add_argument("--expect", type=int, required=True, help="stop after this many rows")
    parser.add_argument("--max-seconds", type=float, default=300.0)
    args = parser.parse_args()
    result = asyncio.run(run(args.dsn, args.url, args.coroutines, args.expect, args.max_seconds))
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
