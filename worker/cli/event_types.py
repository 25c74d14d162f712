"""`event-types list|set|deprecate|unmatched`: the catalogue of the event types producers publish."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from worker.cli.base import CommandFailed, Commands, UsageError, connect, emit, run_async
from worker.rules.shapes import json_default


def _as_dict(found: Any) -> dict[str, Any]:
    return {"name": found.name, "description": found.description, "schema": found.schema,
            "deprecated": found.deprecated}


@run_async
async def cmd_event_types_list(args: argparse.Namespace) -> int:
    from worker.store import event_types as catalogue_store

    async with connect(args) as conn:
        found = await catalogue_store.listing(conn, include_deprecated=not args.current)
    rows = [{**_as_dict(t), "problem": t.problem} for t in found]
    if args.json:
        emit(args, rows)
        return 0
    for row in rows:
        row["schema"] = "yes" if row["schema"] is not None else ""
        row["problem"] = row["problem"] or ""
    emit(args, rows, ["name", "deprecated", "schema", "description", "problem"])
    unusable = sum(1 for t in found if t.problem is not None)
    if unusable:
        print(f"{unusable} event type(s) have a schema that cannot be used (problem): their publishes are "
              "refused until the schema is replaced (event-types set NAME --schema ...)", file=sys.stderr)
    return 0


def _schema(args: argparse.Namespace) -> Any:
    """--schema JSON or --schema-file FILE; None when neither is given."""
    from worker.rules import event_types

    if args.schema is not None:
        text, option = args.schema, "--schema"
    elif args.schema_file is not None:
        option = "--schema-file"
        try:
            text = Path(args.schema_file).read_text(encoding="utf-8")
        except OSError as exc:
            raise UsageError(f"--schema-file: cannot read {args.schema_file}: {exc.strerror}") from None
    else:
        return None
    try:
        return event_types.schema_from_text(text)
    except event_types.EventTypeError as exc:
        raise UsageError(f"{option}: {str(exc).partition(': ')[2]}") from None


@run_async
async def cmd_event_types_set(args: argparse.Namespace) -> int:
    from worker.rules import event_types
    from worker.store import event_types as catalogue_store

    schema = _schema(args)
    async with connect(args) as conn:
        try:
            async with conn.transaction():
                created = await catalogue_store.upsert(conn, args.name, args.description, schema)
        except event_types.EventTypeError as exc:
            field, _, detail = str(exc).partition(": ")
            option = {"name": "NAME", "schema": "--schema"}.get(field, f"--{field}")
            raise UsageError(f"{option}: {detail}") from None
        found = await catalogue_store.get(conn, args.name)
    if args.json:
        print(json.dumps({**_as_dict(found), "created": created}, default=json_default))
    else:
        print(f"event type {args.name} {'added' if created else 'replaced'}")
    return 0


@run_async
async def cmd_event_types_deprecate(args: argparse.Namespace) -> int:
    from worker.rules import event_types
    from worker.store import event_types as catalogue_store

    async with connect(args) as conn:
        try:
            found = await catalogue_store.deprecate(conn, args.name, not args.undo)
        except event_types.EventTypeError as exc:
            raise UsageError(f"NAME: {str(exc).partition(': ')[2]}") from None
    if not found:
        raise CommandFailed(f"NAME {args.name!r}: no such event type (event-types list shows them)")
    print(f"event type {args.name} {'is current again' if args.undo else 'deprecated'}")
    return 0


@run_async
async def cmd_event_types_unmatched(args: argparse.Namespace) -> int:
    from worker.store import event_types as catalogue_store

    async with connect(args) as conn:
        rows = await catalogue_store.unmatched_subscriptions(conn)
    if not args.json and not rows:
        print("every subscription matches a current event type", file=sys.stderr)
        return 0
    emit(args, rows, ["webhook_id", "endpoint_name", "pattern", "problem"])
    return 0


def register(cli: Commands) -> None:
    group = cli.group("event-types", "the event-type catalogue",
                      "The event types producers publish: what each means and, optionally, the JSON "
                      "Schema its payloads follow (the HTTP API validates a publish against it).")
    listing = cli.command(group, "list", cmd_event_types_list, "list the catalogue")
    listing.add_argument("--current", action="store_true", help="leave out deprecated types")
    listing.add_argument("--json", action="store_true", help="print JSON")
    set_ = cli.command(group, "set", cmd_event_types_set,
                       "add an event type, or replace its description and schema (what is not given "
                       "is cleared)")
    set_.add_argument("name", metavar="NAME", help="the event type, as producers publish it")
    set_.add_argument("--description", default="", help="what it means (for people)")
    schema = set_.add_mutually_exclusive_group()
    schema.add_argument("--schema", metavar="JSON", help="the JSON Schema (draft 2020-12) of its payloads")
    schema.add_argument("--schema-file", metavar="FILE", help="read the JSON Schema from FILE")
    set_.add_argument("--json", action="store_true", help="print JSON")
    deprecate = cli.command(group, "deprecate", cmd_event_types_deprecate,
                            "mark an event type deprecated (still accepted and delivered)")
    deprecate.add_argument("name", metavar="NAME", help="the event type")
    deprecate.add_argument("--undo", action="store_true", help="make it current again")
    unmatched = cli.command(group, "unmatched", cmd_event_types_unmatched,
                            "endpoint subscriptions that match no current event type")
    unmatched.add_argument("--json", action="store_true", help="print JSON")
