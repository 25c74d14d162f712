"""`triggers add|list|show|disable|enable|drop|backfill|invoke`: webhooks from the application's own
tables, as sql/functions/triggers.sql registers, backfills and invokes them."""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

import psycopg

from worker.cli.base import (
    CommandFailed,
    Commands,
    UsageError,
    config_of,
    connect,
    emit,
    first_line,
    rows_a_second,
    run_async,
)
from worker.rules.pacing import step_plan
from worker.store import triggers as trigger_store
from worker.store.database import Conn

LIST_COLUMNS = ["name", "table", "ops", "event_type", "tenant", "state", "deliveries_last_hour", "backfill"]
# A backfill whose next step is not due, or that another session (an API process) is stepping, is
# looked at again after this long at most.
BACKFILL_LOOK_SECONDS = 0.5
GONE = "table dropped"


def _names(option: str, value: str | None) -> list[str] | None:
    """A comma-separated list of names; None when the option is not given."""
    if value is None:
        return None
    names = [name.strip() for name in value.split(",")]
    if not all(names):
        raise UsageError(f"{option}: a comma-separated list of names, none empty (got {value!r})")
    return names


def _refused(exc: psycopg.Error) -> CommandFailed:
    """What the database refused, said plainly: its message, then its hint (what to grant)."""
    message = first_line(exc)
    if message.startswith("permission denied for function"):
        message = (f"{message}: the login may not manage table triggers; it needs the webhooks_admin role "
                   "(GRANT webhooks_admin TO the login)")
    hint = exc.diag.message_hint
    return CommandFailed(f"{message}. {hint}" if hint else message)


def _backfill_cell(row: dict[str, Any]) -> str:
    """"#12 running 300/~1000": the latest backfill, its status and rows read of the table's estimate."""
    if row["backfill_id"] is None:
        return "-"
    estimate = row["backfill_total_estimate"]
    of = f"/~{estimate}" if estimate else ""
    return f"#{row['backfill_id']} {row['backfill_status']} {row['backfill_scanned']}{of}"


def _shown(row: dict[str, Any]) -> dict[str, Any]:
    return {**row, "table": row["table_name"], "backfill": _backfill_cell(row)}


@run_async
async def cmd_triggers_add(args: argparse.Namespace) -> int:
    on = _names("--on", args.on) or []
    async with connect(args) as conn:
        try:
            _id, notices = await trigger_store.add(conn, args.name, args.table, on, args.event_type,
                                                   columns=_names("--columns", args.columns),
                                                   exclude_columns=_names("--exclude-columns",
                                                                          args.exclude_columns),
                                                   when=args.when, tenant=args.tenant,
                                                   tenant_column=args.tenant_column)
        except (psycopg.errors.InsufficientPrivilege, psycopg.errors.UndefinedTable,
                psycopg.errors.UndefinedColumn, psycopg.errors.DuplicateObject,
                psycopg.errors.UniqueViolation, psycopg.errors.NoDataFound) as exc:
            raise _refused(exc) from None
        added = await trigger_store.show(conn, args.name)
    for said in notices:
        print(said, file=sys.stderr)
    if args.json:
        emit(args, added)
    else:
        print(f"table trigger {args.name} added: {', '.join(added['ops'])} on {added['table_name']} queue "
              f"{added['event_type']} events")
    return 0


@run_async
async def cmd_triggers_list(args: argparse.Namespace) -> int:
    async with connect(args) as conn:
        try:
            rows = await trigger_store.listing(conn)
        except psycopg.errors.InsufficientPrivilege as exc:
            raise _refused(exc) from None
    if args.json:
        emit(args, rows)
        return 0
    emit(args, [_shown(row) for row in rows], LIST_COLUMNS)
    gone = [row["name"] for row in rows if row["state"] == GONE]
    if gone:
        print(f"the table of {', '.join(gone)} is gone: its triggers went with it; `triggers drop NAME`"
              " removes the registration", file=sys.stderr)
    return 0


async def _named(conn: Conn, name: str) -> dict[str, Any]:
    try:
        return await trigger_store.show(conn, name)
    except (psycopg.errors.NoDataFound, psycopg.errors.InsufficientPrivilege) as exc:
        raise _refused(exc) from None


@run_async
async def cmd_triggers_show(args: argparse.Namespace) -> int:
    async with connect(args) as conn:
        row = await _named(conn, args.name)
    if args.json:
        emit(args, row)
        return 0
    emit(args, {k: v for k, v in _shown(row).items() if k not in ("table_name",)
                and not k.startswith("backfill_")})
    if row["state"] == GONE:
        print(f"its table is gone: `triggers drop {args.name}` removes the registration", file=sys.stderr)
    return 0


