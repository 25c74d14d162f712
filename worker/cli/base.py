"""What every command group shares: the exit-status rule, the errors that carry it, the config, the
connection, output, and how a group registers its commands."""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any

import psycopg

from worker.config import Config, load_config
from worker.encryption import Keyring, load_keyring
from worker.rules.pacing import rate_problem
from worker.rules.shapes import json_default
from worker.store import database
from worker.store import endpoints as endpoint_store
from worker.store import tenants as tenant_store
from worker.store.database import Conn
from worker.tables import cell, print_table

Handler = Callable[[argparse.Namespace], int]
CONFIG_HELP = "YAML config file (DATABASE_URL and WEBHOOK_WORKER_* variables override it)"

# One rule for every command (README, "Exit status"): 0 done; 1 understood but not done (the
# database unreachable or refusing, what the command names does not exist, or its state refuses the
# change); 2 what the user gave is wrong: the command line or the configuration, keys included.
EXIT_USAGE = 2
EXIT_FAILURE = 1


class UsageError(Exception):
    """A command-line value that cannot be used; the message names the option."""


class CommandFailed(Exception):
    """A well-formed command that could not be done: what it names does not exist, or the state of
    the database refuses it."""


def rows_a_second(text: str) -> float:
    """--rate of a bulk operation (`replay --all`, `triggers backfill`): rows a second, within the
    bounds every way of starting one keeps to."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of rows a second, got {text!r}") from None
    problem = rate_problem(value)
    if problem is not None:
        raise argparse.ArgumentTypeError(problem)
    return value


def config_of(args: argparse.Namespace) -> Config:
    return load_config(getattr(args, "config", None))


def keyring_of(config: Config) -> Keyring:
    return load_keyring(config.security.encryption_keys_file, os.environ)


def connect(args: argparse.Namespace) -> AbstractAsyncContextManager[Conn]:
    """The command's connection to the store (its config's database), in autocommit."""
    return database.connect(config_of(args).database.url)


def run_async(command: Callable[[argparse.Namespace], Awaitable[int]]) -> Handler:
    """A command whose body awaits the store, run to completion on an event loop of its own."""

    @functools.wraps(command)
    def handler(args: argparse.Namespace) -> int:
        return asyncio.run(command(args))  # type: ignore[arg-type]

    return handler


def emit(args: argparse.Namespace, data: Any, columns: Sequence[str] | None = None) -> None:
    """JSON for scripts (--json), a table for people."""
    if getattr(args, "json", False):
        print(json.dumps(data, default=json_default))
    elif columns is not None:
        rows = data if isinstance(data, list) else [data]
        print_table(columns, [[cell(row.get(c)) for c in columns] for row in rows])
    else:
        for key, value in data.items():
            print(f"{key}: {cell(value)}")


async def endpoint_ref(conn: Conn, name_or_id: str) -> int:
    """The endpoint an ENDPOINT argument names: its id, its name, or TENANT/NAME, which a name held
    in more than one tenant needs."""
    try:
        endpoint_id = await endpoint_store.endpoint_ref(conn, name_or_id)
    except psycopg.errors.TooManyRows as exc:
        raise CommandFailed(f"ENDPOINT {first_line(exc)}") from None
    if endpoint_id is None:
        raise CommandFailed(f"ENDPOINT {name_or_id!r}: no endpoint with this name or id")
    return endpoint_id


async def tenant_scope(conn: Conn, args: argparse.Namespace) -> None:
    """--tenant: this command sees only that tenant's rows."""
    if getattr(args, "tenant", None) is None:
        return
    try:
        await tenant_store.keep_session_to(conn, args.tenant)
    except psycopg.errors.NoDataFound:
        raise UsageError(f"--tenant: no tenant named {args.tenant!r} (tenants list shows them)") from None


def first_line(exc: psycopg.Error) -> str:
    """The server's primary message only: its DETAIL may quote a whole row, credentials included."""
    message = exc.diag.message_primary or str(exc).strip() or type(exc).__name__
    return message.splitlines()[0]



class Commands:
    """The top level's subcommands, handed to each group's `register()`: a command gets its own
    --config, its handler and a description equal to its help."""

    def __init__(self, subparsers: Any) -> None:
        self.subparsers = subparsers

    def command(self, parent: Any, name: str, handler: Handler, help_: str) -> argparse.ArgumentParser:
        """A command under `parent` (a group's subcommands, or None: the top level)."""
        parent = self.subparsers if parent is None else parent
        sub: argparse.ArgumentParser = parent.add_parser(name, help=help_, description=help_)
        sub.add_argument("--config", metavar="FILE", default=argparse.SUPPRESS, help=CONFIG_HELP)
        sub.set_defaults(handler=handler)
        return sub

    def group(self, name: str, help_: str, description: str) -> Any:
        """A command with subcommands; given alone, it prints its help rather than falling through
        to the top level's default (which runs the worker)."""
        parser: argparse.ArgumentParser = self.subparsers.add_parser(
            name, help=help_, description=description)

        def print_help(_args: argparse.Namespace) -> int:
            parser.print_help()
            return EXIT_USAGE

        parser.set_defaults(handler=print_help)
        return parser.add_subparsers(title="commands", metavar="COMMAND")
