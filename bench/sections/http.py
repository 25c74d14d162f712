"""Section `http`, the HTTP ceiling: a bare aiohttp session's rate and the worker's own Sender's,
alternating, on the same loop, sink and payload. The bare ceiling is also the e2e section's yardstick."""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

from bench.common import LOOPBACK_POLICY, machine_load, median_of, payload_json
from bench.section import MEDIAN_RUNS, Context, Figures, Section, Target, get, target, three


def options(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--http-seconds", type=float, default=10.0, help="HTTP ceiling duration (10 s)")


async def _http_ceiling(url: str, concurrency: int, seconds: float) -> dict[str, Any]:
    from worker.daemon.sender import Sender
    from worker.rules.classification import RetrySchedule
    from worker.rules.model import Claimed

    sender = Sender(concurrency, LOOPBACK_POLICY)
    await sender.start()
    body = payload_json(1).encode()
    rows = [
        Claimed(
            delivery_id=i,
            endpoint_id=1,
            event_id=f"evt_{i}",
            idempotency_key=f"evt_{i}",
            event_type="alert.created",
            body=body,
            attempt=1,
            max_attempts=10,
            lease_token=uuid.uuid4(),
            locked_until=datetime.now(UTC) + timedelta(minutes=5),
            url=url,
            signing_secrets=("whsec_" + "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",),
            headers={},
            timeout_seconds=None,
            schedule=RetrySchedule(),
            # as claimed rows carry it: the URL's check is then asked once, as in the worker
            url_version="bench",
        )
        for i in range(concurrency)
    ]
    counts = {"ok": 0, "failed": 0}
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds

    async def one(row: Claimed) -> None:
        while loop.time() < deadline:
            sent = await sender.send(row, body, 10.0)
            counts["ok" if sent.result.status == 200 else "failed"] += 1

    cpu0, started = time.process_time(), loop.time()
    await asyncio.gather(*(one(r) for r in rows))
    elapsed, cpu = loop.time() - started, time.process_time() - cpu0
    await sender.close()
    return _client_figures(counts, elapsed, cpu)


def _client_figures(counts: dict[str, int], elapsed: float, cpu: float) -> dict[str, Any]:
    """One HTTP client loop's figures, the same for the Sender and the bare ceiling."""
    return {
        "requests": counts["ok"],
        "failed": counts["failed"],
        "seconds": round(elapsed, 2),
        "per_second": round(counts["ok"] / elapsed, 1),
        "client_cpu_ms_per_request": round(cpu * 1000 / max(1, counts["ok"]), 4),
    }


async def _bare_ceiling(url: str, concurrency: int, seconds: float) -> dict[str, Any]:
    """The library's own ceiling: a bare aiohttp ClientSession with the Sender's connector limit, the
    same payload and sink, no signing, no custom resolver or socket factory."""
    import aiohttp

    body = payload_json(1).encode()
    headers = {"Content-Type": "application/json"}
    counts = {"ok": 0, "failed": 0}
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as session:

        async def one() -> None:
            while loop.time() < deadline:
                async with session.post(url, data=body, headers=headers) as response:
                    await response.read()
                    counts["ok" if response.status == 200 else "failed"] += 1

        cpu0, started = time.process_time(), loop.time()
        await asyncio.gather(*(one() for _ in range(concurrency)))
        elapsed, cpu = loop.time() - started, time.process_time() - cpu0
    return {**_client_figures(counts, elapsed, cpu), "loop": "asyncio (default)"}


def bare_ceiling(ctx: Context) -> dict[str, Any]:
    return asyncio.run(_bare_ceiling(ctx.sink.url(), ctx.settings.in_flight, ctx.args.http_seconds))


def run(ctx: Context) -> dict[str, Any]:
    # the same number in flight as the workers: same client, same load
    conc = ctx.settings.in_flight
    out: dict[str, Any] = {"concurrency": conc, "payload_bytes": len(payload_json(1))}
    # bare, Sender, bare, Sender, …: the Sender's cost of our own request building (signing, headers,
    # the destination checks) as the median of alternating runs
    bare_runs, sender_runs = [], []
    for _ in range(MEDIAN_RUNS):
        bare_runs.append(bare_ceiling(ctx))
        ctx.sink.reset()
        sink_cpu0 = ctx.sink.cpu()
        run = asyncio.run(_http_ceiling(ctx.sink.url(), conc, ctx.args.http_seconds))
        run["loop"] = "asyncio (default; what `webhook-worker` runs)"
        run["sink_cpu_share"] = round((ctx.sink.cpu() - sink_cpu0) / run["seconds"], 3)
        sender_runs.append(run)
    out["bare"] = {"runs": bare_runs, "per_second": median_of([r["per_second"] for r in bare_runs]),
                   "client_cpu_ms_per_request": median_of(
                       [r["client_cpu_ms_per_request"] for r in bare_runs])}
    out["sender"] = {"runs": sender_runs, "per_second": median_of([r["per_second"] for r in sender_runs]),
                     "client_cpu_ms_per_request": median_of(
                         [r["client_cpu_ms_per_request"] for r in sender_runs])}
    out["sender_over_bare"] = median_of(
        [s["per_second"] / b["per_second"] for b, s in zip(bare_runs, sender_runs, strict=True)])
    # the run whose rate is the median, for the figures that read one run
    out["default_loop"] = sorted(sender_runs, key=lambda r: r["per_second"])[len(sender_runs) // 2]
    out["load_average"] = machine_load()
    try:
        import uvloop

        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            out["uvloop"] = runner.run(_http_ceiling(ctx.sink.url(), conc, ctx.args.http_seconds))
        out["uvloop"]["loop"] = "uvloop (not what the worker runs today; for comparison)"
    except ImportError:
        out["uvloop"] = None
    return out


def figures(h: dict[str, Any]) -> Figures:
    lines: Figures = []
    for key, label in (("bare", "bare aiohttp ClientSession"), ("sender", "the worker's Sender")):
        m = h[key]
        lines.append(
            (
                f"1. HTTP ceiling, {label}, asyncio (median of {len(m['runs'])}, alternating)",
                f"{m['per_second']['median']:,.0f} req/s of {m['per_second']['values']}; client CPU "
                f"{m['client_cpu_ms_per_request']['median']} ms/req of "
                f"{m['client_cpu_ms_per_request']['values']}",
            )
        )
    if h.get("uvloop"):
        lines.append(("   the Sender on uvloop (one run)", f"{h['uvloop']['per_second']:,.0f} req/s"))
    lines.append(("   load average (1, 5, 15 min) after", str(h["load_average"])))
    return lines


def targets(results: dict[str, Any], _args: argparse.Namespace) -> Iterator[Target]:
    sender = get(results, "http", "sender_over_bare")
    if sender is not None:
        yield target("HTTP: our Sender vs bare aiohttp (cost of our request building)",
                     three(sender, 100, "{:.0f}%"), "(no target)", None)


SECTION = Section("http", run, options=options, figures=figures, targets=targets, quick={"http_seconds": 1.0})
