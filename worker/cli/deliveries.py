"""Deliveries, dead letters and replay: `enqueue`, `status`, `deliveries show`, `dlq list`, `replay`,
and the bulk replays started over the API (`operations`)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from datetime import datetime
from typing import Any

from worker.cli.base import (
    CommandFailed,
    Commands,
    UsageError,
    connect,
    emit,
    endpoint_ref,
    rows_a_second,
    run_async,
    tenant_scope,
)
from worker.rules import coalescing
from worker.rules.classification import CATEGORIES
from worker.store import deliveries as delivery_store
from worker.store import operations as operation_store
from worker.store.database import Conn
from worker.tables import cell, endpoint_label, print_table


@run_async
async def cmd_enqueue(args: argparse.Namespace) -> int:
    try:
        json.loads(args.payload)
    except ValueError:
        raise UsageError("--payload: not valid JSON") from None
    async with connect(args) as conn:
        endpoint_id = await endpoint_ref(conn, args.endpoint)
        delivery_id = await delivery_store.enqueue(conn, endpoint_id, args.event_type, args.payload, args.key)
    emit(args, {"delivery_id": delivery_id}) if args.json else print(f"delivery {delivery_id} queued")
    return 0


@run_async
async def cmd_status(args: argparse.Namespace) -> int:
    async with connect(args) as conn:
        await tenant_scope(conn, args)
        status = await delivery_store.queue_status(conn)
    if args.json:
        emit(args, status)
        return 0
    emit(args, status["queue"], ["status", "deliveries", "oldest_due_age_seconds"])
    if status["held_back"]:
        print()
        emit(args, status["held_back"], ["reason", "rows"])
    print()
    emit(args, status["endpoints"], ["id", "name", "active", "health_status", "circuit_state",
                                      "consecutive_failures", "last_success_at", "last_failure_at"])
    return 0


@run_async
async def cmd_deliveries_show(args: argparse.Namespace) -> int:
    if (args.id is None) == (args.key is None):
        raise UsageError("give a delivery id or --key, not both")
    async with connect(args) as conn:
        found = await delivery_store.find(conn, args.id, args.key)
    if not found:
        raise CommandFailed("no such delivery")
    if args.json:
        emit(args, found)
        return 0
    for delivery in found:
        history = delivery.pop("history")
        delivery.pop("payload", None)
        emit(args, delivery)
        print()
        print_table(["attempt", "outcome", "failure_category", "http_status", "latency_ms", "worker_id",
                     "stale", "logged_at", "digest", "error"],
                    [[cell(h[c]) for c in ("attempt", "outcome", "failure_category", "http_status",
                                            "latency_ms", "worker_id", "stale", "logged_at")]
                     + [_digest_cell(h), cell(h["error"])]
                     for h in history])
        print()
    return 0


def _digest_cell(attempt: dict[str, Any]) -> str:
    """"d-17 (37 rows)": the digest that carried the attempt, and how many rows it carried."""
    if attempt.get("digest_id") is None:
        return ""
    return f"{coalescing.digest_label(attempt['digest_id'])} ({attempt['digest_rows']} rows)"


async def _filters(conn: Conn, args: argparse.Namespace) -> dict[str, Any]:
    return {
        "webhook_id": await endpoint_ref(conn, args.endpoint) if args.endpoint else None,
        "event_type": args.event_type,
        "category": args.category,
        "since": await _point_in_time(conn, "--since", args.since),
        "until": await _point_in_time(conn, "--until", args.until),
    }


async def _point_in_time(conn: Conn, option: str, value: str | None) -> datetime | None:
    """The option's timestamp or time ago (delivery_store.point_in_time); anything else names the option."""
    if value is None:
        return None
    when = await delivery_store.point_in_time(conn, value)
    if when is None:
        raise UsageError(f"{option}: {value!r} is neither a timestamp nor a time ago such as '1 hour ago'")
    return when


@run_async
async def cmd_dlq_list(args: argparse.Namespace) -> int:
    async with connect(args) as conn:
        await tenant_scope(conn, args)
        rows = await delivery_store.dead_letters(conn, await _filters(conn, args), args.limit)
    if not args.json:
        for row in rows:
            row["endpoint"] = endpoint_label(row["endpoint_name"], row["endpoint_id"],
                                             row["endpoint_deleted_at"])
    emit(args, rows, ["delivery_id", "endpoint", "event_type", "attempts", "failure_category",
                       "last_http_status", "dead_letter_reason", "dead_lettered_at"])
    return 0