async def _set_enabled(args: argparse.Namespace, enabled: bool) -> int:
    word = "enabled" if enabled else "disabled"
    async with connect(args) as conn:
        try:
            changed = await trigger_store.set_enabled(conn, args.name, enabled)
        except (psycopg.errors.NoDataFound, psycopg.errors.InsufficientPrivilege) as exc:
            raise _refused(exc) from None
    print(f"table trigger {args.name} {word}" if changed else f"table trigger {args.name} was {word} already")
    return 0


@run_async
async def cmd_triggers_disable(args: argparse.Namespace) -> int:
    return await _set_enabled(args, False)


@run_async
async def cmd_triggers_enable(args: argparse.Namespace) -> int:
    return await _set_enabled(args, True)


@run_async
async def cmd_triggers_drop(args: argparse.Namespace) -> int:
    async with connect(args) as conn:
        try:
            gone, notices = await trigger_store.drop(conn, args.name)
        except (psycopg.errors.NoDataFound, psycopg.errors.InsufficientPrivilege) as exc:
            raise _refused(exc) from None
    for said in notices:
        print(said, file=sys.stderr)
    stayed = "" if gone else " (its PostgreSQL triggers stay: see above)"
    print(f"table trigger {args.name} dropped{stayed}")
    return 0


async def _start_backfill(conn: Conn, args: argparse.Namespace) -> tuple[int, float | None]:
    """The backfill's operation and its rate: a new one, or the trigger's backfill that is running
    already (a run of this command that was killed, or one an API process steps), continued as it
    was started."""
    try:
        return await trigger_store.start_backfill(conn, args.name, args.where, args.rate), args.rate
    except psycopg.errors.ObjectInUse:
        running = await trigger_store.running_backfill(conn, args.name)
        if running is None:  # it ended between the two calls
            return await trigger_store.start_backfill(conn, args.name, args.where, args.rate), args.rate
        print(f"backfill {running['id']} of {args.name} is running already: continuing it as it was started"
              f" (where: {running['where'] or 'every row'}; rate: {running['rate'] or 'as fast as it goes'})",
              file=sys.stderr)
        rate = running["rate"]
        return int(running["id"]), None if rate is None else float(rate)
    except (psycopg.errors.NoDataFound, psycopg.errors.InsufficientPrivilege, psycopg.errors.UndefinedTable,
            psycopg.errors.UndefinedColumn) as exc:
        raise _refused(exc) from None


@run_async
async def cmd_triggers_backfill(args: argparse.Namespace) -> int:
    step_rows = config_of(args).api.replay_step_rows
    async with connect(args) as conn:
        operation_id, rate = await _start_backfill(conn, args)
        print(f"backfill {operation_id} of {args.name} started: `operations list` shows it, "
              f"`operations cancel {operation_id}` stops it", file=sys.stderr)
        try:
            progress = await _step_until_ended(conn, operation_id, step_plan(step_rows, rate)[0])
        except asyncio.CancelledError:  # Ctrl-C: the operation stays, where it got to
            print(f"\ninterrupted: backfill {operation_id} stays running where it got to; run this command"
                  " again (or let `webhook-worker api` step it) to continue, `operations cancel"
                  f" {operation_id}` to stop it", file=sys.stderr)
            raise
    if args.json:
        emit(args, progress)
    status, queued, read = progress["status"], progress["processed"], progress["scanned"]
    if status == "done":
        if not args.json:
            print(f"backfill {operation_id} of {args.name} done: {queued} row(s) queued of {read} read")
        return 0
    if status == "cancelled":
        raise CommandFailed(f"backfill {operation_id} cancelled by {progress['cancelled_by']} after"
                            f" {queued} row(s) queued of {read} read")
    raise CommandFailed(f"backfill {operation_id} {status}: {progress['error']}")


async def _step_until_ended(conn: Conn, operation_id: int, rows: int) -> dict[str, Any]:
    """Step the backfill until it ends (done, cancelled, failed), `rows` a step, each step when the
    operation says it is due (its rate), printing its progress; its last state."""
    while True:
        try:
            stepped = await trigger_store.step_backfill(conn, operation_id, rows)
        except (psycopg.DataError, psycopg.IntegrityError, psycopg.ProgrammingError) as exc:
            # as the API's runner does: an operation that cannot go on ends as failed, with why
            await trigger_store.fail_backfill(conn, operation_id, first_line(exc))
            stepped = None
        progress = await trigger_store.backfill_progress(conn, operation_id)
        assert progress is not None
        if progress["status"] != "running":
            return progress
        if stepped is not None:
            estimate = progress["total_estimate"]
            of = f" of about {estimate}" if estimate else ""
            queued, read = progress["processed"], progress["scanned"]
            print(f"backfill {operation_id}: {queued} row(s) queued, {read} read{of}", file=sys.stderr)
        # never longer than a look: a cancel is noticed while the next step is not yet due
        wait = min(BACKFILL_LOOK_SECONDS, max(progress["due_in_seconds"], 0.05 if stepped is None else 0.0))
        if wait > 0:
            await asyncio.sleep(wait)


