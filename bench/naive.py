"""The seed design deployed by a competent user, for comparison: what webhook-worker replaced.

Its own table with the seed's columns, the seed's claim query verbatim and an index that serves it:
the seed at its best, not a claim that no index serves.
10 coroutines, each with its own database connection, each in a loop: open a transaction, claim one
row `FOR UPDATE SKIP LOCKED`, POST while holding the row lock, update the row and insert an audit
row, commit; sleep 1 s when nothing is due. No batching, no leases, no health row, no signing.

Run: python -m bench.naive --dsn DSN --expect N --max-seconds S   (prints one JSON line)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import aiohttp
import psycopg

# The seed's tables, and the one index its claim needs: the partial index's predicate is implied by
# the claim's WHERE, and its key is the claim's ORDER BY, so a claim reads the oldest waiting rows.
SCHEMA = """
CREATE SCHEMA IF NOT EXISTS naive;
CREATE TABLE naive.webhook_deliveries (
    id bigserial PRIMARY KEY,
    webhook_url text NOT NULL,
    event_type text NOT NULL,
    payload jsonb NOT NULL,
    delivery_status text NOT NULL DEFAULT 'pending',
    attempts integer NOT NULL DEFAULT 0,
    last_http_status integer,
    last_error text,
    next_retry_at timestamptz,
    created_at timestamptz NOT NULL DEFAULT now(),
    delivered_at timestamptz
);
CREATE INDEX webhook_deliveries_waiting ON naive.webhook_deliveries (created_at)
    WHERE delivery_status IN ('pending', 'retrying');
CREATE TABLE naive.webhook_delivery_log (
    id bigserial PRIMARY KEY,
    delivery_id bigint NOT NULL,
    attempt integer NOT NULL,
    http_status integer,
    latency_ms integer,
    created_at timestamptz NOT NULL DEFAULT now()
);
"""

# The seed's query, verbatim.
CLAIM = (
    "SELECT id, webhook_url, attempts, payload::text FROM naive.webhook_deliveries"
    " WHERE delivery_status = 'pending' OR (delivery_status = 'retrying' AND next_retry_at <= NOW())"
    " ORDER BY created_at FOR UPDATE SKIP LOCKED LIMIT 1"
)
DONE = (
    "UPDATE naive.webhook_deliveries SET delivery_status = %s, attempts = attempts + 1,"
    " last_http_status = %s, delivered_at = CASE WHEN %s = 'delivered' THEN now() END,"
    " next_retry_at = now() + interval '5 seconds' WHERE id = %s"
)
AUDIT = (
    "INSERT INTO naive.webhook_delivery_log (delivery_id, attempt, http_status, latency_ms)"
    " VALUES (%s, %s, %s, %s)"
)


def preload_sql(payload_sql: str) -> str:
    """INSERT … SELECT of %s rows for the URL %s; payload_sql is an expression of g."""
    return (
        "INSERT INTO naive.webhook_deliveries (webhook_url, event_type, payload, created_at)"
        f" SELECT %s, 'alert.created', {payload_sql}, now() + g * interval '1 microsecond'"
        " FROM generate_series(1, %s) g"
    )


async def consumer(
    dsn: str, session: aiohttp.ClientSession, counts: dict[str, int], deadline: float, expect: int
) -> None:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        while time.monotonic() < deadline and counts["done"] < expect:
            async with conn.transaction():
                cur = await conn.execute(CLAIM)
                row = await cur.fetchone()
                if row is not None:
                    delivery_id, target, attempts, payload = row
                    started = time.monotonic()
                    try:
                        async with session.post(
                            target, data=payload.encode(), headers={"Content-Type": "application/json"}
                        ) as resp:
                            await resp.read()
                            status: int | None = resp.status
                    except aiohttp.ClientError:
                        status = None
                    latency = int((time.monotonic() - started) * 1000)
                    outcome = "delivered" if status is not None and 200 <= status < 300 else "retrying"
                    await conn.execute(DONE, (outcome, status, outcome, delivery_id))
                    await conn.execute(AUDIT, (delivery_id, attempts + 1, status, latency))
                    counts["done"] += 1
            if row is None:
                await asyncio.sleep(1.0)


async def run(dsn: str, coroutines: int, expect: int, max_seconds: float) -> dict[str, float]:
    counts = {"done": 0}
    started = time.monotonic()
    async with aiohttp.ClientSession() as session:
        await asyncio.gather(
            *(consumer(dsn, session, counts, started + max_seconds, expect) for _ in range(coroutines))
        )
    elapsed = time.monotonic() - started
    return {"processed": counts["done"], "seconds": elapsed, "per_second": counts["done"] / elapsed}


def main() -> None:
    parser = argparse.ArgumentParser(description="the naive seed design, draining the queue")
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--coroutines", type=int, default=10)
    parser.add_argument("--expect", type=int, required=True, help="stop after this many rows")
    parser.add_argument("--max-seconds", type=float, default=300.0)
    args = parser.parse_args()
    result = asyncio.run(run(args.dsn, args.coroutines, args.expect, args.max_seconds))
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