@run_async
async def cmd_replay(args: argparse.Namespace) -> int:
    filtered = any(getattr(args, f)
                   for f in ("endpoint", "event_type", "category", "since", "until", "tenant"))
    if args.id is not None and (filtered or args.all):
        raise UsageError("give a delivery id, or filters with --all, not both")
    async with connect(args) as conn:
        await tenant_scope(conn, args)
        if args.id is not None:
            if not await delivery_store.replay(conn, args.id):
                refusal = await delivery_store.replay_refusal(conn, args.id)
                raise CommandFailed(refusal or f"ID {args.id}: no delivery with this id")
            print(f"delivery {args.id} queued again (same webhook-id)")
            return 0
        if not args.all:
            raise UsageError("give a delivery id, or --all with filters to replay every matching dead letter")
        # Batches of the oldest matching dead letters: replayed rows leave the dead-letter state, so
        # an interrupted run simply continues where it stopped when run again. Only those that were
        # dead letters when it started: one that fails again is not replayed a second time, so the
        # run ends even while the receiver keeps refusing.
        filters, total = await _filters(conn, args), 0
        filters["until"] = await delivery_store.started_before(conn, filters["until"])
        pause = args.batch / args.rate if args.rate else 0.0
        while True:
            step = min(args.batch, args.max - total) if args.max else args.batch
            replayed = await delivery_store.replay_batch(conn, filters, step)
            total += replayed
            if replayed:
                print(f"replayed {total} so far", file=sys.stderr)
            if replayed < step or (args.max and total >= args.max):
                break
            await asyncio.sleep(pause)  # the rate limit: whole batches, spaced out
    emit(args, {"replayed": total}) if args.json else print(f"replayed {total} dead letters")
    return 0


@run_async
async def cmd_operations_list(args: argparse.Namespace) -> int:
    async with connect(args) as conn:
        rows = await operation_store.latest(conn, args.limit)
    emit(args, rows, ["id", "kind", "status", "processed", "max_rows", "rate", "requested_by",
                       "cancelled_by", "created_at", "finished_at"])
    return 0


@run_async
async def cmd_operations_cancel(args: argparse.Namespace) -> int:
    async with connect(args) as conn:
        status = await operation_store.cancel(conn, args.id, "cli")
    if status is None:
        raise CommandFailed(f"ID {args.id}: no operation with this id")
    if status != "cancelled":
        raise CommandFailed(f"operation {args.id} is {status} already: nothing to cancel")
    print(f"operation {args.id} cancelled")
    return 0



def register(cli: Commands) -> None:
    enqueue = cli.command(None, "enqueue", cmd_enqueue, "queue one delivery by hand, to test an endpoint")
    enqueue.add_argument("--endpoint", required=True, help="id (all digits) or name")
    enqueue.add_argument("--event-type", default="webhook.test", help="default: webhook.test")
    enqueue.add_argument("--payload", default='{"test": true}', help="JSON body")
    enqueue.add_argument("--key", help="idempotency key (default: a new event id)")
    enqueue.add_argument("--json", action="store_true", help="print JSON")

    status = cli.command(None, "status", cmd_status,
                         "queue counts by status, oldest due, rows held back, endpoint health and circuits")
    status.add_argument("--json", action="store_true", help="print JSON")
    status.add_argument("--tenant", metavar="NAME", help="only this tenant's rows and endpoints")

    delivery_commands = cli.group("deliveries", "look up deliveries", "Look up deliveries.")
    show_delivery = cli.command(delivery_commands, "show", cmd_deliveries_show,
                                "a delivery (by id, or every endpoint's by --key) with its attempt history")
    show_delivery.add_argument("id", nargs="?", type=int, help="delivery id")
    show_delivery.add_argument("--key", help="idempotency key instead of an id")
    show_delivery.add_argument("--json", action="store_true", help="print JSON")

    def add_filters(sub: argparse.ArgumentParser) -> None:
        sub.add_argument("--endpoint", help="id (all digits) or name")
        sub.add_argument("--event-type")
        sub.add_argument("--category", choices=CATEGORIES, metavar="CATEGORY",
                         help=f"failure category: {', '.join(CATEGORIES)}")
        sub.add_argument("--since", metavar="TIMESTAMP", help="dead-lettered at or after")
        sub.add_argument("--until", metavar="TIMESTAMP", help="dead-lettered before")
        sub.add_argument("--tenant", metavar="NAME", help="only this tenant's dead letters")

    dlq_commands = cli.group("dlq", "the dead letters", "The dead letters.")
    dlq_list = cli.command(dlq_commands, "list", cmd_dlq_list, "list dead letters, oldest first")
    add_filters(dlq_list)
    dlq_list.add_argument("--limit", type=int, default=100, help="default 100")
    dlq_list.add_argument("--json", action="store_true", help="print JSON")

    replay = cli.command(None, "replay", cmd_replay,
                         "send a delivery again (same webhook-id), or --all dead letters matching filters")
    replay.add_argument("id", nargs="?", type=int, help="delivery id")
    replay.add_argument("--all", action="store_true", help="every dead letter matching the filters")
    add_filters(replay)
    replay.add_argument("--batch", type=int, default=100, help="rows per step (default 100)")
    replay.add_argument("--rate", type=rows_a_second, help="at most this many rows per second")
    replay.add_argument("--max", type=int, help="stop after this many")
    replay.add_argument("--json", action="store_true", help="print JSON")

    operation_commands = cli.group("operations", "bulk replays and table-trigger backfills",
                                   "Bulk operations: replays started over the HTTP API (POST"
                                   " /v1/dead-letters/replay) or the console, and table-trigger backfills"
                                   " (triggers backfill).")
    operations_list = cli.command(operation_commands, "list", cmd_operations_list,
                                  "list operations, newest first")
    operations_list.add_argument("--limit", type=int, default=50, help="default 50")
    operations_list.add_argument("--json", action="store_true", help="print JSON")
    operations_cancel = cli.command(operation_commands, "cancel", cmd_operations_cancel,
                                    "stop a running operation after the step it is in")
    operations_cancel.add_argument("id", metavar="ID", type=int, help="operation id")
