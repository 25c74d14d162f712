"""The `webhook-worker` command: run the worker, migrate the schema, manage endpoints, run the demo."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import urlsplit

import psycopg

from worker import __version__, schema, signing
from worker.config import Config, ConfigError, load_config
from worker.delivery import RESERVED_HEADERS, display_url
from worker.observability import configure_logging
from worker.queue import EndpointSpec, list_endpoints, register_endpoint

EXIT_USAGE = 2
EXIT_FAILURE = 1


class UsageError(Exception):
    """A command-line value that cannot be used; the message names the option."""


def _config(args: argparse.Namespace) -> Config:
    return load_config(getattr(args, "config", None))


def cmd_run(args: argparse.Namespace) -> int:
    from worker.daemon import serve

    config = _config(args)
    configure_logging(config.logging.level, config.logging.format)
    asyncio.run(serve(config))
    return 0


def cmd_migrate(args: argparse.Namespace) -> int:
    config = _config(args)
    applied = schema.migrate(config.database.url)
    for migration in applied:
        print(f"applied {migration.version:03d}_{migration.name}")
    print(f"schema at version {schema.latest_version()} ({len(applied)} applied)")
    return 0


def _parse_headers(values: Sequence[str]) -> dict[str, str]:
    headers = {}
    for value in values:
        name, sep, content = value.partition(":")
        if not sep or not name.strip():
            raise UsageError(f"--header {value!r}: expected 'Name: value'")
        if name.strip().lower() in RESERVED_HEADERS:
            raise UsageError(f"--header {name.strip()}: set by webhook-worker, cannot be overridden")
        headers[name.strip()] = content.strip()
    return headers


def _check_url(url: str) -> None:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError("--url: expected an http:// or https:// URL with a host")


def cmd_endpoints_add(args: argparse.Namespace) -> int:
    config = _config(args)
    _check_url(args.url)
    secret = args.secret or signing.generate_secret()
    try:
        signing.sign(secret, "check", 0, b"")
    except ValueError as exc:
        raise UsageError(f"--secret: {exc}") from None
    schedule = None
    if args.retry_delays:
        try:
            schedule = {"delays": [float(d) for d in args.retry_delays.split(",")]}
        except ValueError:
            raise UsageError("--retry-delays: expected seconds separated by commas") from None
    spec = EndpointSpec(
        name=args.name,
        url=args.url,
        url_display=display_url(args.url),
        signing_secrets=(secret,),
        event_types=tuple(args.event_type or ["*"]),
        headers=_parse_headers(args.header or []),
        max_attempts=args.max_attempts,
        timeout_ms=int(args.timeout_seconds * 1000) if args.timeout_seconds else None,
        retry_schedule=schedule,
    )
    with psycopg.connect(config.database.url, autocommit=True) as conn:
        try:
            endpoint_id = register_endpoint(conn, spec)
        except psycopg.errors.UniqueViolation:
            raise UsageError(f"--name {args.name!r}: an endpoint with this name exists") from None
        except psycopg.errors.CheckViolation as exc:
            raise UsageError(f"invalid endpoint: {exc.diag.constraint_name}") from None
    if args.json:
        print(json.dumps({"id": endpoint_id, "name": spec.name, "signing_secret": secret}))
    else:
        print(f"endpoint {endpoint_id} created: {spec.name} → {spec.url_display}")
        print(f"signing secret (shown once, give it to the receiver): {secret}")
    return 0


def cmd_endpoints_list(args: argparse.Namespace) -> int:
    config = _config(args)
    with psycopg.connect(config.database.url, autocommit=True) as conn:
        rows = list_endpoints(conn)
    if args.json:
        print(json.dumps(rows, default=str))
        return 0
    columns = ["id", "name", "url_display", "active", "event_types", "health_status", "successes",
               "failures"]
    print_table(columns, [[_cell(row[c]) for c in columns] for row in rows])
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from worker.demo import run_demo

    alerts: int = args.alerts
    return run_demo(alerts=alerts)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return str(value)


def print_table(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    widths = [max([len(c)] + [len(r[i]) for r in rows]) for i, c in enumerate(columns)]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip())
    for row in rows:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())


def build_parser() -> argparse.ArgumentParser:
    config_help = "YAML config file (DATABASE_URL and WEBHOOK_WORKER_* variables override it)"
    parser = argparse.ArgumentParser(
        prog="webhook-worker",
        description="Deliver webhooks queued in PostgreSQL. Without a command, runs the worker.",
    )
    parser.add_argument("--version", action="version", version=f"webhook-worker {__version__}")
    parser.add_argument("--config", metavar="FILE", help=config_help)
    parser.set_defaults(handler=cmd_run)
    commands = parser.add_subparsers(title="commands", metavar="COMMAND")

    def command(
        parent: Any, name: str, handler: Callable[[argparse.Namespace], int], help_: str
    ) -> argparse.ArgumentParser:
        sub: argparse.ArgumentParser = parent.add_parser(name, help=help_, description=help_)
        sub.add_argument("--config", metavar="FILE", default=argparse.SUPPRESS, help=config_help)
        sub.set_defaults(handler=handler)
        return sub

    command(commands, "run", cmd_run, "run the worker until SIGTERM or SIGINT (the default)")
    command(commands, "migrate", cmd_migrate, "apply the schema migrations (safe to run concurrently)")

    endpoints = commands.add_parser("endpoints", help="register and list endpoints",
                                    description="Register and list endpoints.")
    def endpoints_help(_args: argparse.Namespace) -> int:
        endpoints.print_help()
        return EXIT_USAGE

    endpoints.set_defaults(handler=endpoints_help)
    endpoint_commands = endpoints.add_subparsers(title="commands", metavar="COMMAND")
    add = command(endpoint_commands, "add", cmd_endpoints_add, "register an endpoint; prints its id")
    add.add_argument("--name", required=True, help="unique name")
    add.add_argument("--url", required=True, help="where to POST (kept out of logs)")
    add.add_argument("--event-type", action="append", metavar="TYPE",
                     help="subscribe to this event type (repeatable; default: all)")
    add.add_argument("--header", action="append", metavar="'NAME: VALUE'",
                     help="custom request header (repeatable)")
    add.add_argument("--secret", help="signing secret whsec_<base64> (default: generated)")
    add.add_argument("--max-attempts", type=int, help="override the global max attempts")
    add.add_argument("--timeout-seconds", type=float, help="override the request timeout")
    add.add_argument("--retry-delays", metavar="S,S,...", help="override the retry delays (seconds)")
    add.add_argument("--json", action="store_true", help="print JSON")
    listing = command(endpoint_commands, "list", cmd_endpoints_list, "list endpoints and health")
    listing.add_argument("--json", action="store_true", help="print JSON")

    demo = commands.add_parser(
        "demo", help="deliver sample alerts end to end on a local PostgreSQL and receiver",
        description="Start a throwaway PostgreSQL (unless DATABASE_URL is set), migrate, register a "
        "receiver on 127.0.0.1, enqueue sample alerts, deliver them and print the audit rows.",
    )
    demo.add_argument("--alerts", type=int, default=5, help="how many sample alerts (default 5)")
    demo.set_defaults(handler=cmd_demo)
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
    except psycopg.OperationalError as exc:
        first_line = (str(exc).strip().splitlines() or ["connection failed"])[0]
        print(f"webhook-worker: database unreachable: {first_line}", file=sys.stderr)
        return EXIT_FAILURE
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
