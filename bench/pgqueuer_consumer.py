"""The other side of the `pgqueuer` section: a webhook worker built on PGQueuer as its documentation
writes one. Each job POSTs its payload to the sink, signed as webhook-worker signs (worker.rules.signing:
the Standard Webhooks headers), over one aiohttp session shared by every job.

`python -m bench.pgqueuer_consumer --batch-size N --max-concurrent-tasks M` runs it as
`pgq run bench.pgqueuer_consumer:create …` would: PGQueuer's own supervisor (`pgqueuer.run`, which
`pgq run` calls) on uvloop (what `pgq run` picks when uvloop is installed, and PGQueuer depends on
it). Not `pgq run` itself: in pgqueuer 1.6.0 with typer 0.29 it stops before it starts, its
`--log-level` parser handing a string where the logger setup expects the enum.

Only that process imports this module (pgqueuer and asyncpg are in the `bench` extra, not in the
test tools). It connects as PGQueuer's README does, `asyncpg.connect()` with the PG* variables the
section sets, and reads the sink's URL, the signing secret and the connection limit from the
BENCH_PGQ_* variables below.
"""

from __future__ import annotations

import argparse
import logging
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
import asyncpg
import pgqueuer
import uvloop
from pgqueuer import QueueManager
from pgqueuer.db import AsyncpgDriver
from pgqueuer.models import Context, Job
from pgqueuer.queries import Queries

from worker.rules import signing

ENTRYPOINT = "webhook"
URL_ENV = "BENCH_PGQ_URL"
SECRET_ENV = "BENCH_PGQ_SECRET"
CONNECTIONS_ENV = "BENCH_PGQ_CONNECTIONS"
# A request's whole time, as a webhook sender must bound it (the worker's default timeout is 30 s).
REQUEST_TIMEOUT = aiohttp.ClientTimeout(total=30)


class DeliveryFailed(Exception):
    """The receiver answered outside 2xx: PGQueuer logs the job as an exception."""


@asynccontextmanager
async def create() -> AsyncIterator[QueueManager]:
    """The factory `pgq run` enters: a QueueManager (no scheduler: there are no schedules) over one
    asyncpg connection, as PGQueuer's tuning guide advises for the consumer, with the HTTP session
    in its shared resources."""
    url = os.environ[URL_ENV]
    secrets = (os.environ[SECRET_ENV],)
    connection = await asyncpg.connect()
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=int(os.environ[CONNECTIONS_ENV])))
    manager = QueueManager(Queries(AsyncpgDriver(connection)), resources={"http": session})

    @manager.entrypoint(ENTRYPOINT, accepts_context=True)
    async def deliver(job: Job, context: Context) -> None:
        http: aiohttp.ClientSession = context.resources["http"]  # type: ignore[assignment]
        body = job.payload or b""
        message_id = f"pgq_{job.id}"
        timestamp = int(time.time())
        headers = {
            "Content-Type": "application/json",
            "webhook-id": message_id,
            "webhook-timestamp": str(timestamp),
            "webhook-signature": signing.signature_header(secrets, message_id, timestamp, body),
        }
        async with http.post(url, data=body, headers=headers, timeout=REQUEST_TIMEOUT) as response:
            await response.read()
            if not 200 <= response.status < 300:
                raise DeliveryFailed(f"the receiver answered {response.status}")

    try:
        yield manager
    finally:
        await session.close()
        await connection.close()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.pgqueuer_consumer", description=__doc__)
    parser.add_argument("--batch-size", type=int, required=True)
    parser.add_argument("--max-concurrent-tasks", type=int, required=True)
    args = parser.parse_args()
    # pgq run's default: PGQueuer's own messages at INFO
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("pgqueuer").setLevel(logging.INFO)
    uvloop.run(pgqueuer.run(create, batch_size=args.batch_size,
                            max_concurrent_tasks=args.max_concurrent_tasks))


if __name__ == "__main__":
    main()
