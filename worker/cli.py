"""The `webhook-worker` command: run the worker, migrate the schema, manage endpoints, run the demo."""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import urlsplit

import psycopg

from worker import __version__, schema, signing
from worker.config import Config, ConfigError, load_config
from worker.delivery import RESERVED_HEADERS, display_url
from worker.observability import configure_logging
from worker.policy import RetrySchedule
from worker.queue import (
    EndpointSpec,
    find_endpoint,
    list_endpoints,
    register_endpoint,
    set_circuit,
    set_endpoint_active,
)

EXIT_USAGE = 2
EXIT_FAILURE = 1


class UsageError(Exception):
    """A command-line value that cannot be used; the message names the option."""


def _config(args: argparse.Namespace) -> Config:
    return load_config(getattr(args, "config", None))


def cmd_run(args: argparse.Namespace) -> int:
    # Until the event loop installs its own handlers, SIGTERM means "nothing claimed yet: exit 0".
    signal.signal(signal.SIGTERM, lambda _signum, _frame: sys.exit(0))
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


def _check_endpoint_options(args: argparse.Namespace) -> None:
    """Refuse bad values here, before SQL sees them: a constraint violation would make the server
    log the whole row, URL and secret included."""
    if not args.name.strip():
        raise UsageError("--name: must not be empty")
    if args.max_attempts is not None and not 1 <= args.max_attempts <= 100:
        raise UsageError("--max-attempts: expected 1 to 100")
    if args.timeout_seconds is not None and not 0.1 <= args.timeout_seconds <= 300:
        raise UsageError("--timeout-seconds: expected 0.1 to 300")
    if args.rate_limit is not None and not args.rate_limit > 0:
        raise UsageError("--rate-limit: expected a number of requests per second above 0")
    if args.burst is not None and args.burst < 1:
        raise UsageError("--burst: expected at least 1")
    if args.max_in_flight is not None and args.max_in_flight < 1:
        raise UsageError("--max-in-flight: expected at least 1")
    for event_type in args.event_type or []:
        if not event_type.strip():
            raise UsageError("--event-type: must not be empty")


def cmd_endpoints_add(args: argparse.Namespace) -> int:
    config = _config(args)
    _check_url(args.url)
    _check_endpoint_options(args)
    secret = args.secret or signing.generate_secret()
    try:
        signing.sign(secret, "check", 0, b"")
    except ValueError as exc:
        raise UsageError(f"--secret: {exc}") from None
    schedule = None
    if args.retry_delays:
        try:
            schedule = {"delays": [float(d) for d in args.retry_delays.split(",")]}
            RetrySchedule.from_json(schedule, 0.0)
        except ValueError:
            raise UsageError("--retry-delays: expected 1 to 100 delays of 0 to 604800 seconds, "
                             "separated by commas") from None
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
        rate_limit_per_second=args.rate_limit,
        rate_limit_burst=args.burst,
        max_in_flight=args.max_in_flight,
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


def _endpoint_id(conn: psycopg.Connection, name_or_id: str) -> int:
    endpoint_id = find_endpoint(conn, name_or_id)
    if endpoint_id is None:
        raise UsageError(f"ENDPOINT {name_or_id!r}: no endpoint with this name or id")
    return endpoint_id


def cmd_endpoints_enable(args: argparse.Namespace) -> int:
    return _set_active(args, active=True)


def cmd_endpoints_disable(args: argparse.Namespace) -> int:
    return _set_active(args, active=False)


def _set_active(args: argparse.Namespace, active: bool) -> int:
    config = _config(args)
    with psycopg.connect(config.database.url, autocommit=True) as conn:
        endpoint_id = _endpoint_id(conn, args.endpoint)
        change = set_endpoint_active(conn, endpoint_id, active, getattr(args, "reason", ""))
    state = "enabled" if active else "disabled"
    print(f"endpoint {endpoint_id} {state}" if change else f"endpoint {endpoint_id} was already {state}")
    return 0


def cmd_endpoints_circuit(args: argparse.Namespace) -> int:
    config = _config(args)
    if args.action != "open" and args.until:
        raise UsageError("--until: only with 'open'")
    with psycopg.connect(config.database.url, autocommit=True) as conn:
        endpoint_id = _endpoint_id(conn, args.endpoint)
        change = set_circuit(conn, endpoint_id, args.action, args.until)
    print(f"endpoint {endpoint_id}: {change}")
    return 0


def cmd_endpoints_list(args: argparse.Namespace) -> int:
    config = _config(args)
    with psycopg.connect(config.database.url, autocommit=True) as conn:
        rows = list_endpoints(conn)
    if args.json:
        print(json.dumps(rows, default=str))
        return 0
    columns = ["id", "name", "url_display", "active", "event_types", "health_status", "circuit_state",
               "successes", "failures"]
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
    add.add_argument("--rate-limit", type=float, metavar="PER_SECOND",
                     help="at most this many requests per second, fleet-wide")
    add.add_argument("--burst", type=int, help="requests allowed at once above the rate")
    add.add_argument("--max-in-flight", type=int, help="at most this many requests open at once, fleet-wide")
    add.add_argument("--json", action="store_true", help="print JSON")
    enable = command(endpoint_commands, "enable", cmd_endpoints_enable,
                     "enable an endpoint (and reset its circuit); its waiting rows are sent")
    enable.add_argument("endpoint", metavar="ENDPOINT", help="name or id")
    disable = command(endpoint_commands, "disable", cmd_endpoints_disable,
                      "disable an endpoint: no new deliveries, queued rows wait")
    disable.add_argument("endpoint", metavar="ENDPOINT", help="name or id")
    disable.add_argument("--reason", default="disabled by an operator", help="recorded with the change")
    circuit = command(endpoint_commands, "circuit", cmd_endpoints_circuit,
                      "control the circuit breaker: reset, open (until a time) or close")
    circuit.add_argument("endpoint", metavar="ENDPOINT", help="name or id")
    circuit.add_argument("action", choices=["reset", "open", "close"],
                         help="reset: closed and counters cleared; open: nothing sent (until --until, "
                              "or until reset); close: never opens by itself until reset")
    circuit.add_argument("--until", metavar="TIMESTAMP", help="with open: when to start probing again")
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