@run_async
async def cmd_triggers_invoke(args: argparse.Namespace) -> int:
    async with connect(args) as conn:
        try:
            made = await trigger_store.invoke(conn, args.name, args.key)
        except (psycopg.errors.NoDataFound, psycopg.errors.InsufficientPrivilege,
                psycopg.errors.UndefinedTable) as exc:
            raise _refused(exc) from None
    if args.json:
        emit(args, {"deliveries": made})
    else:
        print(f"row {args.key} of table trigger {args.name} queued as op manual: {made} delivery(ies)"
              + ("" if made else " (no endpoint subscribes to its event type)"))
    return 0


def register(cli: Commands) -> None:
    group = cli.group("triggers", "webhooks from your tables' inserts, updates and deletes",
                      "Webhooks from your tables: a table trigger queues an event for each row an INSERT,"
                      " UPDATE or DELETE changes, in the writer's own transaction (docs/table-triggers.md).")

    add = cli.command(group, "add", cmd_triggers_add,
                      "install a table trigger (needs the table's owner or its TRIGGER privilege)")
    add.add_argument("name", metavar="NAME",
                     help="the trigger's name: 1 to 40 letters, digits, '_', '.' or '-'")
    add.add_argument("--table", required=True, metavar="SCHEMA.TABLE", help="the table, with its schema")
    add.add_argument("--on", required=True, metavar="OPS",
                     help=f"the ops that fire it, comma-separated: some of {', '.join(trigger_store.OPS)}")
    add.add_argument("--event-type", required=True, metavar="TYPE", help="the events' type")
    add.add_argument("--columns", metavar="C1,C2",
                     help="an update fires when one of these changed (default: any column not excluded)")
    add.add_argument("--exclude-columns", metavar="C3", help="columns never sent, in any op")
    add.add_argument("--when", metavar="SQL_CONDITION",
                     help="only rows meeting this condition on the row (e.g. \"status <> 'draft'\")")
    tenancy = add.add_mutually_exclusive_group()
    tenancy.add_argument("--tenant", metavar="T",
                         help="the tenant whose endpoints get the events (default: default)")
    tenancy.add_argument("--tenant-column", metavar="C", help="the column naming each row's tenant")
    add.add_argument("--json", action="store_true", help="print JSON")

    listed = cli.command(group, "list", cmd_triggers_list,
                         "list table triggers: table, ops, state (a dropped table shows as 'table dropped'), "
                         "deliveries in the last hour, latest backfill")
    listed.add_argument("--json", action="store_true", help="print JSON")

    show = cli.command(group, "show", cmd_triggers_show, "one table trigger, all it holds")
    show.add_argument("name", metavar="NAME")
    show.add_argument("--json", action="store_true", help="print JSON")

    disable = cli.command(group, "disable", cmd_triggers_disable, "stop a table trigger queueing anything")
    disable.add_argument("name", metavar="NAME")
    enable = cli.command(group, "enable", cmd_triggers_enable, "let a disabled table trigger queue again")
    enable.add_argument("name", metavar="NAME")
    drop = cli.command(group, "drop", cmd_triggers_drop,
                       "remove a table trigger (its PostgreSQL triggers too, when the login owns the table)")
    drop.add_argument("name", metavar="NAME")

    backfill = cli.command(group, "backfill", cmd_triggers_backfill,
                           "queue the table's existing rows as op backfill: a bulk operation (`operations "
                           "list|cancel`), stepped here until done; run again after a kill to continue it")
    backfill.add_argument("name", metavar="NAME")
    backfill.add_argument("--where", metavar="SQL_CONDITION", help="only rows meeting this condition")
    backfill.add_argument("--rate", type=rows_a_second, metavar="N", help="at most N rows a second")
    backfill.add_argument("--json", action="store_true", help="print the finished operation as JSON")

    invoke = cli.command(group, "invoke", cmd_triggers_invoke, "queue one row now, as op manual")
    invoke.add_argument("name", metavar="NAME")
    invoke.add_argument("--key", required=True, metavar="PRIMARY_KEY",
                        help="the row's primary key (a key of several columns: a JSON array of their values)")
    invoke.add_argument("--json", action="store_true", help="print JSON")
