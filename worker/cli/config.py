"""`config show|set` (the fleet-wide defaults in webhooks.delivery_config) and `purge` (retention now)."""

from __future__ import annotations

import argparse
import json

import psycopg

from worker.cli.base import Commands, UsageError, connect, emit, endpoint_ref, run_async
from worker.rules.classification import RetrySchedule
from worker.store import deliveries as delivery_store
from worker.store import settings as setting_store


@run_async
async def cmd_config_show(args: argparse.Namespace) -> int:
    async with connect(args) as conn:
        emit(args, await setting_store.read(conn))
    return 0


@run_async
async def cmd_config_set(args: argparse.Namespace) -> int:
    if args.key not in setting_store.SETTABLE:
        settable = ", ".join(sorted(setting_store.SETTABLE))
        raise UsageError(f"KEY {args.key!r}: not a setting; one of {settable}")
    if args.key == "retry_schedule":
        try:
            RetrySchedule.from_json(json.loads(args.value), 0.0)
        except (ValueError, TypeError, AttributeError) as exc:
            raise UsageError(f"retry_schedule: {exc}") from None
    async with connect(args) as conn:
        try:
            await setting_store.change(conn, {args.key: None if args.value.lower() == "null" else args.value})
        except (psycopg.errors.DataError, psycopg.errors.IntegrityError) as exc:
            raise UsageError(f"{args.key}: {setting_store.setting_refusal(exc)}") from None
    print(f"{args.key} = {args.value}")
    return 0


@run_async
async def cmd_purge(args: argparse.Namespace) -> int:
    async with connect(args) as conn:
        endpoint_id = await endpoint_ref(conn, args.endpoint) if args.endpoint else None
        done = await delivery_store.purge(conn, args.dead_letters_older_than, endpoint_id)
    emit(args, done)
    return 0



def register(cli: Commands) -> None:
    config_commands = cli.group("config", "the fleet-wide defaults in webhooks.delivery_config",
                                "The fleet-wide defaults in webhooks.delivery_config.")
    config_show = cli.command(config_commands, "show", cmd_config_show, "print the defaults")
    config_show.add_argument("--json", action="store_true", help="print JSON")
    config_set = cli.command(config_commands, "set", cmd_config_set,
                             "change one default (workers pick it up)")
    config_set.add_argument("key", metavar="KEY")
    config_set.add_argument("value", metavar="VALUE", help="'null' resets a nullable default")

    purge_parser = cli.command(None, "purge", cmd_purge,
                               "apply retention now; with --dead-letters-older-than, also drop dead letters")
    purge_parser.add_argument("--dead-letters-older-than", metavar="INTERVAL",
                              help="e.g. '30 days'; dead letters are otherwise kept until replayed")
    purge_parser.add_argument("--endpoint", help="only this endpoint's dead letters")
    purge_parser.add_argument("--json", action="store_true", help="print JSON")
