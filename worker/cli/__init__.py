"""The `webhook-worker` command: one module per command group, each registering its own commands
beside their handlers; this module assembles the parser and maps errors to the exit status."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import psycopg

from worker import __version__
from worker.cli import config, deliveries, endpoints, event_types, keys, process, tenants, tokens, triggers
from worker.cli.base import (
    CONFIG_HELP,
    EXIT_FAILURE,
    EXIT_USAGE,
    CommandFailed,
    Commands,
    UsageError,
    first_line,
)
from worker.errors import ConfigError

__all__ = ["EXIT_FAILURE", "EXIT_USAGE", "CommandFailed", "UsageError", "build_parser", "main"]

# The order of `webhook-worker --help`.
GROUPS = (process, endpoints, deliveries, event_types, triggers, config, keys, tokens, tenants)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="webhook-worker",
        description="Deliver webhooks queued in PostgreSQL. Without a command, runs the worker.",
    )
    parser.add_argument("--version", action="version", version=f"webhook-worker {__version__}")
    parser.add_argument("--config", metavar="FILE", help=CONFIG_HELP)
    parser.set_defaults(handler=process.cmd_run)
    cli = Commands(parser.add_subparsers(title="commands", metavar="COMMAND"))
    for group in GROUPS:
        group.register(cli)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.handler(args))
    except ConfigError as exc:
        print(f"webhook-worker: config error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except UsageError as exc:
        print(f"webhook-worker: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except CommandFailed as exc:
        print(f"webhook-worker: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    except psycopg.OperationalError as exc:
        reason = (str(exc).strip().splitlines() or ["connection failed"])[0]
        print(f"webhook-worker: database unreachable: {reason}", file=sys.stderr)
        return EXIT_FAILURE
    except psycopg.errors.DataError as exc:  # SQLSTATE class 22: a value given was unusable
        print(f"webhook-worker: invalid value: {first_line(exc)}", file=sys.stderr)
        return EXIT_USAGE
    except psycopg.Error as exc:
        print(f"webhook-worker: the database refused: {first_line(exc)}", file=sys.stderr)
        return EXIT_FAILURE
    except KeyboardInterrupt:
        return 130



if __name__ == "__main__":
    sys.exit(main())
